"""Every function a notebook cell calls, in one module; ``import ddpcourse`` re-exports them.

``setup_notebook`` (every notebook's first code cell), ``run_lab``, ``check_lab``, ``hint``, ``status``,
``doctor``, ``predict`` and ``show_code``. Each imports what it needs when called: importing ddpcourse must
stay cheap and torch-free, since every rank of a launch imports it too (for ``report``), and the checks of
labs 01 and 02 and the doctor import torch to compute their expected values.
Each function's docstring names the notebook that introduces it.
"""
import os
from pathlib import Path

from ddpcourse.paths import COURSE_ROOT, NOTEBOOKS


def setup_notebook():
    """Run the notebook's cells from notebooks/, so `demos/...` paths resolve from a clean/ copy too. A kernel
    whose ddpcourse belongs to another copy of the course would run that copy's labs: it says so."""
    opened_in = Path.cwd().resolve()
    if COURSE_ROOT.resolve() not in (opened_in, *opened_in.parents):
        print(f"WARNING: this kernel's ddpcourse is the course in {COURSE_ROOT}, not the one this notebook is "
              f"in ({opened_in}): run_lab and check_lab would use that copy's labs. Start JupyterLab with "
              f"`python3 start.py` in this notebook's course folder.")
    os.chdir(NOTEBOOKS)


def run_lab(lab, nproc=2, args=(), timeout=None, show="all", env=None, torchrun_args=(), nnodes=1):
    """Run a lab (a number such as "00", or a path) on ``nproc`` local processes (notebook 00). See
    ddpcourse.launch.launcher.run.

    A lab still exactly as make-labs generated it is not launched: its TODO status is printed instead
    and the result has ``ok`` and ``launched`` False. A failed run prints its diagnosis; nothing raises
    but the stop button (a one-line error after the summary of where each rank was).
    """
    from ddpcourse.launch.api import RunResult
    from ddpcourse.launch.launcher import DEFAULT_TIMEOUT, run
    from ddpcourse.paths import find_lab
    from ddpcourse.todos import todo_status

    lab = find_lab(lab)
    path = lab.file
    todos = todo_status(lab)
    if todos.untouched:
        message = todos.describe()
        if show != "none":
            print(message, flush=True)
        return RunResult(file=str(path), nproc=nproc, returncode=1, duration=0.0, nnodes=nnodes,
                         message=message, launched=False)
    # live_view: a notebook cell that prints nothing until the run ends (show="none") still shows its clock
    # and each rank's state while it runs; checks launch without it and print their own progress lines.
    return run(path, nproc=nproc, args=args, timeout=timeout or DEFAULT_TIMEOUT, show=show, env=env,
               torchrun_args=torchrun_args, nnodes=nnodes, live_view=True)


def check_lab(lab, nproc=None, timeout=None, quiet=False):
    """Run the lab on each world size its check needs and print PASS/FAIL with the reasons (notebook 00).
    See ddpcourse.checks.check_lab."""
    from ddpcourse import checks
    from ddpcourse.launch.launcher import DEFAULT_TIMEOUT

    return checks.check_lab(lab, nproc, timeout or DEFAULT_TIMEOUT, quiet)


def hint(lab, todo=None):
    """Show the next hint level of the lab's next open TODO, or of TODO ``todo`` (notebook 00). See
    ddpcourse.learner.hints."""
    from ddpcourse.learner.hints import reveal_hint

    print(reveal_hint(lab, todo))


def status(labs=None):
    """Print the table of every lab in ``labs`` (default: the course's labs/) and return it (notebook 00).
    See ddpcourse.learner.progress."""
    from ddpcourse.learner import progress

    return progress.status(labs)


def doctor(launch=True):
    """Check this machine for the course, print the table, return the report (notebook 00). See
    ddpcourse.learner.doctor."""
    from ddpcourse.learner import doctor as checkup

    return checkup.doctor(launch)


def predict(qid, question, options):
    """A multiple-choice Predict; its answer and why appear once the learner picks (notebook 00). See
    ddpcourse.learner.quiz."""
    from ddpcourse.learner.quiz import Prediction

    return Prediction(qid, question, options)


def show_code(path, name):
    """Print the top-level function or class ``name`` of a demo or lab file, as that file has it: the code the
    next run executes, read from the one source that runs, never a copy pasted into the notebook (notebook 03)."""
    import ast

    source = Path(path).read_text()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            first = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)])
            print("\n".join(source.splitlines()[first - 1:node.end_lineno]))
            return
    raise ValueError(f"no top-level function or class {name!r} in {path}")
