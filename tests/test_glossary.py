"""docs/glossary.md and the "Before you start" cell of every notebook (docs/lint/glossary.py, whose docstring
states the rules): the committed glossary and notebooks pass every rule, and each rule reports a mistake
planted in a copy. Files only: no kernel, no launch.
"""
import copy
import re

import pytest

from helpers import docs_tool

lint = docs_tool("docs/lint/glossary.py")
GLOSSARY = lint.GLOSSARY
NOTEBOOKS = lint.notebook_paths(lint.COURSE_ROOT / "notebooks")
CLEAN = lint.notebook_paths(lint.COURSE_ROOT / "clean")
load = lint.load


def glossary_text():
    return GLOSSARY.read_text(encoding="utf-8")


def glossary_anchors():
    return {anchor for anchor, _, _ in lint.glossary_entries(glossary_text())}


def test_glossary_entries_are_defined_introduced_and_sorted():
    entries = lint.glossary_entries(glossary_text())
    assert len(entries) >= len(set(lint.REQUIRED.values())), f"only {len(entries)} entries"
    assert lint.glossary_problems(glossary_text()) == []


def test_glossary_has_every_required_term():
    assert lint.missing_required_terms(glossary_text()) == []


def test_glossary_introductions_name_notebooks_that_exist_and_every_notebook_introduces_a_term():
    assert lint.introduction_problems(glossary_text(), [path.name[:2] for path in NOTEBOOKS]) == []


@pytest.mark.parametrize("path", NOTEBOOKS + CLEAN, ids=lambda p: f"{p.parent.name}/{p.name[:2]}")
def test_notebook_opens_with_before_you_start(path):
    assert lint.before_you_start_problems(load(path), path) == []


@pytest.mark.parametrize("path", NOTEBOOKS + CLEAN, ids=lambda p: f"{p.parent.name}/{p.name[:2]}")
def test_glossary_anchors_linked_from_notebooks_exist(path):
    assert lint.glossary_anchor_problems(load(path), path, glossary_anchors()) == []


def test_clean_copies_carry_the_same_before_you_start_cell():
    assert lint.clean_copy_problems(NOTEBOOKS, CLEAN) == []


# --- each check fails on a planted mistake -------------------------------------------------------------------


def planted(path, edit):
    """A copy of a notebook with its Before-you-start source changed by edit(source) -> source."""
    notebook = copy.deepcopy(load(path))
    notebook["cells"][1]["source"] = edit(lint.text_of(notebook["cells"][1]["source"]))
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
    assert lint.before_you_start_problems(planted(path, lambda s: s), path) == []  # the unchanged copy passes
    problems = lint.before_you_start_problems(planted(path, edit), path)
    assert any(expected in problem for problem in problems), (mistake, problems)


def test_before_you_start_check_catches_a_misplaced_cell():
    notebook = copy.deepcopy(load(NOTEBOOKS[2]))
    notebook["cells"].insert(1, notebook["cells"].pop(2))  # the first code cell now comes before it
    assert "must be cell 1" in lint.before_you_start_problems(notebook, NOTEBOOKS[2])[0]


def test_glossary_link_check_catches_a_link_that_resolves_elsewhere(tmp_path):
    """The same relative link, read from a folder that is not beside docs/: it reaches another file."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "glossary.md").write_text("# another glossary\n")
    (tmp_path / "notebooks").mkdir()
    problems = lint.before_you_start_problems(load(NOTEBOOKS[0]), tmp_path / "notebooks" / NOTEBOOKS[0].name)
    assert any("resolves to" in problem for problem in problems), problems


def test_anchor_check_catches_a_missing_anchor():
    notebook = planted(NOTEBOOKS[3], lambda s: s.replace("glossary.md#barrier", "glossary.md#barriers"))
    assert lint.glossary_anchor_problems(notebook, NOTEBOOKS[3], glossary_anchors()) == [
        "notebooks/03_change_a_wrapped_model.ipynb cell 1: links ../docs/glossary.md#barriers, but the glossary "
        "has no anchor #barriers"]


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
    problems = lint.glossary_problems(changed)
    assert any(expected in problem for problem in problems), (mistake, problems)


def test_required_terms_check_catches_a_missing_term():
    text = glossary_text()
    assert lint.missing_required_terms(text, {**lint.REQUIRED, "all-to-all": "all-to-all"}) == [
        "docs/glossary.md: all-to-all: no entry #all-to-all"]
    renamed = text.replace("### static_graph", "### static graph", 1)
    assert lint.missing_required_terms(renamed) == [
        "docs/glossary.md: static_graph: entry #static-graph ('static graph') does not name it"]
