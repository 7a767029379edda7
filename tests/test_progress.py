"""`python -m ddpcourse status` and `reset`: every state of a lab, a learner file that does not import,
and a reset that never loses the learner's work. Only one test launches (2 checks on 2 ranks); the others
prove that a lab with open TODOs, or one that does not compile, is reported without a launch."""
import io
import re
import subprocess
import sys
from datetime import datetime

import pytest

from ddpcourse.__main__ import main
from ddpcourse.authoring.makelabs import make_lab, make_labs
from ddpcourse.paths import COURSE_ROOT, lab_files, resolve_lab, solution_of
from ddpcourse.learner.progress import (CHECK_FAILS, MISSING, NO_COMPILE, NOT_STARTED, PASSES, TODOS_OPEN, UnknownLab,
                                collect_status, format_status, reset, solution_files)
from ddpcourse.learner.hints import reveal_hint
from ddpcourse.todos import open_todos, solution_regions

SOLUTIONS = solution_files()


def fresh_labs(tmp_path):
    """A labs/ folder as make-labs generates it (never the course's own labs/)."""
    labs = tmp_path / "labs"
    make_labs(labs_dir=labs, out=io.StringIO())
    return labs


def generated(number):
    solution = SOLUTIONS[number]
    return make_lab(solution.read_text(), solution.name)


def do_todo(text, k, code="pass"):
    """The learner's edit for TODO k: its raise line replaced by `code` at the same indentation."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.lstrip().startswith((f"raise NotImplementedError('TODO {k}:", f'raise NotImplementedError("TODO {k}:')):
            lines[i] = line[:len(line) - len(line.lstrip())] + code + "\n"
            return "".join(lines)
    raise AssertionError(f"no TODO {k} in the generated lab: update this test")


@pytest.fixture
def no_launch(monkeypatch):
    """The one seam every launch goes through, whichever route calls it: starting a process."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"status started a process it did not need: {args[:1]}")
    monkeypatch.setattr(subprocess, "Popen", refuse)


def test_generated_labs_are_not_started_and_nothing_is_launched(tmp_path, no_launch):
    report = collect_status(fresh_labs(tmp_path), say=print)
    assert [row.number for row in report.rows] == sorted(SOLUTIONS)
    assert {row.state for row in report.rows} == {NOT_STARTED}
    for number, solution in SOLUTIONS.items():
        assert report.row(number).detail == f"{len(solution_regions(solution))} TODOs: start with TODO 1"


def test_open_todos_are_all_listed_not_one_at_a_time(tmp_path, no_launch):
    labs = fresh_labs(tmp_path)
    lab = labs / SOLUTIONS["00"].name
    lab.write_text(do_todo(generated("00"), 1, "return value.clone()"))  # TODO 1 done (wrongly): 2 and 3 open
    row = collect_status(labs, say=print).row("00")
    assert row.state == TODOS_OPEN and row.todos == [2, 3]
    hints = solution_regions(SOLUTIONS["00"])[2].hints
    assert row.detail == f"open: TODO 2, 3; next: TODO 2: {hints[1]}"
    reveal_hint(lab)  # `python -m ddpcourse hint 00`: status now shows TODO 2's second level
    assert collect_status(labs, say=print).row("00").detail == f"open: TODO 2, 3; next: TODO 2: {hints[2]}"


def test_a_file_that_does_not_compile_is_reported_with_its_line_and_open_todos(tmp_path, no_launch):
    labs = fresh_labs(tmp_path)
    lab = labs / SOLUTIONS["02"].name
    text = do_todo(generated("02"), 1, "model = build_model(seed=  # the learner stopped typing here")
    lab.write_text(text)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "stopped typing" in l)
    row = collect_status(labs, say=print).row("02")
    assert row.state == NO_COMPILE
    assert row.detail.startswith(f"line {line}: ") or row.detail.startswith(f"line {line + 1}: "), row.detail
    assert row.detail.endswith("TODOs still open: " + ", ".join(str(k) for k, _ in open_todos(text)))


def test_a_missing_lab_says_how_to_get_it_back(tmp_path, no_launch):
    labs = fresh_labs(tmp_path)
    (labs / SOLUTIONS["05"].name).unlink()
    row = collect_status(labs, say=print).row("05")
    assert row.state == MISSING and "python -m ddpcourse reset 05" in row.detail


def test_open_todos_reads_both_quote_styles_and_ignores_comments():
    text = ("    raise NotImplementedError('TODO 1: a')\n"
            '    raise NotImplementedError("TODO 12: it\'s b")\n'
            """    raise NotImplementedError('TODO 13: it\\'s "c"')\n"""
            "    # raise NotImplementedError('TODO 3: commented out')\n"
            "    # TODO 4: only the comment is left\n")
    assert open_todos(text) == [(1, "a"), (12, "it's b"), (13, 'it\'s "c"')]


