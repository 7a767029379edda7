"""Helpers for the ddpcourse notebooks and labs: this module only re-exports.

Notebook side (ddpcourse.learner.api, which owns every function a notebook cell calls): ``setup_notebook``,
``run_lab``, ``check_lab``, ``hint``, ``status``, ``doctor``, ``predict``, ``show_code``. Importing them
imports neither torch nor ipywidgets: each imports what it needs when called.
Lab side (ddpcourse.lab, imported with torch when first used): ``init_distributed``, ``compare_replicas``; and
``report`` (ddpcourse.reporting). Each helper's docstring names the notebook that introduces it.
"""
from ddpcourse.learner.api import check_lab, doctor, hint, predict, run_lab, setup_notebook, show_code, status
from ddpcourse.reporting import report

__all__ = ["setup_notebook", "run_lab", "check_lab", "hint", "status", "doctor", "predict", "show_code",
           "report", "init_distributed", "compare_replicas"]


def __getattr__(name):  # the lab side imports torch: only when a lab asks for it, never on `import ddpcourse`
    if name in ("init_distributed", "compare_replicas"):
        from ddpcourse import lab
        return getattr(lab, name)
    raise AttributeError(f"module 'ddpcourse' has no attribute {name!r}")
