"""The instructor's workshop kit (docs/workshop/), checked against the notebooks and the guide.

- run_sheets.md: one sheet per notebook; each sheet's minutes add up to the module's block in the guide's
  time table, column by column; every Predict it names exists in that notebook, and every Predict of the
  notebook has its vote row, in order; the lab's TODOs, 2-3 debrief questions and what to cut are there.

Everything here reads files; nothing is launched.
"""
import ast
import json
import re

import pytest

from ddpcourse.paths import COURSE_ROOT

WORKSHOP = COURSE_ROOT / "docs" / "workshop"
NOTEBOOKS = sorted((COURSE_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MODULES = [path.name[:2] for path in NOTEBOOKS]
KINDS = {"demo": "live demos", "vote": "Predict votes", "read": "reading", "run": "running cells", "lab": "lab"}  # row kind: column


def notebook_cells(number):
    path = next(p for p in NOTEBOOKS if p.name.startswith(number))
    return json.loads(path.read_text())["cells"]


def predict_ids(number):
    """The qids of the notebook's predict(...) calls, in order (read with ast, nothing run)."""
    ids = []
    for cell in notebook_cells(number):
        if cell["cell_type"] != "code":
            continue
        for node in ast.walk(ast.parse("".join(cell["source"]))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "predict":
                ids.append(ast.literal_eval(node.args[0]))
    return ids


# ------------------------------------------------------------------------------------------ run sheets

def time_table():
    """{module: {kind: minutes, ..., "block": minutes, "todos": n}} from docs/instructors.md, section "The
    time table". Its columns are found by their headings (KINDS); "after the workshop" is in no block."""
    guide = (COURSE_ROOT / "docs" / "instructors.md").read_text()
    section = guide.split("## The time table", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    heads = [cell.strip() for cell in lines[0].strip("|").split("|")]
    columns = {kind: next(i for i, head in enumerate(heads) if head.lower().startswith(name.lower()))
               for kind, name in KINDS.items()}
    block = heads.index("block")
    rows = {}
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if not re.match(r"\d\d ", cells[0]):
            break
        minutes = {kind: int(re.findall(r"(\d+) min", cells[i])[-1]) for kind, i in columns.items()}
        minutes["block"] = int(re.findall(r"(\d+) min", cells[block])[-1])
        minutes["todos"] = int(re.search(r"(\d+) TODOs", cells[columns["lab"]]).group(1))
        rows[cells[0][:2]] = minutes
    return rows


def run_sheets():
    """{module: sheet text} from run_sheets.md, split at its '## Module NN' headings."""
    text = (WORKSHOP / "run_sheets.md").read_text()
    parts = re.split(r"^## Module (\d\d)\b", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def sheet_rows(sheet):
    """(start minute, end minute, minutes, kind, text) of every row of a sheet's table."""
    rows = []
    for match in re.finditer(r"^\| (\d+):(\d\d)-(\d+):(\d\d) \| (\d+) \| (\w+) \| (.*) \|$", sheet, re.M):
        h0, m0, h1, m1, minutes, kind, text = match.groups()
        rows.append((int(h0) * 60 + int(m0), int(h1) * 60 + int(m1), int(minutes), kind, text))
    return rows


def named_predicts(text):
    return re.findall(r"`(\d\d\.[a-z][a-z0-9-]*)`", text)


def test_the_time_table_is_parsed():
    table = time_table()
    assert sorted(table) == MODULES, "the guide's time table and notebooks/ list different modules"
    for number, row in table.items():
        assert sum(row[kind] for kind in KINDS) == row["block"], f"module {number}: the columns do not add up to the block"


def test_every_module_has_exactly_one_run_sheet():
    assert sorted(run_sheets()) == MODULES


@pytest.mark.parametrize("number", MODULES)
def test_the_sheet_spends_the_block_as_the_time_table_does(number):
    table, rows = time_table()[number], sheet_rows(run_sheets()[number])
    assert rows, f"module {number}: no rows in its table"
    assert {kind for *_, kind, _ in rows} <= set(KINDS), f"module {number}: unknown kind of row"
    assert sum(minutes for _, _, minutes, _, _ in rows) == table["block"]
    for kind, column in KINDS.items():
        spent = sum(minutes for _, _, minutes, k, _ in rows if k == kind)
        assert spent == table[kind], f"module {number}: {kind} rows take {spent} min, the table's {column!r} {table[kind]}"
    clock = 0  # the clock column runs without gaps from 0:00 to the end of the block
    for start, end, minutes, _, text in rows:
        assert (start, end) == (clock, clock + minutes), f"module {number}: the clock jumps at {text[:40]!r}"
        clock = end


@pytest.mark.parametrize("number", MODULES)
def test_the_sheet_names_every_predict_of_its_notebook_and_no_other(number):
    sheet, in_notebook = run_sheets()[number], predict_ids(number)
    named = named_predicts(sheet)
    assert set(named) <= set(in_notebook), f"module {number}: not in the notebook: {set(named) - set(in_notebook)}"
    assert set(in_notebook) <= set(named), f"module {number}: no vote on {set(in_notebook) - set(named)}"
    votes = [text for *_, kind, text in sheet_rows(sheet) if kind == "vote" and not text.startswith("Spare")]
    assert [named_predicts(text)[0] for text in votes] == in_notebook, "one vote row per Predict, in the notebook's order"


@pytest.mark.parametrize("number", MODULES)
def test_the_sheet_has_its_lab_todos_debrief_and_cuts(number):
    sheet, table = run_sheets()[number], time_table()[number]
    kinds = [kind for *_, kind, _ in sheet_rows(sheet)]
    assert set(kinds[kinds.index("lab"):]) == {"lab"}, f"module {number}: the lab rows come last (a plan's stretch goes before them)"
    lab_rows = " ".join(text for *_, kind, text in sheet_rows(sheet) if kind == "lab")
    assert re.findall(r"TODO (\d)", lab_rows)[:table["todos"]] == [str(k) for k in range(1, table["todos"] + 1)]
    debrief = sheet.split("### Debrief questions", 1)[1].split("###", 1)[0]
    assert 2 <= len(re.findall(r"^\d\. ", debrief, re.M)) <= 3
    cuts = sheet.split("### When late, cut", 1)[1]
    assert re.findall(r"^\d\. ", cuts, re.M), f"module {number}: nothing to cut when late"
    demos = [text for *_, kind, text in sheet_rows(sheet) if kind == "demo"]
    assert all("Live demo" in text for text in demos)
