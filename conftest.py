"""Test-suite settings shared by the unit tests and the notebooks (nbval).

Set before any notebook kernel starts (kernels inherit the environment): the notebooks' lab cells run
solutions/, whose outputs are the committed ones. A learner's run uses labs/.
"""
import os
import shutil
import tempfile

os.environ["DDPCOURSE_LAB_SOURCE"] = "solutions"
# Each (solution, world size) is checked once per test session: the notebooks' check cells reuse the
# passing verdicts of tests/test_checks.py (see ddpcourse.checks.CACHE_ENV).
os.environ["DDPCOURSE_CHECK_CACHE"] = tempfile.mkdtemp(prefix="ddpcourse-check-cache-")

# clean/ holds the learners' copies: no outputs to compare, and a learner's saved run must not become a test.
collect_ignore = ["clean"]


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(os.environ["DDPCOURSE_CHECK_CACHE"], ignore_errors=True)
