"""Fixtures of the lab-check tests.

A test that judges a wrong version of a solution declares it with ``@helpers.wrong_version(...)`` and takes
``report``. Every selected wrong version is checked ahead, from the moment the session is collected, in
worker processes beside the tests: a check keeps about one of this machine's two cores busy (interpreters
importing torch one after the other, ranks waiting for each other), so a check beside other work costs
little more time than the work alone. Worker processes, not threads: tests here replace parts of
ddpcourse in this process (monkeypatch), which a check running beside them must not see.
"""
import multiprocessing
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from ddpcourse.checks import check_lab
from helpers import mutant

_reports = {}  # test node id -> Future of its wrong version's CheckReport
_pool = []


def pytest_collection_modifyitems(session, config, items):
    tests = [item for item in items if hasattr(getattr(item, "function", None), "wrong_version")]
    if not tests or config.option.collectonly:
        return
    # one worker beside a session that also checks every solution in the background (conftest.py), else two
    every_solution = sum(getattr(item, "originalname", "") == "test_solution_passes_its_check" for item in items)
    workers = 1 if every_solution > 1 else 2
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    _pool.append(pool)
    folder = Path(tempfile.mkdtemp(prefix="ddpcourse-wrong-versions-"))
    for item in tests:
        solution_name, edits, nproc = item.function.wrong_version
        path = mutant(folder, solution_name, *edits, folder=item.function.__name__)
        _reports[item.nodeid] = pool.submit(check_lab, path, nproc=nproc, quiet=True)


def pytest_sessionfinish(session, exitstatus):
    for pool in _pool:  # a session stopped early: checks not started are dropped, running ones finish
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def report(request):
    """The CheckReport of this test's wrong version (see helpers.wrong_version)."""
    return _reports[request.node.nodeid].result()
