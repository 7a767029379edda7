"""Recorded runs: a check judges a wrong version (or a solution) from the RunResults of an earlier launch.

Why: every launch costs 3-4 s of interpreter start-up per rank, and the suite judges about 35 fixed programs
(the wrong versions of tests/test_labNN.py, the solutions' world sizes no notebook checks). What those
launches produce depends only on what the ranks run: the program's text, its world size, the check's runs
(its launch options), the course code that runs inside the ranks, torch and Python. Those inputs are hashed
into a key; the recording keeps the key beside the RunResults. A test replays the recording through the real
check (its judge, its explanations: nothing of the check is recorded), and fails when the key no longer
matches, naming the command that records afresh, as ``make-labs --check`` fails when labs/ drift:

    python3 start.py test tests/test_lab0*.py tests/test_checks.py --record-runs

Test machinery: it lives here, never in ddpcourse/.
"""
import dataclasses
import gzip
import hashlib
import inspect
import json
import importlib.metadata
import os
import platform
import sys
from pathlib import Path

from ddpcourse import checks
from ddpcourse.checks import declared_check
from ddpcourse.launch.diagnosis import RankFailure
from ddpcourse.launch.launcher import RunResult
from ddpcourse.paths import COURSE_ROOT, lab_number

RECORDINGS = Path(__file__).parent / "recorded_runs"
NOTEBOOK_CHECKS = RECORDINGS / "notebooks"  # the notebooks' check cells: <lab file stem>-nproc<N or all>
RERECORD = "python3 start.py test tests/test_lab0*.py tests/test_checks.py notebooks --record-runs"
RECORD_ENV = "DDPCOURSE_TESTS_RECORD_RUNS"  # --record-runs, passed on to the notebooks' kernels
# The course code that runs inside a launch (the agent, each rank, what a lab imports, the checks' observer):
# an edit to any of them can change what a rank reports, so it is part of every key.
RANK_SIDE = sorted([*(COURSE_ROOT / "ddpcourse" / "launch").glob("*.py"),
                    *(COURSE_ROOT / "ddpcourse" / name for name in
                      ("__init__.py", "lab.py", "toy.py", "reporting.py", "paths.py", "authoring/todos.py",
                       "checks/write_observer.py"))])


def key(program_text, file_name, nproc):
    """The hash of everything a launch of ``program_text`` (saved as ``file_name``) on ``nproc`` ranks
    depends on: nproc None means the check's own world sizes, in its order."""
    digest = hashlib.sha256()
    declared = declared_check(lab_number(Path(file_name)))
    runs = inspect.getsource(declared.runs) if declared.runs else ""
    for part in (program_text, file_name, repr(nproc), repr(declared.nprocs), runs, importlib.metadata.version("torch"),
                 platform.python_version_tuple()[:2].__repr__(), sys.platform):
        digest.update(part.encode() + b"\0")
    for path in RANK_SIDE:
        digest.update(path.relative_to(COURSE_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _to_json(result):
    data = dataclasses.asdict(result)
    data["file"] = Path(result.file).name  # the temporary folder's name means nothing once replayed
    return data


def _from_json(data):
    int_keys = lambda mapping: {int(k): v for k, v in mapping.items()}
    data = dict(data, reports=int_keys(data["reports"]), output=int_keys(data["output"]),
                stacks=int_keys(data["stacks"]), writes=int_keys(data["writes"]))
    if data["failure"] is not None:
        data["failure"] = RankFailure(**data["failure"])
    return RunResult(**data)


class Recording:
    """The launches one test's check made, stored as tests/recorded_runs/<test file>/<test name>.json.gz
    (compressed: lab 06 reports every weight of several scenarios, 1.5 MB of JSON a launch)."""

    def __init__(self, folder, name, program_text, file_name, nproc):
        self.path = folder / f"{name}.json.gz"
        self.key = key(program_text, file_name, nproc)
        self.results = []

    def load(self):
        """The recorded RunResults, or a failure message when there is none or it is stale."""
        shown = self.path.relative_to(RECORDINGS.parent.parent)  # this checkout's (a copy's kernel may read it)
        if not self.path.exists():
            return None, f"no recording {shown}: record it with `{RERECORD}`"
        stored = json.loads(gzip.decompress(self.path.read_bytes()))
        if stored["key"] != self.key:
            return None, (f"{shown} is stale: the program, its check's runs, the "
                          f"course code the ranks run, torch or Python changed since it was recorded. Record "
                          f"afresh with `{RERECORD}`")
        return [_from_json(r) for r in stored["launches"]], ""

    def save(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # keys in the order the ranks reported them: a check lists its findings in that order
        text = json.dumps({"key": self.key, "launches": [_to_json(r) for r in self.results]}, separators=(",", ":"))
        # mtime=0: the same recording gives the same bytes, so git sees no change where nothing changed
        self.path.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))


def replaying(results):
    """A stand-in for ddpcourse.checks.launch that returns the recorded results in the order they came."""
    pending = list(results)

    def launch(path, nproc, **options):
        assert pending, "the check launched more often than the recording holds: record afresh"
        result = pending.pop(0)
        assert result.nproc == nproc, (result.nproc, nproc)
        return dataclasses.replace(result, file=str(path))
    launch.pending = pending
    return launch


def recording(real_launch, into):
    """A wrapper of the real launch that keeps each RunResult in ``into`` (record mode)."""
    def launch(path, nproc, **options):
        result = real_launch(path, nproc=nproc, **options)
        into.append(result)
        return result
    return launch


def notebook_recording(path, nproc):
    """The recording of a notebook check cell's check_lab(path, nproc)."""
    return Recording(NOTEBOOK_CHECKS, f"{Path(path).stem}-nproc{nproc or 'all'}", Path(path).read_text(),
                     Path(path).name, nproc)


def install_in_kernel():
    """In a notebook kernel of the suite (tests/kernel_startup.py): check_lab judges a program from its
    recording when one matches, live otherwise (a learner's edited lab, labs/ in the learner-path tests);
    with --record-runs it runs live and records. tests/test_notebooks.py fails when a check cell has no
    fresh recording, so that the suite never pays for those launches unnoticed."""
    from ddpcourse.paths import resolve_lab

    live = checks.check_lab

    def check_lab(lab, nproc=None, *args, **kwargs):
        found = notebook_recording(resolve_lab(lab), nproc)
        real_launch = checks.launch
        try:
            if os.environ.get(RECORD_ENV) == "1":
                checks.launch = recording(real_launch, found.results)
                report = live(lab, nproc, *args, **kwargs)
                if report.launched:
                    found.save()
                return report
            results, problem = found.load()
            if problem:
                return live(lab, nproc, *args, **kwargs)
            checks.launch = replaying(results)
            return live(lab, nproc, *args, **kwargs)
        finally:
            checks.launch = real_launch
    check_lab.__doc__ = live.__doc__
    checks.check_lab = check_lab
