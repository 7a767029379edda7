"""Test-suite settings shared by the unit tests and the notebooks (nbval).

The notebooks' lab cells run solutions/ (DDPCOURSE_LAB_SOURCE=solutions, the instructors' demo mode of
docs/instructors.md), so their outputs are the committed ones: the suite's kernels set it themselves, in
their startup file (tests/kernel_startup.py), and the tests that resolve a lab number set it for themselves;
this pytest process does not. A learner's run uses labs/ (tests/test_learner_path.py).
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# The notebooks' check cells judge the solutions, and their other launches replay, from recorded launches
# (tests/recorded_runs.py): an IPython startup file, in an IPYTHONDIR of this test session's own, installs
# that in every kernel the suite starts.
_TESTS = Path(__file__).parent / "tests"
_IPYTHONDIR = Path(tempfile.mkdtemp(prefix="ddpcourse-tests-ipython-"))
(_IPYTHONDIR / "profile_default" / "startup").mkdir(parents=True)
(_IPYTHONDIR / "profile_default" / "startup" / "00-recorded-checks.py").write_text(
    (_TESTS / "kernel_startup.py").read_text().replace("__TESTS__", repr(str(_TESTS))))
os.environ["IPYTHONDIR"] = str(_IPYTHONDIR)

# clean/ holds the learners' copies: no outputs to compare, and a learner's saved run must not become a test.
collect_ignore = ["clean"]


def pytest_addoption(parser):
    parser.addoption("--record-runs", action="store_true",
                     help="launch live what the suite replays (the lab checks, the notebooks' launches) and write "
                          "tests/recorded_runs/ afresh; tests/record_runs.py runs every part of it")


# Outputs no CPU decides (issue 31): each notebook's kernel and ranks run under one of four settings
# (tests/kernel_settings.py), rotated at every commit (the hash of HEAD), so that each notebook meets all four
# within four commits and every run holds all four.
sys.path.insert(0, str(_TESTS))
from kernel_settings import SETTINGS  # noqa: E402

_ENV_BEFORE = {name: os.environ.get(name) for name in SETTINGS[0]}


def _rotation():
    """DDPCOURSE_TESTS_ROTATION if set (to repeat a run), else HEAD's commit hash mod 4, else 0."""
    if os.environ.get("DDPCOURSE_TESTS_ROTATION"):
        return int(os.environ["DDPCOURSE_TESTS_ROTATION"]) % len(SETTINGS)  # an integer, or conftest fails
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        return int(head, 16) % len(SETTINGS) if head else 0
    except (OSError, ValueError, subprocess.SubprocessError):
        return 0


ROTATION = _rotation()


def notebook_settings(notebook_name):
    """The ATen kernels and threads per rank the kernel of notebooks/NN_*.ipynb (and its ranks) run with."""
    number = int(notebook_name[:2]) if notebook_name[:2].isdigit() else 0
    return SETTINGS[(number + ROTATION) % len(SETTINGS)]


def pytest_report_header(config):
    from recorded_runs import replay_line

    return [f"notebook kernels: rotation {ROTATION} (DDPCOURSE_TESTS_ROTATION to repeat it); notebook NN runs with "
            f"settings (NN + {ROTATION}) mod 4 of tests/kernel_settings.py", replay_line()]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before the first cell of a notebook starts its kernel (the kernel and its ranks inherit this
    environment): that notebook's settings; the user's own for every other test."""
    chosen = notebook_settings(item.path.name) if item.path.suffix == ".ipynb" else _ENV_BEFORE
    # which notebook the kernel runs: its launches replay that notebook's recordings (tests/recorded_runs.py)
    chosen = dict(chosen, DDPCOURSE_TESTS_NOTEBOOK=item.path.stem if item.path.suffix == ".ipynb" else None)
    for name, value in chosen.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def pytest_configure(config):
    if config.getoption("--record-runs"):
        os.environ["DDPCOURSE_TESTS_RECORD_RUNS"] = "1"  # the kernels record their check cells too


def pytest_unconfigure(config):
    shutil.rmtree(_IPYTHONDIR, ignore_errors=True)


# The longest files first (their seconds on 2 cores, measured 2026-11-27 with the notebooks' launches replayed):
# pytest-xdist (--dist loadfile) deals whole files out in this order, so the long ones start at once and the
# quick unit tests fill the gaps at the end.
LONGEST_FIRST = ["test_launcher.py", "07_sharded_data_parallel.ipynb", "test_troubleshooting.py",
                 "test_learner_path.py", "05_launching_and_scaling_out.ipynb", "test_collectives.py",
                 "test_start.py", "08_debugging_distributed.ipynb", "03_change_a_wrapped_model.ipynb",
                 "test_replicas.py", "test_progress.py", "01_dataparallel_vs_ddp.ipynb", "test_docs.py",
                 "test_cheatsheet.py", "04_sync_without_backward.ipynb", "06_ddp_from_the_inside.ipynb",
                 "02_initialization_and_broadcast.ipynb", "00_start_here.ipynb"]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order
