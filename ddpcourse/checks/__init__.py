"""Check a lab: ``python -m ddpcourse check FILE [--nproc N]`` or ``check_lab("00")`` in a notebook.

Introduced in notebooks/00_start_here.ipynb. The lab is identified by its file name (``00_*.py``), so a
learner's copy anywhere works. Each lab's check is declared in ``labNN.py`` as

    LAB_CHECK = LabCheck(judge=checks, nprocs=(1, 2, 3))   # judge(run) -> list[Check]

and, when a lab's likely mistakes raise errors whose words do not name the mistake, a table of them
(``KnownError``: the root cause's "Type: message" pattern, what to tell the learner); when what the run
recorded must be read to explain a failure, ``explain_failure(run) -> str``; when one world size needs
several differently configured runs (say, one with an injected failure), ``runs``:

    LAB_CHECK = LabCheck(judge=checks, known_errors=(KnownError(r"^AttributeError: ...", "the bucket..."),))
    LAB_CHECK = LabCheck(judge=checks, runs=runs, explain_failure=explain_failure)
    # runs(workdir, nproc) -> {name: dict(env=..., args=..., torchrun_args=...)}; judge(runs: {name: RunResult})

The checks compare what the lab ``report``-ed with values computed here, independently of the lab, and
say what is wrong in the words of the likely mistake ("the sum, not the mean: divide by the world size").
"""
import importlib
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ddpcourse.launch.diagnosis import EXCEPTION_KIND
from ddpcourse.launch.launcher import DEFAULT_TIMEOUT
from ddpcourse.launch.launcher import run as launch
from ddpcourse.paths import display_path, find_lab
from ddpcourse.todos import todo_status

@dataclass
class Check:
    claim: str           # what was checked, e.g. "mean_loss = 1.25 on every rank"
    passed: bool
    detail: str = ""
    nproc: int = None    # the world size it was judged on (check_lab sets it)
    failure: object = None  # the launcher's RankFailure when the run itself failed (kind, rank, todo, message)

    @property
    def name(self):
        """The claim as the learner reads it, with its world size: "nproc=2: mean_loss = ..."."""
        return f"nproc={self.nproc}: {self.claim}" if self.nproc else self.claim

    def __str__(self):
        text = f"{'PASS' if self.passed else 'FAIL'}  {self.name}"
        return text + (f"\n      {self.detail}" if self.detail else "")


@dataclass(frozen=True)
class KnownError:
    """An exception a lab's likely mistake raises, and the mistake in the learner's words."""
    pattern: str       # a regular expression searched in the root cause's "Type: first line" (RankFailure.error)
    explanation: str


@dataclass(frozen=True)
class LabCheck:
    """What a lab's check declares: how it judges, on which world sizes, with which runs."""
    judge: Callable                   # judge(run) -> [Check]; judge({name: run}) when `runs` is given
    nprocs: tuple = (1, 2, 3)         # the world sizes check_lab runs it on, in this order
    runs: Callable = None             # runs(workdir, nproc) -> {name: launch options}; None: one plain run
    known_errors: tuple = ()          # KnownError, first match wins: a crash's exception → the likely mistake
    explain_failure: Callable = None  # explain_failure(run) -> str: what a failed run's recorded evidence says

    def explain(self, run):
        """What to add to a failed run's message: the first known error its root-cause exception matches,
        else explain_failure's words; "" when neither has any."""
        failure = run.failure
        if failure is not None and failure.kind == EXCEPTION_KIND:
            for known in self.known_errors:
                if re.search(known.pattern, failure.error or ""):
                    return known.explanation
        return self.explain_failure(run) if self.explain_failure else ""


def declared_check(number):
    """The LabCheck of lab ``number`` ("05"), from ddpcourse/checks/labNN.py; None if there is none."""
    try:
        return importlib.import_module(f"ddpcourse.checks.lab{number}").LAB_CHECK
    except ModuleNotFoundError:
        return None


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


# How close a lab's value must come to the check's own, by what produced it (the tolerance of agree):
EXACT = 1e-9     # exact binary fractions and copies (broadcast, all_gather): only the JSON round trip's noise
RECOMPUTED = 1e-7  # float32 values the check recomputes with the same operations: the last bits (thread count)
ROUNDING = 1e-5  # float32 arithmetic summed in another order than the check's (ranks, buckets, a float64 replay)


