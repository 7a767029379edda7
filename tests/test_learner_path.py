"""The notebooks from the learner's seat: their lab cells on untouched labs and on completed labs.

Run All must never stop at an error cell (issue 12). Only the cells that touch the learner's labs can
behave differently from the author's run that nbval checks, so these tests execute exactly those cells
(with each notebook's import cells), as a learner would: no DDPCOURSE_LAB_SOURCE, labs/ untouched, then
completed with the solutions. test_only_the_executed_cells_touch_the_labs proves no other cell does.
Both runs use a copy of the course, so the learner's own labs/ and hint levels are never touched.
"""
import ast
import io
import os
import re
import shutil
import tokenize

import nbformat
import pytest
from nbclient import NotebookClient

from ddpcourse.authoring import notebooks as nbfiles
from ddpcourse.paths import COURSE_ROOT, LAB_SOURCE_ENV, lab_files

# The notebook helpers that read or run a lab of labs/ when not given a demo or solution path.
LAB_FUNCTIONS = {"run_lab", "check_lab", "hint", "status", "reveal_hint", "todo_status", "main_reset", "reset"}
NOT_A_LAB = re.compile(r"^(\.\./)?(demos|solutions)/")  # run_lab("demos/x.py"), run_lab("../solutions/05_x.py")
# The textual trace a lab-touching cell leaves (checked on every cell NOT executed here).
# (Demo and solution paths are blanked first: run_lab("demos/x.py") reads run_lab("").)
LAB_WORDS = re.compile(r"\blabs\b|\b(resolve_lab|lab_folder|LAB_SOURCE)\b|ddpcourse\.(progress|todos)|"
                       r"\b(run_lab|check_lab)\b(?!\s*\(\s*\"\")|"  # a call on a lab, or an alias
                       + "|".join(rf"\b{name}\s*\((?!\s*\"\")" for name in sorted(LAB_FUNCTIONS)))
COUNT_LAUNCHES = """\
import ddpcourse.launch.launcher as launcher_module
if not hasattr(launcher_module, "launched_files"):  # count every launch of this kernel from here on
    def counting_run(file, *args, _module=launcher_module, _run=launcher_module.run, **kwargs):
        _module.launched_files.append(str(file))
        return _run(file, *args, **kwargs)
    launcher_module.run, launcher_module.launched_files = counting_run, []
launcher_module.launched_files.clear()
"""


def python_of(source):
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager().transform_cell(source)


def called_name(call):
    return getattr(call.func, "id", None) or getattr(call.func, "attr", None)


def touches_a_lab(call):
    if called_name(call) not in LAB_FUNCTIONS:
        return False
    first = call.args[0] if call.args else None
    is_other_file = isinstance(first, ast.Constant) and isinstance(first.value, str) and NOT_A_LAB.match(first.value)
    return not is_other_file


JUDGING = {"check_lab", "status"}  # the lab functions that judge a lab (they run its check)


