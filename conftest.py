"""Test-suite settings shared by the unit tests and the notebooks (nbval).

The notebooks' lab cells run solutions/ (DDPCOURSE_LAB_SOURCE=solutions, the instructors' demo mode of
docs/instructors.md), so their outputs are the committed ones. Set here, before any notebook kernel starts:
kernels inherit the environment. A learner's run uses labs/ (tests/test_learner_path.py).
"""
import os

os.environ["DDPCOURSE_LAB_SOURCE"] = "solutions"

# clean/ holds the learners' copies: no outputs to compare, and a learner's saved run must not become a test.
collect_ignore = ["clean"]


def pytest_addoption(parser):
    parser.addoption("--record-runs", action="store_true",
                     help="launch the recorded lab checks live and write tests/recorded_runs/ afresh "
                          "(tests/recorded_runs.py)")


def pytest_collection_modifyitems(items):
    """The files that launch the most first: pytest-xdist (--dist loadfile) deals whole files out in this
    order, so the long ones start at once and the quick unit tests fill the gaps at the end."""
    def weight(item):
        name = item.path.name
        if item.path.suffix == ".ipynb":
            return 0
        if name.startswith("test_lab") or name in ("test_learner_path.py", "test_checks.py"):
            return 1
        if name in ("test_launcher.py", "test_troubleshooting.py", "test_replicas.py", "test_progress.py"):
            return 2
        return 3
    items.sort(key=weight)  # stable: each file keeps its own order
