"""Fixtures of the lab-check tests.

A test that judges a wrong version of a solution declares it with ``@helpers.wrong_version(...)`` and takes
``report``. Every selected wrong version is checked ahead, from the moment the session is collected, in
worker processes beside the tests: a check keeps about one of this machine's two cores busy (interpreters
importing torch one after the other, ranks waiting for each other), so a check beside other work costs
little more time than the work alone. Worker processes, not threads: tests here replace parts of
ddpcourse in this process (monkeypatch), which a check running beside them must not see.
"""
import multiprocessing
import shutil
import tempfile
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import pytest

from ddpcourse.checks import check_lab
from ddpcourse.paths import COURSE_ROOT, lab_files
from helpers import mutant

_reports = {}  # test node id -> Future of its wrong version's CheckReport
_pools, _folders = [], []


def pytest_collection_modifyitems(session, config, items):
    tests = [item for item in items if hasattr(getattr(item, "function", None), "wrong_version")]
    if not tests or config.option.collectonly:
        return
    # one worker beside a session that checks every solution in the background (the rule of ../conftest.py)
    solution_tests = sum(getattr(item, "originalname", "") == "test_solution_passes_its_check" for item in items)
    workers = 1 if solution_tests >= len(lab_files(COURSE_ROOT / "solutions")) else 2
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    folder = Path(tempfile.mkdtemp(prefix="ddpcourse-wrong-versions-"))
    _pools.append(pool)
    _folders.append(folder)
    for item in tests:
        solution_name, edits, nproc = item.function.wrong_version
        try:
            path = mutant(folder, solution_name, *edits, folder=item.function.__name__)
        except AssertionError as stale:  # the solution changed under the edit: that test fails, not the session
            _reports[item.nodeid] = Future()
            _reports[item.nodeid].set_exception(stale)
            continue
        _reports[item.nodeid] = pool.submit(check_lab, path, nproc=nproc, quiet=True)


def pytest_sessionfinish(session, exitstatus):
    for pool in _pools:  # a session stopped early: checks not started are dropped, running ones finish
        pool.shutdown(wait=True, cancel_futures=True)
    for folder in _folders:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def report(request):
    """The CheckReport of this test's wrong version (see helpers.wrong_version)."""
    return _reports[request.node.nodeid].result()