def lab_cells(notebook, judging=True):
    """Indices of the code cells a learner's labs decide: lab calls and cells reading their results.

    A cell is in when it calls a lab function on a lab (see touches_a_lab), mentions labs/, or reads a
    name that such a call's result was assigned to (until the name is rebound to something else).
    judging=False leaves out the cells that call a judging function (JUDGING) and those that read its result.
    """
    selected, result_names, judged_names = [], set(), set()
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        tree = ast.parse(python_of(cell.source))
        nodes = list(ast.walk(tree))
        calls = [node for node in nodes if isinstance(node, ast.Call) and touches_a_lab(node)]
        reads = {node.id for node in nodes if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
        judges = any(called_name(call) in JUDGING for call in calls) or bool(reads & judged_names)
        if (calls or "labs/" in cell.source or reads & result_names) and (judging or not judges):
            selected.append(index)
        for node in nodes:
            if isinstance(node, ast.Assign):
                names = {t.id for t in node.targets if isinstance(t, ast.Name)}
                if isinstance(node.value, ast.Call) and touches_a_lab(node.value):
                    result_names |= names
                    if called_name(node.value) in JUDGING:
                        judged_names |= names
                else:
                    result_names -= names
                    judged_names -= names
    return selected


def setup_code(notebook, selected):
    """The state the selected cells need: every import of the notebook, setup_notebook(), and the
    functions and classes the selected cells use (definitions only: no other statement runs)."""
    trees = [ast.parse(python_of(cell.source)) for cell in notebook.cells if cell.cell_type == "code"]
    used = {node.id for index in selected for node in ast.walk(ast.parse(python_of(notebook.cells[index].source)))
            if isinstance(node, ast.Name)}
    imports, setup, definitions = [], [], []
    for tree in trees:
        for statement in tree.body:
            if isinstance(statement, (ast.Import, ast.ImportFrom)):
                imports.append(statement)
            elif isinstance(statement, (ast.FunctionDef, ast.ClassDef)) and statement.name in used:
                definitions.append(statement)
            elif (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
                  and called_name(statement.value) == "setup_notebook"):
                setup.append(statement)
    return ast.unparse(ast.Module(body=imports + setup + definitions, type_ignores=[]))


def learner_run_notebook(judging=True):
    """One notebook holding, for every course notebook in turn, its setup cells and its lab cells
    (without the judging ones when judging=False, see lab_cells)."""
    run = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                            "language": "python"}})
    run.cells.append(nbformat.v4.new_code_cell(COUNT_LAUNCHES))
    for path in nbfiles.notebook_files():
        notebook = nbformat.read(path, as_version=4)
        selected = lab_cells(notebook, judging)
        run.cells.append(nbformat.v4.new_code_cell("%reset -f"))  # nothing leaks from the previous notebook
        setup = nbformat.v4.new_code_cell(setup_code(notebook, selected))
        setup.metadata["origin"] = {"notebook": path.name, "cell": "imports"}
        run.cells.append(setup)
        for index in selected:
            cell = nbformat.v4.new_code_cell(notebook.cells[index].source)
            cell.metadata["origin"] = {"notebook": path.name, "cell": index, "lab": True}
            run.cells.append(cell)
    run.cells.append(nbformat.v4.new_code_cell(
        "import ddpcourse.launch.launcher as launcher_module\nprint(len(launcher_module.launched_files), 'launches')"))
    return run


