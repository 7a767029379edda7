"""README and docs/, checked against what they describe: the time table adds up, its reading column is what
docs/workshop/count_words.py measures, and README agrees with it (the cheat sheet has
tests/test_cheatsheet.py); troubleshooting rows show the real error text, and the mistaken-lab demo shows
none of lab 00's answers and fails its check as the guide says.

Cheap on purpose: one launch (the broken copy's check, at one world size), two small subprocesses (pip,
a bare Python); everything else runs inside this process.
"""
import importlib.util
import io
import json
import re
import socket
import subprocess
import sys

import pytest
import torch.distributed as dist

from ddpcourse.paths import COURSE_ROOT
from helpers import section

DOCS = COURSE_ROOT / "docs"
README = (COURSE_ROOT / "README.md").read_text()
GUIDE = (DOCS / "instructors.md").read_text()
TROUBLESHOOTING = (DOCS / "troubleshooting.md").read_text()
MISTAKEN_LAB = DOCS / "workshop" / "00_mistaken_mean.py"


def table_rows(markdown):
    """The cells of each row of the markdown tables in ``markdown`` (header and separator rows left out)."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in markdown.splitlines() if line.startswith("|")]
    return [row for row in rows if not set("".join(row)) <= set("-: ")][1:]


def minutes(text):
    return int(re.search(r"(\d+) min", text).group(1))


# ----------------------------------------------------------------------------- the time table
def count_words():
    """docs/workshop/count_words.py, the script that measures the reading column, as a module."""
    spec = importlib.util.spec_from_file_location("count_words", DOCS / "workshop" / "count_words.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_table(guide=None):
    """{module: row} from the guide's table, each row a dict of its numbers: demos, votes, words (read in the
    room) and their reading minutes, run_s (README's cell run time) and its allowance minutes, lab, block,
    claims words and minutes (0, 0 for a notebook without a claims section)."""
    table = {}
    for row in table_rows(section(guide or GUIDE, "## The time table").split("### ")[0]):
        module, demos, votes, reading, running, lab, block, after = row
        (n_demos, demo_min), (n_votes, vote_min) = (
            tuple(map(int, re.match(r"(\d+) \((\d+) min\)", cell).groups())) for cell in (demos, votes))
        assert demo_min == 4 * n_demos and vote_min == 2 * n_votes, row  # 4 min a demo, 2 min a vote
        words, read_min = map(int, re.fullmatch(r"(\d+) words \((\d+) min\)", reading).groups())
        run_s, run_min = map(int, re.fullmatch(r"(\d+) s \((\d+) min\)", running).groups())
        claims = re.search(r"(\d+) words \((\d+) min\)", after)
        assert claims or after == "no claims section", row
        table[module[:2]] = dict(demos=n_demos, votes=n_votes, demo_min=demo_min, vote_min=vote_min, words=words,
                                 read_min=read_min, run_s=run_s, run_min=run_min, lab=minutes(lab),
                                 block=minutes(block), claims=tuple(map(int, claims.groups())) if claims else (0, 0))
    return table


def check_blocks(guide, readme):
    """The sums of the time table, from its own numbers: reading minutes from its words, the allowance from
    README's cell run time, each block from its parts, README's time per module, the total."""
    table = time_table(guide)
    assert table, "the time table has no rows"
    words_per_minute, ceil = count_words().WORDS_PER_MINUTE, lambda n, d: -(-n // d)
    for module, row in table.items():
        assert row["read_min"] == ceil(row["words"], words_per_minute), f"module {module}: reading minutes"
        assert row["claims"][1] == ceil(row["claims"][0], words_per_minute), f"module {module}: claims minutes"
        readme_row = re.search(r"^\| \[notebooks/%s_.*\| (\d+) min \(cells run in about (\d+) s\)" % module, readme, re.M)
        assert readme_row, f"README's course map has no time for {module}"
        assert row["run_s"] == int(readme_row.group(2)), f"module {module}: cell run time is not README's"
        assert row["run_min"] == ceil(row["run_s"], 60) + 3, f"module {module}: allowance is not run time + 3 min"
        parts = row["demo_min"] + row["vote_min"] + row["read_min"] + row["run_min"] + row["lab"]
        assert parts == row["block"], f"module {module}: its parts add up to {parts} min, its block says {row['block']}"
        assert int(readme_row.group(1)) == row["block"], f"README's course map disagrees on {module}"
    total = sum(row["block"] for row in table.values())
    assert f"**{total} min ({total // 60} h {total % 60} min)**" in guide, f"the total is {total} min"


def test_time_table_blocks_add_up_and_readme_shows_the_same_blocks():
    notebooks = sorted(path.name[:2] for path in (COURSE_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    # every notebook is planned, and every planned module has its notebook
    assert set(notebooks) == set(time_table()), f"notebooks {sorted(notebooks)}, time table {sorted(time_table())}"
    check_blocks(GUIDE, README)
    # each sum can fail: a planted wrong number in each kind of cell, and in README
    row = next(line for line in GUIDE.splitlines() if line.startswith("| 00 "))
    cells = row.split(" | ")
    words = re.search(r"(\d+) words", cells[3]).group(1)
    plants = [
        (row, row.replace(f"{words} words", f"{int(words) + 400} words")),            # reading minutes
        (row, row.replace(cells[4], cells[4].replace(" s (", "1 s ("))),             # run time vs README
        (row, row.replace(cells[6], str(minutes(cells[6]) + 1) + " min")),           # block vs its parts
        ("**" + re.search(r"\*\*(\d+ min \(\d+ h \d+ min\))\*\*", GUIDE).group(1), "**1 min (0 h 1 min)"),  # total
    ]
    for old, new in plants:
        with pytest.raises(AssertionError):
            check_blocks(GUIDE.replace(old, new), README)
    readme_row = re.search(r"^\| \[notebooks/00_.*\| (\d+ min) \(cells run", README, re.M)
    with pytest.raises(AssertionError):
        check_blocks(GUIDE, README.replace(readme_row.group(0), readme_row.group(0).replace(
            readme_row.group(1), f"{int(readme_row.group(1).split()[0]) + 1} min")))


def check_words(guide, measured):
    """The table's words (in the room, and in the claims sections) are the script's, within 10%: the
    notebooks change under the table; rerun docs/workshop/count_words.py and update it when this fails."""
    table = time_table(guide)
    assert set(table) == set(measured), f"time table {sorted(table)}, script {sorted(measured)}"
    for module, row in table.items():
        room, claims = measured[module]["all"] - measured[module]["claims"], measured[module]["claims"]
        assert abs(row["words"] - room) <= 0.1 * room, \
            f"module {module}: the table says {row['words']} words in the room, the script counts {room}"
        assert abs(row["claims"][0] - claims) <= 0.1 * claims, \
            f"module {module}: the table says {row['claims'][0]} claims words, the script counts {claims}"


def test_time_table_words_are_the_scripts_count(tmp_path):
    script = count_words()
    measured = script.course_words()
    check_words(GUIDE, measured)
    without = {m for m, row in time_table().items() if row["claims"] == (0, 0)}  # "no claims section" rows
    assert {m for m in measured if not measured[m]["claims"]} == without, "a notebook lost or gained its claims section"
    row = next(line for line in GUIDE.splitlines() if line.startswith("| 01 "))
    words = re.search(r"(\d+) words \(\d+ min\) \| \d+ s", row).group(1)
    with pytest.raises(AssertionError):  # a planted count a quarter off fails
        check_words(GUIDE.replace(row, row.replace(f"{words} words", f"{int(int(words) * 1.25)} words")), measured)
    # the counting rules, on a notebook made here: prose, table cells and a Predict's words count; a fenced
    # code block, a code cell's code and comments, and outputs do not; a claims heading opens a claims section
    cells = [{"cell_type": "markdown", "source": ["# One two\n", "three [four](http://x/y z) `five`\n",
                                                  "```\nnot counted at all\n```\n", "| six | seven |\n|---|---|\n"]},
             {"cell_type": "code", "source": "x = 1  # not counted\npredict('q', 'eight nine?', ['ten', 'eleven'])",
              "outputs": [{"output_type": "stream", "text": "not counted"}]},
             {"cell_type": "markdown", "source": "## 2. The source's claims, tested\n\none two three"},
             {"cell_type": "markdown", "source": "## Summary\n\none"}]
    sample = tmp_path / "99_sample.ipynb"
    sample.write_text(json.dumps({"cells": cells}))
    counted = script.notebook_words(sample)
    assert (counted["all"], counted["claims"]) == (7 + 4 + 8 + 2, 8), counted


def check_plan(guide, plan):
    """A plan's clock adds up to its length; every 65 minutes a break; a slack slot; each module done in the
    room takes its block (whole, or its notebook then its lab); each other module is demoed or homework."""
    text = section(guide, plan)
    hours, mins = map(int, re.search(r"\((\d+) h (\d+) min", text).groups())
    rows = table_rows(text)
    clock = 0
    for when, what, length in rows:
        start, end = [int(h) * 60 + int(m) for h, m in re.findall(r"(\d+):(\d\d)", when)]
        assert start == clock and end - start == int(length), f"{plan}: {when} is not {length} min after {clock}"
        clock = end
    assert clock == hours * 60 + mins, f"{plan}: the rows end at {clock} min"
    assert any("slack" in what for _, what, _ in rows), f"{plan}: no slack slot"
    table = time_table(guide)
    done, since_break = {}, 0
    for _, what, length in rows:
        module = re.fullmatch(r"module (\d\d)(?: \((notebook|lab)\))?", what)
        if module:
            done.setdefault(module.group(1), {})[module.group(2) or "whole"] = int(length)
        since_break = 0 if what in ("break", "lunch", "stretch") else since_break + int(length)
        assert since_break <= 65, f"{plan}: {since_break} min without a break"  # the issue: about hourly
    assert done, f"{plan}: no module is done in the room"
    for module, parts in done.items():
        row = table[module]
        assert parts in ({"whole": row["block"]}, {"notebook": row["block"] - row["lab"], "lab": row["lab"]}), \
            f"{plan}: module {module} is planned as {parts}, its block is {row['block']} min (lab {row['lab']})"
    demoed = set(re.findall(r"\((\d\d), section", text))
    homework = {f"{n:02d}" for what in (r[1] for r in rows if "homework" in r[1])
                for first, last in re.findall(r"(\d\d) to (\d\d)", what) for n in range(int(first), int(last) + 1)}
    missing = set(table) - set(done) - demoed - homework
    assert not missing, f"{plan}: modules {sorted(missing)} are neither done, demoed nor homework"


@pytest.mark.parametrize("plan", ["### Half day", "### Full day"])
def test_each_plan_adds_up_to_its_length_with_breaks_and_slack(plan):
    check_plan(GUIDE, plan)
    rows = [line for line in section(GUIDE, plan).splitlines() if re.match(r"\| \d+:\d\d - ", line)]
    module_row = next(line for line in rows if "| module 00 |" in line)
    slack_row = next(line for line in rows if "slack" in line)
    plants = [(module_row, module_row.replace("| module 00 |", "| module 00 (notebook) |")),  # not its block
              (slack_row, slack_row.replace("**slack**", "questions")),                    # no slack
              (slack_row, slack_row.rsplit("|", 2)[0] + "| 1 |"),                          # clock does not add up
              (rows[1], rows[1].replace("| stretch |", "| warm-up |"))]                    # no break for long
    for old, new in plants:
        with pytest.raises(AssertionError):
            check_plan(GUIDE.replace(old, new), plan)


def test_the_guide_sends_the_claims_sections_home():
    table, measured = time_table(), count_words().course_words()
    for module, row in table.items():  # a claims section in the table exactly where the script finds one
        assert (row["claims"][0] > 0) == (measured[module]["claims"] > 0), f"module {module}: claims column"
    assert any(row["claims"][0] for row in table.values())
    guide = " ".join(section(GUIDE, "## The time table").split())
    assert "claims sections stay homework in every plan" in guide
    assert "every claims section" in section(GUIDE, "### Half day")


def test_demo_counts_and_predict_budgets_match_the_notebooks():
    demos = table_rows(section(GUIDE, "## What to demo live"))
    for module, row in time_table().items():
        assert sum(demo[0] == module for demo in demos) == row["demos"], f"module {module}: demo table vs time table"
        notebook = next((COURSE_ROOT / "notebooks").glob(f"{module}_*.ipynb"), None)
        assert notebook is not None, f"module {module} is in the time table but notebooks/ has no {module}_*.ipynb"
        cells = json.loads(notebook.read_text())["cells"]
        asked = sum(len(re.findall(r"^\s*predict\(", "".join(c["source"]), re.M)) for c in cells
                    if c["cell_type"] == "code")
        assert 0 < asked <= row["votes"], f"notebook {module} has {asked} Predicts; the time table budgets {row['votes']}"


# ----------------------------------------------------------------------------- troubleshooting rows
def test_a_script_started_without_a_launcher_needs_rank(monkeypatch):
    if dist.is_initialized():
        pytest.skip("a process group is already open in this process")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError) as error:
        dist.init_process_group("gloo")
    assert str(error.value) in TROUBLESHOOTING
    assert str(error.value) == ("Error initializing torch.distributed using env:// rendezvous: environment "
                                "variable RANK expected, but not set")


def test_plain_torchrun_advertises_getfqdn_unless_local_addr(monkeypatch):
    """torchrun's first node tells every worker to meet at socket.getfqdn(); a VPN or macOS can make that a
    name nobody resolves. --local-addr replaces it (torch's own code, no launch)."""
    from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo

    from ddpcourse.launch.launcher import build_command

    monkeypatch.setattr(socket, "getfqdn", lambda *args: "laptop.vpn.example.invalid")
    assert RendezvousStoreInfo.build(0, dist.HashStore(), local_addr=None).master_addr == "laptop.vpn.example.invalid"
    assert RendezvousStoreInfo.build(0, dist.HashStore(), local_addr="127.0.0.1").master_addr == "127.0.0.1"
    command = build_command(2, ["lab.py"])
    assert command[command.index("--local-addr") + 1] == "127.0.0.1"  # the course's launcher always sets it
    assert "`torchrun --standalone --local-addr 127.0.0.1 ...`" in TROUBLESHOOTING
    assert "`GLOO_SOCKET_IFNAME=lo0` on macOS" in TROUBLESHOOTING


def test_pip_behind_a_proxy_it_cannot_reach(tmp_path):
    from ddpcourse.learner.doctor import pins

    psutil = f"psutil=={pins()['psutil']}"  # a package the course pins (requirements.txt)
    with socket.socket() as closed:  # a loopback port where nothing listens: a proxy that is not there
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--isolated", "download", "--no-deps", "--retries", "1", "--timeout", "2",
         "--proxy", f"http://127.0.0.1:{port}", "-d", str(tmp_path), psutil],
        capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "after connection broken by 'ProxyError('Cannot connect to proxy.'" in result.stderr
    assert "[Errno 111] Connection refused" in result.stderr
    assert f"No matching distribution found for {psutil}" in result.stderr
    assert "after connection broken by 'ProxyError('Cannot connect to proxy.', NewConnectionError(" in TROUBLESHOOTING


def test_a_kernel_without_the_course_environment(tmp_path):
    """The wrong kernel: an interpreter that does not see the course's packages (here: site-packages off)."""
    result = subprocess.run([sys.executable, "-S", "-c", "import ddpcourse"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    last = result.stderr.strip().splitlines()[-1]
    assert last == "ModuleNotFoundError: No module named 'ddpcourse'"
    assert f"`{last}`" in TROUBLESHOOTING


def test_the_widget_extension_comes_with_the_pinned_install():
    from importlib.metadata import files, version

    from ddpcourse.learner.doctor import pins

    pinned = pins()["ipywidgets"]  # requirements.txt
    assert version("ipywidgets") == pinned
    assert f"install `ipywidgets=={pinned}`" in TROUBLESHOOTING  # the row names the pinned version
    shipped = [str(path) for path in files("jupyterlab_widgets")]
    assert any(path.endswith("labextensions/@jupyter-widgets/jupyterlab-manager/package.json") for path in shipped)
    assert "`@jupyter-widgets/jupyterlab-manager`" in TROUBLESHOOTING


def test_macos_equivalents_of_the_linux_commands():
    for linux, macos in (("ss -ltnp", "lsof -nP -iTCP:29500 -sTCP:LISTEN"), ("getent hosts", "dscacheutil -q host")):
        row = next(line for line in TROUBLESHOOTING.splitlines() if linux in line)
        assert macos in row


# ----------------------------------------------------------------------------- the mistaken-lab demo
def answer_lines(path):
    """The code lines of a lab solution's answers: between ### BEGIN SOLUTION and ### END SOLUTION, hints out."""
    lines, inside = [], False
    for line in path.read_text().splitlines():
        marker = line.strip()
        inside = (inside or marker == "### BEGIN SOLUTION") and marker != "### END SOLUTION"
        if inside and marker and not marker.startswith("###"):
            lines.append(marker)
    return lines


def answers_shown(text, answers):
    code = {line.split("#")[0].strip() for line in text.splitlines()} - {""}
    return [answer for answer in answers if answer.split("#")[0].strip() in code]


def test_the_mistaken_lab_gives_no_answer_of_lab_00_away():
    answers = answer_lines(COURSE_ROOT / "solutions" / "00_first_collectives.py")
    assert len(answers) >= 9, answers  # three TODOs, their answers found
    demo = MISTAKEN_LAB.read_text()
    assert not answers_shown(demo, answers), "the demo shows lines of lab 00's answers"
    assert "dist." not in demo and "all_reduce" not in demo, "the demo shows a collective"
    assert "solutions" in demo and ".global_mean = " in demo  # it runs the solution with only global_mean replaced
    for answer in answers:  # the test sees a planted answer line, however it is indented
        assert answers_shown(demo + "\n        " + answer + "  # planted\n", answers) == [answer]


def test_the_mistaken_lab_fails_its_check_as_the_guide_says():
    from ddpcourse.checks import check_lab

    report = check_lab(str(MISTAKEN_LAB), nproc=2, quiet=True)
    failed = [check for check in report.results if not check.passed]
    assert not report.passed and [check.name for check in failed] == ["nproc=2: mean_loss = 1.25 on every rank"]
    own = "mean_loss is {}, this rank's own value (expected 1.25): no collective combined it with the other ranks"
    assert f"rank 0: {own.format(1)}" in failed[0].detail and f"rank 1: {own.format(1.5)}" in failed[0].detail
    guide = " ".join(GUIDE.split())
    assert "`FAIL nproc=2: mean_loss = 1.25 on every rank`" in guide.replace("FAIL  ", "FAIL ")
    assert f"`rank 0: {own.format(1)}` (rank 1: 1.5)" in guide


def test_the_room_line_of_a_fresh_copy_reads_as_the_guide_shows(tmp_path):
    from ddpcourse.authoring.makelabs import make_labs
    from ddpcourse.learner.progress import room_line

    examples = re.findall(r"^ddpcourse .*$", section(GUIDE, "### Seeing the room's progress"), re.M)
    make_labs(labs_dir=tmp_path, out=io.StringIO())
    assert room_line(tmp_path) == examples[0]  # every lab, none left out of the example
    for state in {token.split(":")[1] for example in examples for token in example.split()[1:]}:
        assert re.fullmatch(r"new|syntax|edited|missing|pass|todo\d(,\d)*", state), state
        assert f"`{'todoK,K' if state.startswith('todo') else state}`:" in GUIDE  # each state explained



# A learner's reading in the room (issue 32): per notebook, in all, and per markdown cell (table rows aside).
# MAX_COURSE_WORDS: 26,000 held modules 00 to 07; module 08 (debugging, issue 34) adds about 2,300 words in the
# room, raised for it explicitly rather than cut from the others
MAX_ROOM_WORDS, MAX_COURSE_WORDS, MAX_CELL_PROSE = 3500, 28500, 300


def prose_words(markdown, script):
    """The prose words of a markdown cell as count_words.py reads them, without table rows or fenced code."""
    kept, fenced = [], False
    for line in markdown.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
        elif not fenced and not line.strip().startswith("|"):
            kept.append(script.prose(line))
    return script.count("\n".join(kept))


def test_the_reading_in_the_room_has_a_readable_length():
    script = count_words()
    measured = script.course_words()
    room = {module: found["all"] - found["claims"] for module, found in measured.items()}
    assert max(room.values()) <= MAX_ROOM_WORDS, room
    assert sum(room.values()) < MAX_COURSE_WORDS, sum(room.values())
    for path in sorted((COURSE_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "markdown":
                words = prose_words("".join(cell["source"]), script)
                assert words <= MAX_CELL_PROSE, f"{path.name}, cell {index}: {words} words of prose (split it)"
    wall = "\n".join(["word " * 20] * 16 + ["| a table row | is not prose |"] * 40)
    assert prose_words(wall, script) == 320  # the rule bites; table rows aside
