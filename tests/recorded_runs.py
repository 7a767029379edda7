"""Recorded runs: a check judges a wrong version (or a solution) from the RunResults of an earlier launch.

Why: every launch costs 3-4 s of interpreter start-up per rank, and the suite makes about 100 fixed launches
(the wrong versions of tests/test_labNN.py, the solutions' world sizes no notebook checks, the notebooks'
check cells and their other launches, lab 08's as-given trainers). What they produce depends on the
program's text and world size, the course code a launch runs or is shaped by (the launcher, the checks' runs
and settings, what a rank imports), and the machine (torch's build, Python, the system). The first two are
hashed into a code key: when it differs, the recording is stale and its test fails, naming the command that
records afresh, as ``make-labs --check`` fails when labs/ drift. The machine is hashed apart: on another
kind of machine (a Mac, a CUDA build, another Python) the checks run live instead. A replay goes through the
real check (its judge, its explanations: nothing of the check is recorded), or, for a notebook's own launch,
the end of the launcher's run() (its view, each rank's lines, its verdict) and then the notebook's asserts:

    python3 start.py test tests/test_lab0*.py tests/test_checks.py notebooks --record-runs

A notebook's launch is recorded under each of the four settings of tests/kernel_settings.py (three extra
launches each while recording), since its kernel meets another one at every commit.

Test machinery: it lives here, never in ddpcourse/.
"""
import contextlib
import dataclasses
import gzip
import hashlib
import json
import importlib.metadata
import os
import platform
import sys
from pathlib import Path

from ddpcourse import checks
from ddpcourse.launch.collectives import CollectiveCall, HangReport
from ddpcourse.launch.diagnosis import RankFailure
from ddpcourse.launch.launcher import RunResult
from ddpcourse.paths import COURSE_ROOT
from kernel_settings import SETTINGS

RECORDINGS = Path(__file__).parent / "recorded_runs"
NOTEBOOK_CHECKS = RECORDINGS / "notebooks"  # the notebooks' check cells: <lab file stem>-nproc<N or all>
RERECORD = "python3 start.py test tests/test_lab0*.py tests/test_checks.py notebooks --record-runs"
RECORD_ENV = "DDPCOURSE_TESTS_RECORD_RUNS"  # --record-runs, passed on to the notebooks' kernels
# The course code a launch runs or is shaped by: the whole package but the learner tools and the authoring
# scripts (the agent, each rank, what a lab imports, the TODO format, the checks with their runs() and
# settings, the observer). Any edit there can change what a rank reports, so it is part of every code key.
RANK_SIDE = sorted(path for path in (COURSE_ROOT / "ddpcourse").rglob("*.py")
                   if "learner" not in path.parts and (path.parent.name != "authoring" or path.name == "__init__.py"))