def test_hint_cli_reveals_one_level_at_a_time_and_remembers_it(tmp_path, capsys):
    labs = fresh_labs(tmp_path)
    lab = labs / SOLUTIONS["05"].name
    region = solution_regions(SOLUTIONS["05"])[3]
    outputs = []
    for _ in range(3):
        assert main(["hint", str(lab), "3"]) == 0
        outputs.append(capsys.readouterr().out)
    assert "hints 1 to 2 of 3 (hint 1 is the TODO's comment)" in outputs[0] and region.hints[2] in outputs[0] and "solutions/" not in outputs[0]
    where = f"solutions/{SOLUTIONS['05'].name} in save_checkpoint(), lines {region.code_lines[0]}-{region.code_lines[-1]}"
    assert "hints 1 to 3 of 3" in outputs[1] and where in outputs[1] and "last level" in outputs[1]
    assert outputs[2] == outputs[1]  # level 3 is the last
    assert main(["hint", str(lab)]) == 0 and "TODO 1 of" in capsys.readouterr().out  # default: the first open TODO
    assert main(["hint", str(lab), "9"]) == 2 and "not 9" in capsys.readouterr().err


def test_status_cli_checks_only_finished_labs_once_on_two_ranks(tmp_path):
    """The one launching test: a passing lab, a lab whose module does not import, and the other states,
    through the command line a learner types."""
    labs = fresh_labs(tmp_path)
    (labs / SOLUTIONS["00"].name).write_text(SOLUTIONS["00"].read_text())  # every TODO done, correctly
    broken = SOLUTIONS["03"].read_text()
    assert "import torch\n" in broken
    (labs / SOLUTIONS["03"].name).write_text(broken.replace("import torch\n", "import torch_typo\n", 1))
    (labs / SOLUTIONS["01"].name).write_text(do_todo(generated("01"), 1))
    cli = subprocess.run([sys.executable, "-m", "ddpcourse", "status", "--labs", str(labs)],
                         capture_output=True, text=True, cwd=COURSE_ROOT, timeout=200)
    out = cli.stdout
    assert cli.returncode == 0, out + cli.stderr
    assert out.count("... checking ") == 2 and "on 2 ranks" in out  # 00 and 03 only
    rows = {line.split()[0][:2]: line for line in out.splitlines() if line[:2].isdigit() and line[2] == "_"}
    assert sorted(rows) == sorted(SOLUTIONS)
    assert PASSES in rows["00"] and "checks pass on 2 ranks" in rows["00"]
    # either rank may fail first (torchrun then stops the other): the row names whichever it was
    assert CHECK_FAILS in rows["03"] and re.search(r"the lab does not run to the end: rank \d raised "
                                                   r"ModuleNotFoundError: No module named 'torch_typo'", rows["03"])
    assert TODOS_OPEN in rows["01"] and NOT_STARTED in rows["02"]
    assert f"1 of {len(SOLUTIONS)} labs pass." in out


def test_format_status_names_the_folder_and_the_world_size(tmp_path, no_launch):
    text = format_status(collect_status(fresh_labs(tmp_path), say=print))
    assert text.splitlines()[0].startswith(f"Labs in {tmp_path / 'labs'}/ (")
    assert "checked on 2 ranks" in text.splitlines()[0]
    assert text.rstrip().endswith(f"python -m ddpcourse check {tmp_path / 'labs'}/NN_name.py")


# ----------------------------------------------------------------------------- reset
def test_reset_saves_the_learners_version_then_restores_the_generated_one(tmp_path):
    labs = fresh_labs(tmp_path)
    lab = labs / SOLUTIONS["03"].name
    mine = "def half_done(:\n    # my notes, not valid Python yet\n"  # a file that does not even compile
    lab.write_text(mine)
    when = datetime(2026, 11, 21, 9, 5, 7)
    result = reset("03", labs=labs, now=when)
    saved = labs / f"{SOLUTIONS['03'].stem}.saved-20261121-090507.py"
    assert result.saved == saved and saved.read_text() == mine
    assert lab.read_text() == generated("03")
    assert f"your version is saved as {saved}" in result.message
    # a second reset in the same second never overwrites the first saved version
    lab.write_text(mine + "# more\n")
    again = reset("03_change_a_wrapped_model", labs=labs, now=when)
    assert again.saved.name == f"{SOLUTIONS['03'].stem}.saved-20261121-090507-2.py"
    assert saved.read_text() == mine and again.saved.read_text() == mine + "# more\n"


def test_reset_starts_the_hints_again_from_the_todo_comment(tmp_path):
    from ddpcourse.todos import remember_level, revealed_level

    labs = fresh_labs(tmp_path)
    lab = labs / SOLUTIONS["03"].name
    other = labs / SOLUTIONS["00"].name
    remember_level(lab, 1, 3)
    remember_level(other, 1, 2)
    lab.write_text(lab.read_text() + "# my edit\n")
    reset("03", labs=labs)
    assert revealed_level(lab, 1) == 1
    assert revealed_level(other, 1) == 2  # another lab's hints stay where they were


