"""Fixtures of the lab-check tests.

A test that judges a wrong version of a solution declares it with ``@helpers.wrong_version(...)`` and takes
``report``: the CheckReport of that version, checked in the test itself. The suite runs its files in
parallel with pytest-xdist (pyproject.toml), which is where its speed comes from.
"""
import pytest

from ddpcourse.checks import check_lab
from helpers import mutant


@pytest.fixture
def report(request, tmp_path):
    """The CheckReport of this test's wrong version (see helpers.wrong_version)."""
    solution_name, edits, nproc = request.function.wrong_version
    return check_lab(mutant(tmp_path, solution_name, *edits), nproc=nproc, quiet=True)
