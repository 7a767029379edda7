"""docs/glossary.md and the "Before you start" cell of every notebook, checked as files (no kernel, no launch).

1. Every notebook (notebooks/ and its clean/ copy) has, right after its title cell, a markdown cell that starts
   with **Before you start**: a **Prerequisites** list of at least one line (from notebook 01 on, naming
   earlier modules by a link to their notebooks), **After this module you can:** with 3 to 5 numbered
   objectives, and a link to the glossary that resolves from the notebook's own folder.
2. Every glossary entry is an anchor, a heading, a definition, and an "Introduced in" line whose first link
   names an existing notebook and a section (§); entries are in alphabetical order, anchors unique, and every
   link inside the glossary resolves.
3. Every term of the course's required list has its entry, and every glossary anchor that a notebook links to
   exists.

Each checker returns a list of problems; the tests at the end plant a mistake in a copy and see it reported.
"""
import copy
import json
import re
from pathlib import Path

import pytest

from ddpcourse.authoring import notebooks as nbfiles
from ddpcourse.paths import COURSE_ROOT

GLOSSARY = COURSE_ROOT / "docs" / "glossary.md"
NOTEBOOKS = nbfiles.notebook_files()
CLEAN = nbfiles.notebook_files(nbfiles.CLEAN)

# The terms the course must define (as its brief names them) -> the glossary anchor that defines them. The
# term itself must appear in that entry's heading ("DDP" in "DistributedDataParallel (DDP)").
REQUIRED = {
    "rank": "rank", "local rank": "local-rank", "world size": "world-size", "process group": "process-group",
    "backend": "backend", "gloo": "gloo", "nccl": "nccl", "collective": "collective",
    "broadcast": "broadcast", "all-reduce": "all-reduce", "reduce": "reduce", "all-gather": "all-gather",
    "gather": "gather", "reduce-scatter": "reduce-scatter", "barrier": "barrier",
    "DataParallel": "dataparallel", "DistributedDataParallel": "ddp", "DDP": "ddp", "replica": "replica",
    "bucket": "bucket", "gradient hook": "gradient-hook", "no_sync": "no-sync",
    "gradient accumulation": "gradient-accumulation", "find_unused_parameters": "find-unused-parameters",
    "static_graph": "static-graph", "buffers": "buffers", "broadcast_buffers": "forward-sync-buffers",
    "forward_sync_buffers": "forward-sync-buffers", "torchrun": "torchrun", "rendezvous": "rendezvous",
    "elastic restart": "elastic-restart", "--max-restarts": "elastic-restart",
    "DistributedSampler": "distributedsampler", "Join": "join", "local SGD": "local-sgd",
    "model averaging": "local-sgd", "checkpoint": "checkpoint", "atomic write": "checkpoint",
    "overlap": "overlap", "latency": "latency-bandwidth", "bandwidth": "latency-bandwidth",
    "α-β cost": "latency-bandwidth",
}

LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
ENTRY = re.compile(r'^<a id="([^"]+)"></a>\s*\n+### ([^\n]+)\n(.*?)(?=^<a id=|\Z)', re.M | re.S)
INTRODUCED = "**Introduced in:**"
NOTEBOOK_LINK = re.compile(r"^\.\./clean/(\d\d)_\w+\.ipynb$")  # the learner's copy: no outputs to spoil a Predict


def text_of(value):
    return "".join(value) if isinstance(value, list) else (value or "")