def test_reset_of_an_untouched_or_missing_lab(tmp_path):
    labs = fresh_labs(tmp_path)
    before = sorted(p.name for p in labs.iterdir())
    untouched = reset("00", labs=labs)
    assert not untouched.changed and untouched.saved is None and "nothing saved" in untouched.message
    (labs / SOLUTIONS["04"].name).unlink()
    restored = reset("04_local_sgd", labs=labs)
    assert restored.saved is None and "there was no file to save" in restored.message
    assert sorted(p.name for p in labs.iterdir()) == before
    assert (labs / SOLUTIONS["04"].name).read_text() == generated("04")


# The course's labs as the solutions folder holds them (lab 06 included), and the first number after them.
LAB_LIST = ", ".join(path.name[:2] for path in lab_files(COURSE_ROOT / "solutions"))
NO_SUCH_LAB = f"{int(LAB_LIST[-2:]) + 1:02d}"


@pytest.mark.parametrize("lab, message", [
    (NO_SUCH_LAB, f"there is no lab {NO_SUCH_LAB}; the labs are {LAB_LIST}\n"),
    ("abc", f"'abc' is not a lab number; the labs are {LAB_LIST} (e.g. `python -m ddpcourse reset 00`)\n"),
    ("00_wrong_name", f"lab 00 is 00_first_collectives, not 00_wrong_name; the labs are {LAB_LIST}\n"),
])
def test_reset_refuses_unknown_labs_clearly(tmp_path, capsys, lab, message):
    labs = fresh_labs(tmp_path)
    before = {p.name: p.read_text() for p in labs.iterdir()}
    assert main(["reset", lab, "--labs", str(labs)]) == 2
    captured = capsys.readouterr()
    assert captured.err.endswith(message) and captured.out == ""  # the whole list of labs, none left out
    assert {p.name: p.read_text() for p in labs.iterdir()} == before


@pytest.mark.parametrize("spelling, known", [
    ("03", True), ("03_change_a_wrapped_model", True), ("3", False), ("3_change_a_wrapped_model", False),
    ("03_wrong_name", False), ("three", False),
])
def test_reset_check_and_hint_accept_the_same_spellings(tmp_path, monkeypatch, spelling, known):
    # check and hint find the lab with resolve_lab (and its solution with solution_of), reset with its own
    # lookup: one parser behind all three, so none accepts a spelling another refuses
    monkeypatch.delenv("DDPCOURSE_LAB_SOURCE", raising=False)
    labs = fresh_labs(tmp_path)
    try:
        by_reset = reset(spelling, labs=labs).path.name
    except UnknownLab:
        by_reset = None
    try:
        by_check = resolve_lab(spelling).name
    except FileNotFoundError:
        by_check = None
    expected = SOLUTIONS["03"].name if known else None
    assert by_reset == by_check == expected
    if spelling != "03_wrong_name":  # solution_of reads the number only
        assert (solution_of(spelling) == SOLUTIONS["03"]) is known


def test_reset_cli_and_saved_files_are_ignored_by_git(tmp_path, capsys):
    labs = fresh_labs(tmp_path)
    (labs / SOLUTIONS["01"].name).write_text("# my work\n")
    assert main(["reset", "01", "--labs", str(labs)]) == 0
    out = capsys.readouterr().out
    assert "is back to its generated state" in out
    saved = next(labs.glob("01_*.saved-*.py"))
    assert saved.read_text() == "# my work\n"
    ignored = subprocess.run(["git", "check-ignore", "-q", f"labs/{saved.name}"], cwd=COURSE_ROOT)
    assert ignored.returncode == 0, ".gitignore must keep saved versions out of git"


def test_status_line_for_the_room_reads_files_only(tmp_path, capsys, no_launch):
    labs = fresh_labs(tmp_path)
    done = labs / SOLUTIONS["00"].name
    done.write_text(SOLUTIONS["00"].read_text())
    (labs / SOLUTIONS["01"].name).write_text(do_todo(generated("01"), 1))
    (labs / SOLUTIONS["02"].name).write_text("def broken(:\n")
    (labs / SOLUTIONS["05"].name).unlink()
    open_01 = ",".join(str(k) for k, _ in open_todos(do_todo(generated("01"), 1)))
    touched = {"00": "edited", "01": f"todo{open_01}", "02": "syntax", "05": "missing"}
    cells = [f"{n}:{touched.get(n, 'new')}" for n in sorted(SOLUTIONS)]  # every lab, in order of its number
    assert main(["status", "--line", "--labs", str(labs)]) == 0
    assert capsys.readouterr().out == " ".join(["ddpcourse", *cells]) + "\n"
