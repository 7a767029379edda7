"""Check a lab: ``python -m ddpcourse check FILE [--nproc N]`` or ``check_lab("00")`` in a notebook.

Introduced in notebooks/00_start_here.ipynb. The lab is identified by its file name (``00_*.py``), so a
learner's copy anywhere works. Each lab has a module here, ``labNN.py``, with

    NPROCS = (1, 2, 3)                 # world sizes the check runs the lab with
    def checks(run) -> list[Check]     # run: the launcher's RunResult for one world size

optionally ``def explain_failure(run) -> str`` (what a failed run's evidence says beyond its traceback), and,
when one world size needs several differently configured runs (say, one with an injected failure),

    def runs(workdir) -> {name: dict(env=..., args=..., torchrun_args=...)}   # workdir: fresh, per world size
    def checks(runs) -> list[Check]    # runs: {name: RunResult}

The checks compare what the lab ``report``-ed with values computed here, independently of the lab, and
say what is wrong in the words of the likely mistake ("the sum, not the mean: divide by the world size").
"""
import hashlib
import importlib
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ddpcourse.launcher import DEFAULT_TIMEOUT
from ddpcourse.launcher import run as launch
from ddpcourse.paths import display_path, lab_number, resolve_lab
from ddpcourse.todos import todo_status

# A folder where passing verdicts are kept, keyed by everything they depend on (the lab file, the check,
# this package's code, the world size). The test suite sets it so that a notebook's check cell reuses the
# verdict the unit tests already computed for the same solution instead of launching it again.
CACHE_ENV = "DDPCOURSE_CHECK_CACHE"


@dataclass
class Check:
    name: str            # "nproc=N: <claim>" once check_lab has run it on N ranks
    passed: bool
    detail: str = ""
    nproc: int = None    # the world size it was judged on
    failure: object = None  # the launcher's RankFailure when the run itself failed (kind, rank, todo, message)

    @property
    def claim(self):
        """The name without its world size: what was checked."""
        prefix = f"nproc={self.nproc}: "
        return self.name[len(prefix):] if self.nproc and self.name.startswith(prefix) else self.name

    def __str__(self):
        text = f"{'PASS' if self.passed else 'FAIL'}  {self.name}"
        return text + (f"\n      {self.detail}" if self.detail else "")


@dataclass
class CheckReport:
    file: str
    results: list = field(default_factory=list)
    skipped: str = ""
    todos: list = field(default_factory=list)  # open TODO numbers: then nothing was launched
    launched: bool = False

    @property
    def passed(self):
        return bool(self.results) and all(c.passed for c in self.results) and not self.skipped

    @property
    def failures(self):
        return [c for c in self.results if not c.passed]

    @property
    def run_failure(self):
        """The launcher's RankFailure of the run that did not end well, or None (the lab ran; see failures)."""
        return next((c.failure for c in self.results if c.failure is not None), None)

    def summary(self):
        ok = sum(c.passed for c in self.results)
        text = f"{ok} checks passed, {len(self.results) - ok} failed"
        if self.skipped:
            text += f" ({self.skipped})"
        verdict = "lab passes" if self.passed else "lab does not pass yet"
        return f"{text}: {display_path(self.file)} {verdict}."

    def __repr__(self):
        return f"CheckReport({Path(self.file).name}, {'passed' if self.passed else 'failed'})"


def close(a, b, tol=1e-9):
    return isinstance(a, (int, float)) and math.isclose(a, b, rel_tol=tol, abs_tol=tol)


