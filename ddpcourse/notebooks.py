"""The notebooks as files: where their cells run from, their clean learner copies, re-executing them.

``setup_notebook()`` is the first code cell of every notebook (notebooks/ and clean/ alike).
"""
import os

from ddpcourse.paths import COURSE_ROOT

NOTEBOOKS = COURSE_ROOT / "notebooks"


def setup_notebook():
    """Run the notebook's cells from notebooks/, so `demos/...` paths resolve from a clean/ copy too."""
    os.chdir(NOTEBOOKS)
