"""Fixtures of the lab-check tests.

A test that judges a wrong version of a solution declares it with ``@helpers.wrong_version(...)`` and takes
``report``. The wrong versions of a module are checked ahead, two at a time, as soon as its first test
starts: a check keeps about one of this machine's two cores busy (interpreters importing torch one after
the other, ranks waiting for each other), so two at once take little more time than one.
"""
from concurrent.futures import ThreadPoolExecutor

import pytest

from ddpcourse.checks import check_lab
from helpers import mutant

CHECKS_AT_ONCE = 2


@pytest.fixture(scope="module")
def wrong_version_reports(request, tmp_path_factory):
    """{test name: Future of its CheckReport} for every selected test of the module with a wrong version."""
    selected = {item.function for item in request.session.items if getattr(item, "module", None) is request.module}
    tests = [test for test in selected if hasattr(test, "wrong_version")]
    folder = tmp_path_factory.mktemp("wrong-versions")
    with ThreadPoolExecutor(CHECKS_AT_ONCE) as pool:
        futures = {}
        for test in sorted(tests, key=lambda t: t.__code__.co_firstlineno):  # in the module's order
            solution_name, edits, nproc = test.wrong_version
            path = mutant(folder, solution_name, *edits, folder=test.__name__)
            futures[test.__name__] = pool.submit(check_lab, path, nproc=nproc, quiet=True)
        yield futures


@pytest.fixture
def report(request, wrong_version_reports):
    """The CheckReport of this test's wrong version (see helpers.wrong_version)."""
    return wrong_version_reports[request.function.__name__].result()