def check_lab(lab, nproc=None, timeout=DEFAULT_TIMEOUT, quiet=False):
    """Run the lab with each world size its check needs and print PASS/FAIL with the reasons.

    nproc: one world size instead of all. Stops at the first world size with a failure: fix it first.
    A lab with open TODOs is not run: the report lists them (``.todos``) with the next one's hint.
    Raises FileNotFoundError for a path that does not exist and ValueError for a file of no lab.
    """
    path = resolve_lab(lab)
    number = lab_number(path)
    try:
        module = importlib.import_module(f"ddpcourse.checks.lab{number}")
    except ModuleNotFoundError:
        raise ValueError(f"{path.name}: no lab check for lab {number!r}; lab files are named NN_name.py")
    report = CheckReport(str(path))
    say = (lambda text: None) if quiet else (lambda text: print(text, flush=True))
    unfinished = todo_status(path)
    if unfinished.todos:
        report.todos = unfinished.numbers
        report.results.append(Check("every TODO is done", False, unfinished.describe().splitlines()[0]))
        say(unfinished.describe())
        return report
    sizes = (nproc,) if nproc else module.NPROCS
    say(f"Checking {display_path(path)} (lab {number}) on {', '.join(map(str, sizes))} rank(s)")
    for i, size in enumerate(sizes):
        say(f"... running the lab on {size} rank(s) (timeout {timeout:g} s per run)")
        found = _cached(path, module, size)
        if found is None:
            found = _check_world_size(path, module, size, timeout)
            report.launched = True
            _remember(path, module, size, found)
        for check in found:
            say(str(check))
        report.results.extend(found)
        if not all(c.passed for c in found) and i + 1 < len(sizes):
            report.skipped = f"not run with nproc={', '.join(map(str, sizes[i + 1:]))}: fix the failures above first"
            break
    say(report.summary())
    return report


def _check_world_size(path, module, size, timeout):
    """Launch the lab (each of the check's runs) on ``size`` ranks and judge it: a list of Checks."""
    with tempfile.TemporaryDirectory(prefix="ddpcourse-check-") as workdir:
        specs = module.runs(workdir) if hasattr(module, "runs") else {"": {}}
        results = {}
        for name, spec in specs.items():
            results[name] = result = launch(path, nproc=size, timeout=timeout, show="none", **spec)
            if not result.ok:
                label = f" ({name} run)" if name else ""
                extra = module.explain_failure(result) if hasattr(module, "explain_failure") else ""
                detail = result.message + (f"\n      {extra}" if extra else "")
                return [Check(f"nproc={size}: the lab runs to the end{label}", False, detail, size, result.failure)]
        try:
            outcome = module.checks(results if hasattr(module, "runs") else results[""])
        except KeyError as missing:  # RunResult.values: a rank never reported a value the check reads
            return [Check(f"nproc={size}: the lab reports every value its check reads", False,
                          f"{missing.args[0] if missing.args else missing}: is its report(...) call still there?", size)]
        except (TypeError, ValueError, IndexError) as exc:  # a value of the wrong kind or shape
            return [Check(f"nproc={size}: the lab reports values the check can read", False,
                          f"{type(exc).__name__}: {exc}", size)]
    return [Check(f"nproc={size}: {c.name}", c.passed, "" if c.passed else c.detail, size) for c in outcome]


def _cache_file(path, module, size):
    folder = os.environ.get(CACHE_ENV)
    if not folder:
        return None
    digest = hashlib.sha256(f"{size}".encode())
    for source in [Path(path), Path(module.__file__), *sorted(Path(__file__).parent.parent.rglob("*.py"))]:
        digest.update(source.read_bytes())
    return Path(folder) / f"{Path(path).stem}-{digest.hexdigest()[:20]}.json"


def _cached(path, module, size):
    cache = _cache_file(path, module, size)
    if cache is None or not cache.exists():
        return None
    return [Check(**row) for row in json.loads(cache.read_text())]


def _remember(path, module, size, found):
    cache = _cache_file(path, module, size)
    if cache is not None and found and all(c.passed for c in found):  # only passes: a failure is rerun
        cache.write_text(json.dumps([{"name": c.name, "passed": c.passed, "detail": c.detail, "nproc": c.nproc}
                                     for c in found]))
