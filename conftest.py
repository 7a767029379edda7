"""Test-suite settings shared by the unit tests and the notebooks (nbval).

Set before any notebook kernel starts (kernels inherit the environment): the notebooks' lab cells run
solutions/, whose outputs are the committed ones. A learner's run uses labs/.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

os.environ["DDPCOURSE_LAB_SOURCE"] = "solutions"
# Each (solution, world size) is checked once per test session: the notebooks' check cells reuse the
# passing verdicts of tests/test_checks.py (see ddpcourse.checks.CACHE_ENV).
os.environ["DDPCOURSE_CHECK_CACHE"] = tempfile.mkdtemp(prefix="ddpcourse-check-cache-")

# clean/ holds the learners' copies: no outputs to compare, and a learner's saved run must not become a test.
collect_ignore = ["clean"]

SOLUTION_CHECK = "test_solution_passes_its_check"
_background_check = []  # the check process now computing a solution's verdict (see below)
_session_over = threading.Event()
_starting = threading.Lock()  # no check starts once the session is over


def pytest_collection_modifyitems(session, config, items):
    """When the session checks every solution, a background process computes those verdicts (into the check
    cache) while the other tests run, and the tests that need them come later, where they find them.

    Why: one launch keeps about one of this machine's two cores busy (interpreters importing torch one after
    the other), so two at once take little more time than one. Every verdict is still computed in this session
    by check_lab; a test that finds no passing verdict runs the check itself and shows its failures."""
    from ddpcourse.paths import COURSE_ROOT, lab_files

    solutions = lab_files(COURSE_ROOT / "solutions")
    checks = [item for item in items if getattr(item, "originalname", "") == SOLUTION_CHECK]
    if len(checks) < len(solutions) or config.option.collectonly:  # a selection: check it in its place
        return
    items.sort(key=_phase)  # a stable sort: each phase keeps its order

    def check_every_solution():
        for solution in solutions:  # notebook order: the order the suite needs them in
            with _starting:
                if _session_over.is_set():
                    return
                process = subprocess.Popen([sys.executable, "-m", "ddpcourse", "check", str(solution)],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                _background_check[:] = [process]
            process.wait()

    threading.Thread(target=check_every_solution, name="solution-verdicts", daemon=True).start()


def _phase(item):
    """The order of a session that computes the solutions' verdicts in the background: first the tests that
    leave a core free for it (the launcher's failure modes wait on timeouts and sleeps), then the labs' wrong
    versions (checked ahead in a worker process, tests/conftest.py), then what reads the solutions' verdicts:
    the learner's path, the solution tests, the notebooks' check cells."""
    if item.path.suffix == ".ipynb":
        return 4
    if getattr(item, "originalname", "") == SOLUTION_CHECK:
        return 3
    if item.path.name == "test_learner_path.py":
        return 2
    if item.path.name.startswith("test_lab"):
        return 1
    return 0


def pytest_sessionfinish(session, exitstatus):
    with _starting:
        _session_over.set()
    for process in _background_check:  # still running only if the session stopped early (-x, Ctrl-C)
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # the launcher then ends its run's processes
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
    shutil.rmtree(os.environ["DDPCOURSE_CHECK_CACHE"], ignore_errors=True)
