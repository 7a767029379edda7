"""Fixtures of the lab-check tests.

A test that judges a wrong version of a solution declares it with ``@helpers.wrong_version(...)`` and takes
``report``: the CheckReport of that version, checked in the test itself. The launches behind it are replayed
from tests/recorded_runs/ (tests/recorded_runs.py says why and when a recording is stale); ``--record-runs``
launches them live and records them afresh. The suite runs its files in parallel with pytest-xdist
(pyproject.toml).
"""
import dataclasses

import pytest

from ddpcourse import checks
from ddpcourse.checks import check_lab
from helpers import mutant
from recorded_runs import RECORDINGS, Recording, recording, replaying


@pytest.fixture
def recorded_check(request, monkeypatch):
    """check_lab(path, nproc) judged from this test's recording (live, and recorded, with --record-runs)."""
    def judge(path, nproc=None, suffix=""):
        name = request.node.name + suffix
        found = Recording(RECORDINGS / request.node.path.stem, name, path.read_text(), path.name, nproc)
        if request.config.getoption("--record-runs"):
            monkeypatch.setattr(checks, "launch", recording(checks.launch, found.results))
            result = check_lab(path, nproc=nproc, quiet=True)
            found.save()
            return result
        results, problem = found.load()
        if problem:
            pytest.fail(problem, pytrace=False)
        if results is None:  # recorded on another kind of machine: judge a live launch here
            return check_lab(path, nproc=nproc, quiet=True)
        replay = replaying(results)
        monkeypatch.setattr(checks, "launch", replay)
        result = check_lab(path, nproc=nproc, quiet=True)
        assert not replay.pending, "the check launched less often than recorded: record afresh"
        return result
    return judge


@pytest.fixture
def recorded_run(request):
    """The launcher's run(path, nproc, args=..., **options) for a test that reads the RunResults itself: each
    call replayed from this test's recording (the n-th call, its n-th), live and recorded with --record-runs."""
    from ddpcourse.launch.launcher import run

    calls = []

    def launch(path, nproc, **options):
        calls.append(path)
        found = Recording(RECORDINGS / request.node.path.stem, f"{request.node.name}[{len(calls)}]",
                          path.read_text() + repr(options.get("args")), path.name, nproc)
        if request.config.getoption("--record-runs"):
            found.results.append(run(path, nproc=nproc, **options))
            found.save()
            return found.results[0]
        results, problem = found.load()
        if problem:
            pytest.fail(problem, pytrace=False)
        if results is None:  # recorded on another kind of machine: launch here
            return run(path, nproc=nproc, **options)
        return dataclasses.replace(results[0], file=str(path))
    return launch


@pytest.fixture
def report(request, tmp_path, recorded_check):
    """The CheckReport of this test's wrong version (see helpers.wrong_version)."""
    solution_name, edits, nproc = request.function.wrong_version
    return recorded_check(mutant(tmp_path, solution_name, *edits), nproc=nproc)
