"""Helpers for the ddpcourse notebooks and labs.

Notebook side: ``run_lab``, ``check_lab``, ``hint``, ``doctor``, ``predict``, ``setup_notebook`` (the
first code cell of every notebook), ``show_code`` (a demo's function or class, printed before its run).
Importing ddpcourse and ``run_lab`` never import torch (every rank of a launch already pays for that); the
checks of labs 01 and 02 and the doctor do, to compute their expected values.
Lab side (imports torch when first used): ``init_distributed``, ``report``, ``compare_replicas``.
Each helper's module docstring names the notebook that introduces it.
"""
from ddpcourse.reporting import report

__all__ = ["run_lab", "check_lab", "hint", "report", "init_distributed", "compare_replicas", "doctor", "predict",
           "setup_notebook", "show_code"]


def run_lab(lab, nproc=2, args=(), timeout=None, show="all", env=None, torchrun_args=(), nnodes=1):
    """Run a lab (a number such as "00", or a path) on ``nproc`` local processes. See ddpcourse.launch.launcher.run.

    A lab still exactly as make-labs generated it is not launched: its TODO status is printed instead
    and the result has ``ok`` and ``launched`` False. A failed run prints its diagnosis; nothing raises.
    """
    from ddpcourse.launch.launcher import DEFAULT_TIMEOUT, RunResult, run
    from ddpcourse.paths import resolve_lab
    from ddpcourse.todos import todo_status

    path = resolve_lab(lab)
    todos = todo_status(path)
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


def hint(lab, todo=None):
    """Show the next hint level of the lab's next open TODO (or of TODO ``todo``). See ddpcourse.learner.hints."""
    from ddpcourse.learner.hints import reveal_hint

    print(reveal_hint(lab, todo))


def __getattr__(name):  # lazy: importing ddpcourse must not import torch or ipywidgets
    if name == "check_lab":
        from ddpcourse.checks import check_lab
        return check_lab
    if name in ("init_distributed", "compare_replicas"):
        from ddpcourse import lab
        return getattr(lab, name)
    if name == "doctor":  # the module, callable: doctor() runs it
        import importlib
        return importlib.import_module("ddpcourse.learner.doctor")
    if name == "predict":
        from ddpcourse.learner.quiz import predict
        return predict
    if name in ("setup_notebook", "show_code"):
        from ddpcourse.authoring import notebooks
        return getattr(notebooks, name)
    raise AttributeError(f"module 'ddpcourse' has no attribute {name!r}")