def load(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


# --- the glossary ------------------------------------------------------------------------------------------


def glossary_entries(text):
    """(anchor, heading, body) of every entry of a glossary text."""
    return ENTRY.findall(text)


def sort_key(heading):
    return re.sub(r"[^a-z0-9]", "", heading.lower())


def glossary_problems(text, folder=GLOSSARY.parent):
    """What is wrong with a glossary text whose relative links start from `folder`."""
    problems = []
    entries = glossary_entries(text)
    anchors = [anchor for anchor, _, _ in entries]
    if len(entries) != text.count("<a id="):
        problems.append(f"{text.count('<a id=')} anchors but {len(entries)} entries of anchor, ### heading, text")
    if len(anchors) != len(set(anchors)):
        problems.append(f"anchors used twice: {sorted({a for a in anchors if anchors.count(a) > 1})}")
    headings = [heading for _, heading, _ in entries]
    if headings != sorted(headings, key=sort_key):
        out_of_order = [b for a, b in zip(headings, headings[1:]) if sort_key(b) < sort_key(a)]
        problems.append(f"entries not in alphabetical order, first misplaced: {out_of_order[:1]}")
    for anchor, heading, body in entries:
        introduced = [line for line in body.splitlines() if line.startswith(INTRODUCED)]
        definition = "\n".join(line for line in body.splitlines() if not line.startswith(INTRODUCED))
        if len(re.findall(r"\w+", definition)) < 12:
            problems.append(f"{heading}: no definition (fewer than 12 words)")
        if len(introduced) != 1:
            problems.append(f"{heading}: needs exactly one line starting {INTRODUCED}")
            continue
        links = LINK.findall(introduced[0])
        first = NOTEBOOK_LINK.match(links[0][1]) if links else None
        if not first:
            problems.append(f"{heading}: its {INTRODUCED} line does not start with a link to a notebook")
        elif not (folder / links[0][1]).is_file():
            problems.append(f"{heading}: introduced in {links[0][1]}, which does not exist")
        elif "§" not in links[0][0] and not re.search(r"introduction|lab \d\d", links[0][0]):
            problems.append(f"{heading}: {INTRODUCED} names no section (§) of notebook {first.group(1)}")
    for _, target in LINK.findall(text):
        path, _, fragment = target.partition("#")
        if re.match(r"^[a-z]+:", target):
            continue
        if path and not (folder / path).is_file():
            problems.append(f"link to {target}: no such file")
        if not path and fragment not in anchors:
            problems.append(f"link to #{fragment}: no such anchor")
    return problems


def missing_required_terms(text, required=REQUIRED):
    entries = {anchor: heading for anchor, heading, _ in glossary_entries(text)}
    problems = []
    for term, anchor in required.items():
        if anchor not in entries:
            problems.append(f"{term}: no entry #{anchor}")
        elif term.lower() not in entries[anchor].lower():
            problems.append(f"{term}: entry #{anchor} ({entries[anchor]!r}) does not name it")
    return problems


# --- the notebooks' "Before you start" cell ------------------------------------------------------------------


def lines_between(source, start, end):
    """The lines of a markdown source after the line `start` and before the line that starts with `end`."""
    lines = source.splitlines()
    if start not in lines:
        return None
    following = lines[lines.index(start) + 1:]
    stop = next((i for i, line in enumerate(following) if line.startswith(end)), len(following))
    return following[:stop]


def items(lines, marker):
    """The list items of some markdown lines: each starts with `marker` (a regex); indented lines continue it."""
    found = []
    for line in lines:
        if re.match(marker, line):
            found.append(line)
        elif line.startswith(" ") and found:
            found[-1] += " " + line.strip()
    return found


def before_you_start_problems(notebook, path):
    """What is wrong with the Before-you-start cell of a notebook (its JSON), read as the file at `path`."""
    cells = notebook["cells"]
    number = Path(path).name[:2]
    if not cells or cells[0]["cell_type"] != "markdown" or not text_of(cells[0]["source"]).startswith(f"# {number} "):
        return [f"{path.name}: the first cell is not the title (# {number} ...)"]
    found = [i for i, cell in enumerate(cells) if cell["cell_type"] == "markdown"
             and text_of(cell["source"]).startswith("**Before you start**")]
    if found != [1]:
        return [f"{path.name}: the Before-you-start cell must be cell 1, right after the title, once (found {found})"]
    source = text_of(cells[1]["source"])
    problems = []
    prerequisites = items(lines_between(source, "**Prerequisites**", "**After this module") or [], r"- \S")
    if not prerequisites:
        problems.append(f"{path.name}: no prerequisite line (- ...) under **Prerequisites**")
    modules = [line for line in prerequisites if line.startswith("- Modules:")]
    earlier = {int(n) for line in modules for _, target in LINK.findall(line)
               for n in re.findall(r"^(\d\d)_\w+\.ipynb$", target)}
    if int(number) > 0 and (not earlier or max(earlier) >= int(number)):
        problems.append(f"{path.name}: the Modules line must link the earlier modules it needs (found {sorted(earlier)})")
    for _, target in LINK.findall("\n".join(modules)):
        if not (Path(path).parent / target).is_file():
            problems.append(f"{path.name}: prerequisite link {target} does not resolve")
    objectives = items(lines_between(source, "**After this module you can:**", "**Glossary") or [], r"\d+\. \S")
    if not 3 <= len(objectives) <= 5:
        problems.append(f"{path.name}: {len(objectives)} objectives under **After this module you can:** (3 to 5)")
    short = [line for line in objectives if len(line.split()) < 8]
    if short:
        problems.append(f"{path.name}: objectives too short to be checkable: {short}")
    glossary_links = [target for _, target in LINK.findall(source) if target.split("#")[0].endswith("glossary.md")]
    if not glossary_links:
        problems.append(f"{path.name}: no link to the glossary")
    for target in glossary_links:
        resolved = (Path(path).parent / target.split("#")[0]).resolve()
        if resolved != GLOSSARY.resolve() or not resolved.is_file():
            problems.append(f"{path.name}: glossary link {target} resolves to {resolved}, not {GLOSSARY}")
    return problems


def glossary_anchor_problems(notebook, path, anchors):
    """Links from any markdown cell of a notebook to a glossary anchor that does not exist."""
    problems = []
    for cell in notebook["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        for _, target in LINK.findall(text_of(cell["source"])):
            file, _, fragment = target.partition("#")
            if file.endswith("glossary.md") and fragment and fragment not in anchors:
                problems.append(f"{Path(path).name}: links {target}, but the glossary has no anchor #{fragment}")
    return problems


# --- the tests ----------------------------------------------------------------------------------------------


def glossary_text():
    return GLOSSARY.read_text(encoding="utf-8")


def glossary_anchors():
    return {anchor for anchor, _, _ in glossary_entries(glossary_text())}


def test_glossary_entries_are_defined_introduced_and_sorted():
    entries = glossary_entries(glossary_text())
    assert len(entries) >= len(set(REQUIRED.values())), f"only {len(entries)} entries"
    assert glossary_problems(glossary_text()) == []


def test_glossary_has_every_required_term():
    assert missing_required_terms(glossary_text()) == []


def test_glossary_introductions_name_notebooks_that_exist():
    numbers = {path.name[:2] for path in NOTEBOOKS}
    introduced = set()
    for _, heading, body in glossary_entries(glossary_text()):
        line = next(line for line in body.splitlines() if line.startswith(INTRODUCED))
        introduced.add(NOTEBOOK_LINK.match(LINK.findall(line)[0][1]).group(1))
    assert introduced <= numbers
    assert numbers <= introduced, f"no term introduced in notebooks {sorted(numbers - introduced)}"


@pytest.mark.parametrize("path", NOTEBOOKS + CLEAN, ids=lambda p: f"{p.parent.name}/{p.name[:2]}")
def test_notebook_opens_with_before_you_start(path):
    assert before_you_start_problems(load(path), path) == []


@pytest.mark.parametrize("path", NOTEBOOKS + CLEAN, ids=lambda p: f"{p.parent.name}/{p.name[:2]}")
def test_glossary_anchors_linked_from_notebooks_exist(path):
    assert glossary_anchor_problems(load(path), path, glossary_anchors()) == []


def test_clean_copies_carry_the_same_before_you_start_cell():
    assert [p.name for p in CLEAN] == [p.name for p in NOTEBOOKS]
    for executed, clean in zip(NOTEBOOKS, CLEAN):
        assert load(executed)["cells"][1]["source"] == load(clean)["cells"][1]["source"], clean.name


# --- each check fails on a planted mistake -------------------------------------------------------------------


def planted(path, edit):
    """A copy of a notebook with its Before-you-start source changed by edit(source) -> source."""
    notebook = copy.deepcopy(load(path))
    notebook["cells"][1]["source"] = edit(text_of(notebook["cells"][1]["source"]))
    return notebook


def without_objective(source, keep):
    """The source with only the first `keep` objectives (numbered items and their continuation lines)."""
    out, number = [], 0
    for line in source.splitlines():
        match = re.match(r"(\d+)\. ", line)
        number = int(match.group(1)) if match else (number if line.startswith(" ") else 0)
        if number <= keep:
            out.append(line)
    return "\n".join(out)


@pytest.mark.parametrize("mistake, edit, expected", [
    ("two objectives", lambda s: without_objective(s, 2), "2 objectives"),
    ("six objectives", lambda s: s.replace("**After this module you can:**\n",
                                           "**After this module you can:**\n" + "0. run one more cell of this notebook and read it\n" * 3),
     "objectives under"),
    ("no prerequisite line", lambda s: re.sub(r"(?m)^(- |  ).*\n", "", s), "no prerequisite line"),
    ("a glossary link that does not resolve", lambda s: s.replace("../docs/glossary.md", "../glossary.md"),
     "resolves to"),
    ("no glossary link", lambda s: s.replace("glossary.md", "glossary.txt"), "no link to the glossary"),
    ("a link to a later module", lambda s: s.replace("(00_start_here.ipynb)", "(06_ddp_from_the_inside.ipynb)"),
     "earlier modules"),
    ("an objective that is not checkable", lambda s: s.replace("1. ", "1. understand DDP.\n1. ", 1), "too short"),
])
def test_before_you_start_check_catches_a_planted_mistake(mistake, edit, expected):
    path = NOTEBOOKS[1]
    assert before_you_start_problems(planted(path, lambda s: s), path) == []  # the unchanged copy passes
    problems = before_you_start_problems(planted(path, edit), path)
    assert any(expected in problem for problem in problems), (mistake, problems)


def test_before_you_start_check_catches_a_misplaced_cell():
    notebook = copy.deepcopy(load(NOTEBOOKS[2]))
    notebook["cells"].insert(1, notebook["cells"].pop(2))  # the first code cell now comes before it
    assert "must be cell 1" in before_you_start_problems(notebook, NOTEBOOKS[2])[0]


def test_glossary_link_check_catches_a_link_that_resolves_elsewhere(tmp_path):
    """The same relative link, read from a folder that is not beside docs/: it reaches another file."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "glossary.md").write_text("# another glossary\n")
    (tmp_path / "notebooks").mkdir()
    problems = before_you_start_problems(load(NOTEBOOKS[0]), tmp_path / "notebooks" / NOTEBOOKS[0].name)
    assert any("resolves to" in problem for problem in problems), problems


def test_anchor_check_catches_a_missing_anchor():
    notebook = planted(NOTEBOOKS[3], lambda s: s.replace("glossary.md#barrier", "glossary.md#barriers"))
    assert glossary_anchor_problems(notebook, NOTEBOOKS[3], glossary_anchors()) == [
        "03_change_a_wrapped_model.ipynb: links ../docs/glossary.md#barriers, but the glossary has no anchor #barriers"]


@pytest.mark.parametrize("mistake, edit, expected", [
    ("no definition", lambda t: re.sub(r"(### barrier\n\n).*?\n\n(\*\*Introduced)", r"\1\2", t, flags=re.S),
     "barrier: no definition"),
    ("no introduction", lambda t: t.replace("**Introduced in:** [notebook 05, §5, \"Uneven", "[notebook 05, §5, \"Uneven"),
     "Join: needs exactly one line"),
    ("a notebook that does not exist", lambda t: t.replace("../clean/04_sync_without_backward.ipynb",
                                                            "../clean/04_sync_without_backwards.ipynb"),
     "does not exist"),
    ("no section", lambda t: t.replace('[notebook 04, §2 "Averaging parameters: local SGD"]',
                                       '[notebook 04]'), "names no section"),
    ("out of order", lambda t: t.replace("### all-gather", "### zz all-gather"), "alphabetical"),
    ("a broken inner link", lambda t: t.replace("(#collective)", "(#collectives)", 1), "no such anchor"),
    ("an anchor used twice", lambda t: t.replace('<a id="gloo">', '<a id="gather">'), "anchors used twice"),
])
def test_glossary_check_catches_a_planted_mistake(mistake, edit, expected):
    text = glossary_text()
    changed = edit(text)
    assert changed != text, f"the planted mistake ({mistake}) changed nothing: update the test"
    problems = glossary_problems(changed)
    assert any(expected in problem for problem in problems), (mistake, problems)


def test_required_terms_check_catches_a_missing_term():
    text = glossary_text()
    assert missing_required_terms(text, {**REQUIRED, "all-to-all": "all-to-all"}) == ["all-to-all: no entry #all-to-all"]
    renamed = text.replace("### static_graph", "### static graph", 1)
    assert missing_required_terms(renamed) == ["static_graph: entry #static-graph ('static graph') does not name it"]