def code_key(program_text, file_name, nproc):
    """The hash of the course's side of a launch of ``program_text`` (saved as ``file_name``) on ``nproc``
    ranks (None: the check's own world sizes): when it differs, the recording is stale."""
    digest = hashlib.sha256()
    for part in (program_text, file_name, repr(nproc)):
        digest.update(part.encode() + b"\0")
    for path in RANK_SIDE:
        digest.update(path.relative_to(COURSE_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def environment_key():
    """The machine's side: torch's build (its version carries +cpu, +cu128), Python, the system and the
    processor, and the settings that choose a backend. A recording made elsewhere is not stale: on another
    machine the checks run live (slower, and true there)."""
    parts = (importlib.metadata.version("torch"), ".".join(platform.python_version_tuple()[:2]), sys.platform,
             platform.machine(), os.environ.get("DDPCOURSE_BACKEND", ""))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _to_json(result):
    data = dataclasses.asdict(result)
    data["file"] = Path(result.file).name  # the temporary folder's name means nothing once replayed
    return data


def _calls(mapping):
    """{rank: CollectiveCall} back from JSON (its keys strings, its tuples lists)."""
    return {int(rank): CollectiveCall(**dict(call, sizes=tuple(tuple(size) for size in call["sizes"]),
                                             dtypes=tuple(call["dtypes"]))) for rank, call in mapping.items()}


def _hang_report(data):
    """A HangReport back from JSON (RunResult.collectives, RunResult.silent_mismatch), or None."""
    if data is None:
        return None
    before = data["lines_before"]
    return HangReport(waiting=_calls(data["waiting"]), failed_in=_calls(data["failed_in"]), outside=data["outside"],
                      outside_lines={int(r): tuple(where) for r, where in data["outside_lines"].items()},
                      disagreement=data["disagreement"], calls_at=_calls(data["calls_at"]), mismatch=data["mismatch"],
                      ended_after=_calls(data["ended_after"]),
                      call_sites={int(r): {int(line): n for line, n in sites.items()}
                                  for r, sites in data["call_sites"].items()},
                      lines_before=(before[0], _calls(before[1]), before[2]) if before else None)


def _from_json(data):
    int_keys = lambda mapping: {int(k): v for k, v in mapping.items()}
    data = dict(data, reports=int_keys(data["reports"]), output=int_keys(data["output"]),
                stacks=int_keys(data["stacks"]), writes=int_keys(data["writes"]),
                collectives=_hang_report(data.get("collectives")),
                silent_mismatch=_hang_report(data.get("silent_mismatch")))
    if data["failure"] is not None:
        data["failure"] = RankFailure(**data["failure"])
    return RunResult(**data)


class Recording:
    """The launches one test's check made, stored as tests/recorded_runs/<test file>/<test name>.json.gz
    (compressed: lab 06 reports every weight of several scenarios, 1.5 MB of JSON a launch)."""

    def __init__(self, folder, name, program_text, file_name, nproc):
        self.path = folder / f"{name}.json.gz"
        self.key = code_key(program_text, file_name, nproc)
        self.environment = environment_key()
        self.results = []
        self.call = None  # a notebook's launch (run_call): kept in the file, for tests/test_notebooks.py

    def load(self):
        """(results, problem): the recorded RunResults; (None, a failure message) when there is no recording
        or it is stale; (None, "") when it was recorded on another kind of machine (then: run live)."""
        shown = self.path.relative_to(RECORDINGS.parent.parent)  # this checkout's (a copy's kernel may read it)
        if not self.path.exists():
            return None, f"no recording {shown}: record it with `{RERECORD}`"
        stored = json.loads(gzip.decompress(self.path.read_bytes()))
        if stored["key"] != self.key:
            return None, (f"{shown} is stale: the program or the course code a launch runs changed since it was "
                          f"recorded. Record afresh with `{RERECORD}`")
        if stored["environment"] != self.environment:
            return None, ""
        return [_from_json(r) for r in stored["launches"]], ""

    def save(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # keys in the order the ranks reported them: a check lists its findings in that order
        stored = {"key": self.key, "environment": self.environment, "launches": [_to_json(r) for r in self.results]}
        if self.call is not None:
            stored["call"] = self.call
        text = json.dumps(stored, separators=(",", ":"))
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


NOTEBOOK_RUNS = NOTEBOOK_CHECKS  # the notebooks' other launches: <notebook stem>/<n>-<settings>.json.gz
NOTEBOOK_ENV = "DDPCOURSE_TESTS_NOTEBOOK"  # conftest.py tells each notebook's kernel which notebook it runs
# The kernels' settings that reach the ranks and can change what they compute (tests/kernel_settings.py): a
# launch is recorded under each of the four, so that its replay still meets every setting within four commits.
RUN_SETTINGS = ("ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS")


def settings_tag(environ=os.environ):
    """The settings a kernel runs with, as a file name's part: "default-1", "avx2-4", "native-4"."""
    return "-".join(environ.get(name) or "native" for name in RUN_SETTINGS)


def run_call(file, nproc, args, timeout, env, torchrun_args, nnodes):
    """What a notebook's launch is, as JSON; None when it must run live: an argument that names a file or a
    folder (a later cell reads what the run wrote there, or the run reads what an earlier cell wrote)."""
    file = Path(file).resolve()
    if COURSE_ROOT not in file.parents:
        return None
    for arg in args:
        if isinstance(arg, os.PathLike) or os.sep in str(arg) or Path(str(arg)).exists():
            return None
    return {"file": file.relative_to(COURSE_ROOT).as_posix(), "nproc": nproc, "args": [str(a) for a in args],
            "timeout": timeout, "env": env or {}, "torchrun_args": [str(a) for a in torchrun_args], "nnodes": nnodes}


def run_recording(notebook, number, call, tag=None):
    """The recording of the ``number``-th launch of ``notebook``'s kernel under settings ``tag`` (this kernel's
    by default). Its key holds the call, the program and every program beside it (02_all_demos.py runs its
    siblings)."""
    program = COURSE_ROOT / call["file"]
    text = "".join(path.read_text() for path in sorted(program.parent.glob("*.py")))
    found = Recording(NOTEBOOK_RUNS / notebook, f"{number}-{tag or settings_tag()}",
                      text + json.dumps(call, sort_keys=True), program.name, call["nproc"] * call["nnodes"])
    found.call = call
    return found


def _replayed_run(result, file, nproc, timeout, show, nnodes, live_view):
    """What the launcher's run() shows and returns at the end of a launch, from a recorded RunResult: its live
    view (in Jupyter: a widget whose text is one line), each rank's lines, the verdict."""
    from ddpcourse.launch.launcher import _say_verdict
    from ddpcourse.launch.printing import RunPrinter
    from ddpcourse.paths import display_path

    lab_file = Path(file).resolve()
    result = dataclasses.replace(result, file=str(lab_file))
    printer = RunPrinter(show, nproc * nnodes, display_path(lab_file), timeout, live_view=live_view)
    printer.finish(result.output)
    return _say_verdict(result, display_path(lab_file), show)


def _set_environment(values):
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@contextlib.contextmanager
def _environment(setting):
    """os.environ with ``setting`` (None: unset) while a launch starts its ranks, which inherit it."""
    before = {name: os.environ.get(name) for name in setting}
    _set_environment(setting)
    try:
        yield
    finally:
        _set_environment(before)


def _install_run_replay():
    """The notebooks' own launches (run_lab's demos, a solution's run) replayed from their recordings: the
    n-th launch of a notebook's kernel, under the kernel's settings. One that must run live (run_call) runs
    live; one without a fresh recording fails its cell, naming the command that records afresh."""
    from ddpcourse.launch import launcher

    live = launcher.run
    notebook = os.environ.get(NOTEBOOK_ENV)
    recording_runs = os.environ.get(RECORD_ENV) == "1"
    if not notebook:
        return
    if recording_runs:  # afresh: no recording survives of a launch the notebook no longer makes
        for stale in (NOTEBOOK_RUNS / notebook).glob("*.json.gz"):
            stale.unlink()
    launches = []

    def run(file, nproc=2, args=(), timeout=launcher.DEFAULT_TIMEOUT, show="all", env=None, torchrun_args=(),
            nnodes=1, observer="", observer_options=None, live_view=None):
        launches.append(file)
        call = None if observer else run_call(file, nproc, args, timeout, env, torchrun_args, nnodes)
        options = dict(nproc=nproc, args=args, timeout=timeout, show=show, env=env, torchrun_args=torchrun_args,
                       nnodes=nnodes, observer=observer, observer_options=observer_options, live_view=live_view)
        if call is None:
            return live(file, **options)
        found = run_recording(notebook, len(launches), call)
        if recording_runs:  # live, under the kernel's setting (what the cell shows), then under the three others
            found.results.append(live(file, **options))
            found.save()
            for setting in SETTINGS:
                if settings_tag(setting) != settings_tag():
                    with _environment(setting):
                        other = run_recording(notebook, len(launches), call)
                        other.results.append(live(file, **dict(options, show="none", live_view=False)))
                    other.save()
            return found.results[0]
        results, problem = found.load()
        if problem:
            raise AssertionError(f"the suite replays this launch ({call}): {problem}")
        if results is None:  # recorded on another kind of machine: launch here
            return live(file, **options)
        return _replayed_run(results[0], file, nproc, timeout, show, nnodes, live_view)
    run.__doc__ = live.__doc__
    launcher.run = run


def install_in_kernel():
    """In a notebook kernel of the suite (tests/kernel_startup.py): check_lab judges a solution from its
    recording when one matches, live otherwise (anything outside solutions/, another kind of machine);
    with --record-runs it runs live and records. tests/test_notebooks.py fails when a check cell has no
    fresh recording, so that the suite never pays for those launches unnoticed."""
    from ddpcourse.paths import resolve_lab

    live = checks.check_lab

    def check_lab(lab, nproc=None, *args, **kwargs):
        try:
            path = resolve_lab(lab)
        except (OSError, ValueError):
            path = None
        if path is None or path.parent != COURSE_ROOT / "solutions":  # a learner's lab, a typo: the real check
            return live(lab, nproc, *args, **kwargs)
        found = notebook_recording(path, nproc)
        real_launch = checks.launch
        try:
            if os.environ.get(RECORD_ENV) == "1":
                checks.launch = recording(real_launch, found.results)
                report = live(lab, nproc, *args, **kwargs)
                if report.launched:
                    found.save()
                return report
            results, _ = found.load()
            if results is None:  # stale or missing (tests/test_notebooks.py fails then), or another machine
                return live(lab, nproc, *args, **kwargs)
            checks.launch = replaying(results)
            return live(lab, nproc, *args, **kwargs)
        finally:
            checks.launch = real_launch
    check_lab.__doc__ = live.__doc__
    checks.check_lab = check_lab
    _install_run_replay()