@pytest.fixture(scope="module")
def course_copy(tmp_path_factory):
    """A copy of the course whose ddpcourse the kernel (and every rank) imports, and a kernel started in it
    as a learner's: no DDPCOURSE_LAB_SOURCE.
    labs/ is as make-labs generates it, whatever the checkout's labs/ holds."""
    from ddpcourse.authoring.makelabs import make_lab

    root = tmp_path_factory.mktemp("learner") / "course"
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "*.saved-*.py", ".hint-levels.json")
    for folder in ("ddpcourse", "notebooks", "solutions"):
        shutil.copytree(COURSE_ROOT / folder, root / folder, ignore=ignore)
    (root / "labs").mkdir()
    for solution in lab_files(COURSE_ROOT / "solutions"):
        (root / "labs" / solution.name).write_text(make_lab(solution.read_text(), solution.name))
    client = NotebookClient(nbformat.v4.new_notebook(), timeout=300, kernel_name="python3", allow_errors=True,
                            shutdown_kernel="immediate",
                            resources={"metadata": {"path": str(root / "notebooks")}})
    with pytest.MonkeyPatch.context() as env:
        env.delenv(LAB_SOURCE_ENV, raising=False)
        env.delenv("IPYTHONDIR", raising=False)  # no suite machinery (conftest.py's recorded checks) here
        env.delenv("DDPCOURSE_TESTS_RECORD_RUNS", raising=False)
        env.setenv("PYTHONPATH", str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with client.setup_kernel():  # one kernel for both runs: a kernel start costs seconds
            yield root, client


def run_as_learner(client, judging=True):
    client.nb = run = learner_run_notebook(judging)
    for index, cell in enumerate(run.cells):
        client.execute_cell(cell, index)
    text = lambda cell: "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                                for o in cell.outputs)
    errors = [f"{c.metadata['origin']['notebook']} cell {c.metadata['origin']['cell']}: "
              f"{o.ename}: {o.evalue}" for c in run.cells if "origin" in c.metadata
              for o in c.outputs if o.output_type == "error"]
    lab_outputs = [(c.metadata["origin"], c.source, text(c)) for c in run.cells
                   if c.metadata.get("origin", {}).get("lab")]
    launches = int(text(run.cells[-1]).split()[0])
    return errors, lab_outputs, launches


def test_the_kernel_imports_the_copy(course_copy):
    root, client = course_copy
    client.nb = nbformat.v4.new_notebook()
    client.nb.cells = [nbformat.v4.new_code_cell("import ddpcourse, os; print(ddpcourse.__file__, os.getcwd())")]
    client.execute_cell(client.nb.cells[0], 0)
    where = client.nb.cells[0].outputs[0].text
    assert where.startswith(str(root / "ddpcourse")), where


def test_untouched_labs_show_their_todo_status(course_copy):
    errors, lab_outputs, launches = run_as_learner(course_copy[1])
    assert not errors, "error cells on untouched labs:\n" + "\n".join(errors)
    for origin, source, output in lab_outputs:
        if re.search(r"\b(run_lab|check_lab)\(", source):
            assert "TODO" in output, f"{origin}: shows no TODO status:\n{output}"
    assert launches == 0, "an untouched lab is never launched"


def test_completed_labs_run_in_every_run_cell(course_copy):
    """labs/ completed with the solutions: every cell that runs a lab, and those that read its result, end well.

    The check cells and the status table are left out here: their verdict depends on the lab's text and the
    check alone, the copies in labs/ are byte for byte the solutions (asserted), and nbval runs those very
    cells on solutions/ with the committed "lab passes" as the expected output; the untouched run above
    shows the same cells resolving the learner's labs/. Judging every lab again here cost 4 minutes."""
    root, client = course_copy
    for solution in lab_files(root / "solutions"):
        shutil.copy(solution, root / "labs" / solution.name)
        assert (root / "labs" / solution.name).read_bytes() == (COURSE_ROOT / "solutions" / solution.name).read_bytes()
    errors, lab_outputs, launches = run_as_learner(client, judging=False)
    assert not errors, "error cells with completed labs:\n" + "\n".join(errors)
    runs = 0
    for origin, source, output in lab_outputs:
        assert not re.search(r"\b(check_lab|status)\(", source), origin
        if re.search(r"\brun_lab\(\s*[\"']\d\d", source):
            runs += 1
            assert "OK:" in output, f"{origin}: a completed lab's run did not end well:\n{output}"
    assert runs >= 2 and launches == runs  # each run_lab cell launched its lab once


def test_only_the_executed_cells_touch_the_labs():
    """Every cell outside lab_cells: no lab function on a lab, no labs/ path, no lab result read."""
    executed = 0
    for path in nbfiles.notebook_files():
        notebook = nbformat.read(path, as_version=4)
        selected = set(lab_cells(notebook))
        executed += len(selected)
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type != "code" or index in selected:
                continue
            text = code_words(cell.source)
            assert not LAB_WORDS.search(text), f"{path.name} cell {index} touches a lab but is not executed:\n{text}"
    assert executed >= 2 * len(lab_files(COURSE_ROOT / "solutions"))  # a run cell or a check cell per lab, and more
    for demo in (COURSE_ROOT / "notebooks" / "demos").glob("*.py"):
        assert not re.search(r"\blabs\b", demo.read_text()), f"{demo.name} reads the learner's labs"


def code_words(source):
    """A cell's code without comments, import lines, and demo or solution paths (blanked to "")."""
    tokens = tokenize.generate_tokens(io.StringIO(python_of(source)).readline)
    words, line = [], []
    for token in tokens:
        if token.type in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER):
            if line and line[0] not in ("import", "from"):
                words.append(" ".join(line))
            line = []
        elif token.type == tokenize.STRING and NOT_A_LAB.match(token.string.strip("\"'")):
            line.append('""')
        elif token.type not in (tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            line.append(token.string)
    return "\n".join(words)


def test_lab_cell_selection():
    notebook = nbformat.v4.new_notebook()
    sources = ['demo = run_lab("demos/00_collectives.py")', 'lab = run_lab("00", nproc=3)', "print(demo.ok)",
               "if lab.ok:\n    print(lab.values('x'))", 'lab = run_lab("../solutions/05_resilient_trainer.py")',
               "print(lab.ok)", 'hint("00")', 'print(open("../labs/00_first_collectives.py").read())']
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    assert lab_cells(notebook) == [1, 3, 6, 7]
