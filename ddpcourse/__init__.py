"""Helpers for the ddpcourse notebooks and labs.

Notebook side (no torch import, cheap): ``run_lab``, ``check_lab``, ``doctor``, ``predict``,
``setup_notebook`` (the first code cell of every notebook).
Lab side (imports torch when first used): ``init_distributed``, ``report``, ``compare_replicas``.
Each helper's module docstring names the notebook that introduces it.
"""
from ddpcourse.reporting import report

__all__ = ["run_lab", "check_lab", "report", "init_distributed", "compare_replicas", "doctor", "predict",
           "setup_notebook"]


def run_lab(lab, nproc=2, args=(), timeout=None, show="all", env=None, torchrun_args=(), nnodes=1):
    """Run a lab (a number such as "00", or a path) on ``nproc`` local processes. See ddpcourse.launcher.run."""
    from ddpcourse.launcher import DEFAULT_TIMEOUT, run
    from ddpcourse.paths import resolve_lab

    return run(resolve_lab(lab), nproc=nproc, args=args, timeout=timeout or DEFAULT_TIMEOUT, show=show, env=env,
               torchrun_args=torchrun_args, nnodes=nnodes)


def __getattr__(name):  # lazy: importing ddpcourse must not import torch or ipywidgets
    if name == "check_lab":
        from ddpcourse.checks import check_lab
        return check_lab
    if name in ("init_distributed", "compare_replicas"):
        from ddpcourse import lab
        return getattr(lab, name)
    if name == "doctor":
        from ddpcourse.checkup import doctor
        return doctor
    if name == "predict":
        from ddpcourse.quiz import predict
        return predict
    if name == "setup_notebook":
        from ddpcourse.notebooks import setup_notebook
        return setup_notebook
    raise AttributeError(f"module 'ddpcourse' has no attribute {name!r}")
