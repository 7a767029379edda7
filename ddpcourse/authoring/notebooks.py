"""The notebooks as files: where their cells run from, their clean learner copies, re-executing them.

Every notebook's first code cell, ``setup_notebook()``, is the learner's (ddpcourse.learner.api).
notebooks/NN_name.ipynb are the executed reference copies (read on the web, compared by nbval);
clean/NN_name.ipynb are generated from them without outputs, for learners to open and run
(`python -m ddpcourse make-clean`, the way make-labs makes labs/ from solutions/).
"""
import os
import re
import time
from pathlib import Path

from ddpcourse.paths import COURSE_ROOT, LAB_SOURCE_ENV, NOTEBOOKS, display_path

CLEAN = COURSE_ROOT / "clean"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# Cell metadata a run writes and nobody reads: per-cell timestamps (nbconvert, JupyterLab's
# "execute time" extension) and whether an output area was collapsed or scrolled.
RUN_METADATA = ("execution", "ExecuteTime", "collapsed", "scrolled")
# A relative link in markdown, ](target) or src="target"; rewritten so it resolves from clean/.
LINK = re.compile(r"(\]\(|src=[\"'])([^)\"'\s]+)")


def notebook_files(folder=NOTEBOOKS):
    return sorted(Path(folder).glob("[0-9][0-9]_*.ipynb"))


def strip_run_state(notebook):
    """Remove what a run saves besides the outputs: widget state, per-cell timing, and widget views.

    A widget view is a live display (a Predict's buttons, a run's progress bar): its saved form would be
    frozen at whatever moment the notebook was saved, so only its plain-text form is kept. Execution
    counts stay (nbval needs them). Returns the notebook, changed in place.
    """
    notebook.metadata.pop("widgets", None)
    for cell in notebook.cells:
        for key in RUN_METADATA:
            cell.metadata.pop(key, None)
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_VIEW in data and "text/plain" in data:
                del data[WIDGET_VIEW]
    return notebook


def _link_from_clean(match):
    prefix, target = match.groups()
    if re.match(r"^([a-z]+:|#|/|\.\./)", target) or re.match(r"^\d\d_\w+\.ipynb", target):
        return match.group(0)  # a URL, an anchor, an absolute path, outside notebooks/, or a sibling notebook
    return f"{prefix}../notebooks/{target}"


def clean_copy(notebook):
    """The learner's copy of an executed notebook: same cells, no outputs, no run state."""
    import nbformat

    clean = nbformat.v4.new_notebook(metadata={k: v for k, v in notebook.metadata.items() if k != "widgets"})
    for cell in notebook.cells:
        metadata = {k: v for k, v in cell.metadata.items() if k not in RUN_METADATA}
        if cell.cell_type == "code":
            copy = nbformat.v4.new_code_cell(cell.source, metadata=metadata)
        elif cell.cell_type == "markdown":
            copy = nbformat.v4.new_markdown_cell(LINK.sub(_link_from_clean, cell.source), metadata=metadata)
        else:
            copy = nbformat.v4.new_raw_cell(cell.source, metadata=metadata)
        if "id" in cell:
            copy.id = cell.id
        clean.cells.append(copy)
    clean.nbformat, clean.nbformat_minor = notebook.nbformat, notebook.nbformat_minor
    return clean


def cell_outline(notebook):
    """What the drift test compares: each cell's type and source (a learner's run and save changes neither)."""
    return [(cell.cell_type, cell.source) for cell in notebook.cells]


def clean_path(notebook_path):
    return CLEAN / Path(notebook_path).name


def make_clean(check=False, paths=None):
    """Write clean/NN_name.ipynb for each notebook (or, with check, only report the stale ones).

    A clean copy is stale when its cell types or sources differ from the generated ones, or it is
    missing; a clean/ file without its notebook is stale too. Returns the stale paths.
    """
    import nbformat

    sources = [Path(p) for p in paths] if paths else notebook_files()
    stale = []
    for source in sources:
        target = clean_path(source)
        clean = clean_copy(nbformat.read(source, as_version=4))
        current = nbformat.read(target, as_version=4) if target.exists() else None
        if current is not None and cell_outline(current) == cell_outline(clean):
            continue
        stale.append(target)
        if check:
            print(f"{display_path(target)} is {'missing' if current is None else 'stale'}: "
                  "run `python -m ddpcourse make-clean`")
        else:
            CLEAN.mkdir(exist_ok=True)
            nbformat.write(clean, target)
            print(f"wrote {display_path(target)}")
    if not paths:
        names = {p.name for p in sources}
        for orphan in notebook_files(CLEAN):
            if orphan.name not in names:
                stale.append(orphan)
                print(f"{display_path(orphan)} has no notebooks/{orphan.name}"
                      + ("" if check else ": removed"))
                if not check:
                    orphan.unlink()
    return stale


def execute(paths, timeout=600):
    """Execute notebooks in place against solutions/, save them without run state, regenerate clean copies.

    Prints the seconds each notebook took. Stops at the first notebook with an error cell (that file is
    left unchanged) and returns False; True when all ran.
    """
    import nbformat
    from nbclient.exceptions import CellExecutionError
    from nbconvert.preprocessors import ExecutePreprocessor

    os.environ[LAB_SOURCE_ENV] = "solutions"  # the committed outputs are the solutions' (the kernel inherits it)
    for path in map(Path, paths):
        notebook = nbformat.read(path, as_version=4)
        runner = ExecutePreprocessor(timeout=timeout, kernel_name="python3", record_timing=False,
                                     store_widget_state=False)
        start = time.perf_counter()
        try:
            runner.preprocess(notebook, {"metadata": {"path": str(path.parent.resolve())}})
        except CellExecutionError as error:
            print(f"{display_path(path)}: a cell failed, file left unchanged\n{error}")
            return False
        nbformat.write(strip_run_state(notebook), path)
        print(f"{display_path(path)}: executed in {time.perf_counter() - start:.0f} s")
        make_clean(paths=[path])
    return True