def changed_settings(run, expected):
    """[a failing Check] when the lab's harness reports other settings than the check expects, else []: the
    harness (ddpcourse/harness/labNN.py) is the check's experiment and must stay as given."""
    config = run.values("config")[0]
    if config == expected:
        return []
    return [Check("the lab keeps its harness settings", False,
                  f"the lab reports {config}, expected {expected}: the lab's harness (ddpcourse/harness/) must "
                  "stay as it is")]


def agree(got, expected, tol=EXACT):
    """True when ``got`` and ``expected`` (numbers, or nested lists or tensors of the same shape) agree
    elementwise within ``tol * (1 + |expected|)``: absolute near zero, relative for large values.
    tol=0.0 asks for identical values (replicas compared with each other)."""
    got, expected = (x.tolist() if hasattr(x, "tolist") else x for x in (got, expected))
    if isinstance(expected, (list, tuple)):
        return (isinstance(got, (list, tuple)) and len(got) == len(expected)
                and all(agree(g, e, tol) for g, e in zip(got, expected)))
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        return False
    return abs(got - expected) <= tol * (1 + abs(expected))


def replica_differences(replicas, names=None):
    """What differs between the replicas, from a ``compare_replicas(...).as_dict()`` report: its own
    texts ("parameter fc1.weight: 2 versions (ranks 0 vs ranks 1), max |diff| 0.5"), joined by "; ".
    names: only the tensors whose name starts with this."""
    texts = [d["text"] for d in replicas["differences"] if names is None or d["name"].startswith(names)]
    return "; ".join((replicas["structure"] if names is None else []) + texts)


def check_lab(lab, nproc=None, timeout=DEFAULT_TIMEOUT, quiet=False):
    """Run the lab with each world size its check needs and print PASS/FAIL with the reasons.

    nproc: one world size instead of all. Stops at the first world size with a failure: fix it first.
    A lab with open TODOs is not run: the report lists them (``.todos``) with the next one's hint.
    Raises FileNotFoundError for a path that does not exist and ValueError for a file of no lab.
    """
    lab = find_lab(lab)
    path, number = lab.file, lab.number
    declared = declared_check(number) if number else None
    if declared is None:
        raise ValueError(f"{path.name}: no lab check for lab {number!r}; lab files are named NN_name.py")
    report = CheckReport(str(path))
    say = (lambda text: None) if quiet else (lambda text: print(text, flush=True))
    unfinished = todo_status(lab)
    if not unfinished.done:
        report.todos = unfinished.numbers
        report.results.append(Check("every TODO is done", False, unfinished.describe().splitlines()[0]))
        say(unfinished.describe())
        return report
    sizes = (nproc,) if nproc else declared.nprocs
    say(f"Checking {display_path(path)} (lab {number}) on {', '.join(map(str, sizes))} rank(s)")
    for i, size in enumerate(sizes):
        say(f"... running the lab on {size} rank(s) (timeout {timeout:g} s per run)")
        found = _check_world_size(path, declared, size, timeout)
        report.launched = True
        for check in found:
            say(str(check))
        report.results.extend(found)
        if not all(c.passed for c in found) and i + 1 < len(sizes):
            report.skipped = f"not run with nproc={', '.join(map(str, sizes[i + 1:]))}: fix the failures above first"
            break
    say(report.summary())
    return report


def _check_world_size(path, declared, size, timeout):
    """Launch the lab (each of the check's runs) on ``size`` ranks and judge it: a list of Checks."""
    with tempfile.TemporaryDirectory(prefix="ddpcourse-check-") as workdir:
        specs = declared.runs(workdir, size) if declared.runs else {"": {}}
        results = {}
        for name, spec in specs.items():
            results[name] = result = launch(path, nproc=size, timeout=timeout, show="none", **spec)
            if not result.ok:
                label = f" ({name} run)" if name else ""
                extra = declared.explain(result)
                detail = result.message + (f"\n      {extra}" if extra else "")
                return [Check(f"the lab runs to the end{label}", False, detail, size, result.failure)]
        try:
            outcome = declared.judge(results if declared.runs else results[""])
        except KeyError as missing:  # RunResult.values: a rank never reported a value the check reads
            return [Check("the lab reports every value its check reads", False,
                          f"{missing.args[0] if missing.args else missing}: is its report(...) call still there?", size)]
        except (TypeError, ValueError, IndexError) as exc:  # a value of the wrong kind or shape
            return [Check("the lab reports values the check can read", False,
                          f"{type(exc).__name__}: {exc}", size)]
    return [Check(c.claim, c.passed, "" if c.passed else c.detail, size) for c in outcome]
