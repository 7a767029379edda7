"""Learner progress: ``python -m ddpcourse status`` (one table of every lab) and
``python -m ddpcourse reset NN`` (a lab back to its generated state, the learner's version kept).

Introduced in notebooks/00_start_here.ipynb (end of section 5) and in README.md ("Workshops and
self-study"). In a notebook: ``from ddpcourse import status; status()`` (ddpcourse.learner.api).

``status`` looks at the learner's ``labs/`` and, for each lab, says one of

- ``not started``: the file is still exactly what ``make-labs`` generated (nothing is launched);
- ``TODOs open``: some ``raise NotImplementedError("TODO k ...")`` lines are still there (found by
  reading the file, nothing is launched), with their numbers and the next one's hint at the level the
  learner has revealed (``python -m ddpcourse hint NN``);
- ``does not compile``: a syntax error (its line), plus the TODOs still open;
- ``check fails`` / ``passes``: every TODO is done, so the lab's check runs, once, on 2 ranks
  (a launch costs seconds; ``python -m ddpcourse check FILE`` is the full verdict, on every world size);
- ``missing``: there is no such file (``reset`` brings it back).

``reset`` saves the learner's file as ``labs/NN_name.saved-YYYYmmdd-HHMMSS.py`` (git ignores these)
before it writes the generated text, so nothing the learner wrote is lost.
"""
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ddpcourse.launch.launcher import DEFAULT_TIMEOUT
from ddpcourse.paths import COURSE_ROOT, Lab, compile_error, display_path, lab_files, lab_number, lab_spelling
from ddpcourse.todos import forget_levels, generated_text, open_todos, same_text, todo_status

STATUS_NPROC = 2  # one world size: a launch per lab costs seconds; `check` runs them all
NOT_STARTED, TODOS_OPEN, NO_COMPILE, CHECK_FAILS, PASSES, MISSING = (
    "not started", "TODOs open", "does not compile", "check fails", "passes", "missing")


class UnknownLab(ValueError):
    """``reset`` was given something that is not one of the course's labs."""


@dataclass
class LabStatus:
    number: str
    name: str          # file name, e.g. 00_first_collectives.py
    path: Path
    state: str
    detail: str = ""
    todos: list = field(default_factory=list)   # numbers of the TODOs still open
    failed_checks: list = field(default_factory=list)


@dataclass
class StatusReport:
    labs_dir: Path
    rows: list = field(default_factory=list)
    nproc: int = STATUS_NPROC

    def row(self, number):
        return next(row for row in self.rows if row.number == str(number))

    @property
    def passed(self):
        return [row.number for row in self.rows if row.state == PASSES]

    def __repr__(self):
        return f"StatusReport({len(self.passed)} of {len(self.rows)} labs pass)"


def solution_files(solutions_dir=None):
    """{"00": Path("solutions/00_first_collectives.py"), ...}: the course's labs, by number."""
    folder = Path(solutions_dir or COURSE_ROOT / "solutions")
    return {lab_number(path): path for path in lab_files(folder)}


def _todo_list(numbers):
    return ", ".join(map(str, numbers))


def lab_status(path, solution, nproc=STATUS_NPROC, timeout=DEFAULT_TIMEOUT, say=print):
    """The LabStatus of the learner file ``path`` whose source is ``solution``. Launches only when the
    file compiles and has no open TODO."""
    path, solution = Path(path), Path(solution)
    lab = Lab(lab_number(solution), path, solution)
    row = LabStatus(lab.number, solution.name, path, MISSING)
    if not path.exists():
        row.detail = f"no {display_path(path)}: `python -m ddpcourse reset {row.number}` brings it back"
        return row
    todos = todo_status(lab)
    row.todos = todos.numbers
    if todos.untouched:
        row.state, row.detail = NOT_STARTED, f"{len(row.todos)} TODOs: start with TODO {row.todos[0]}"
        return row
    syntax = compile_error(path)
    if syntax:
        row.state = NO_COMPILE
        where = f"line {syntax.lineno}: {syntax.msg}" if isinstance(syntax, SyntaxError) else str(syntax)
        row.detail = where + (f"; TODOs still open: {_todo_list(row.todos)}" if row.todos else "")
        return row
    if not todos.done:
        first, hint, _ = todos.todos[0]
        row.state = TODOS_OPEN
        row.detail = f"open: TODO {_todo_list(row.todos)}; next: TODO {first}: {hint}"
        return row
    from ddpcourse.checks import check_lab

    say(f"... checking {display_path(path)} on {nproc} ranks (at most {timeout:g} s per run)")
    report = check_lab(lab, nproc=nproc, timeout=timeout, quiet=True)
    if report.passed:
        row.state, row.detail = PASSES, f"all {len(report.results)} checks pass on {nproc} ranks"
        return row
    row.state = CHECK_FAILS
    row.failed_checks = [c.claim for c in report.failures]
    failure = report.run_failure
    if failure is not None:  # the launcher's structured verdict says it all
        row.detail = "the lab does not run to the end: " + failure.message
    else:
        first = next((line.strip() for line in report.failures[0].detail.splitlines() if line.strip()), "")
        row.detail = "failed: " + "; ".join(row.failed_checks) + (f" ({first})" if first else "")
    return row


def collect_status(labs=None, solutions=None, nproc=STATUS_NPROC, timeout=DEFAULT_TIMEOUT, say=print):
    labs_dir = Path(labs or COURSE_ROOT / "labs")
    report = StatusReport(labs_dir, nproc=nproc)
    for number, solution in solution_files(solutions).items():
        report.rows.append(lab_status(labs_dir / solution.name, solution, nproc, timeout, say))
    return report


def format_status(report, width=160):
    folder = display_path(report.labs_dir)
    name_width = max([len(row.name) for row in report.rows] + [3])
    state_width = max(len(state) for state in (NOT_STARTED, TODOS_OPEN, NO_COMPILE, CHECK_FAILS, PASSES, MISSING))
    lines = [f"Labs in {folder}/ (labs whose TODOs are all done were checked on {report.nproc} ranks):",
             f"{'lab':<{name_width}}  {'state':<{state_width}}  details"]
    room = max(20, width - name_width - state_width - 4)
    for row in report.rows:
        detail = row.detail if len(row.detail) <= room else row.detail[:room - 3] + "..."
        lines.append(f"{row.name:<{name_width}}  {row.state:<{state_width}}  {detail}".rstrip())
    lines.append(f"{len(report.passed)} of {len(report.rows)} labs pass. The full verdict, on every world size: "
                 f"python -m ddpcourse check {folder}/NN_name.py")
    return "\n".join(lines)


def status(labs=None, solutions=None, nproc=STATUS_NPROC, timeout=DEFAULT_TIMEOUT):
    """Print the table of every lab in ``labs`` (default: the course's labs/); return the StatusReport."""
    report = collect_status(labs, solutions, nproc, timeout, say=lambda text: print(text, flush=True))
    print(format_status(report), flush=True)
    return report


def room_line(labs=None, solutions=None):
    """One line for a room's shared document, nothing launched: ``ddpcourse 00:edited 01:todo2 02:new ...``.

    new: as generated; todoK,K: open TODOs; syntax: does not compile; edited: every TODO done (whether it
    passes is the check's to say: ``status`` runs it); missing: no file."""
    labs_dir = Path(labs or COURSE_ROOT / "labs")
    cells = []
    for number, solution in solution_files(solutions).items():
        path = labs_dir / solution.name
        if not path.exists():
            state = "missing"
        else:
            todos = todo_status(Lab(number, path, solution))
            if todos.untouched:
                state = "new"
            elif compile_error(path):
                state = "syntax"
            elif not todos.done:
                state = "todo" + ",".join(map(str, todos.numbers))
            else:
                state = "edited"
        cells.append(f"{number}:{state}")
    return " ".join(["ddpcourse", *cells])


# ----------------------------------------------------------------------------- reset
@dataclass
class ResetResult:
    path: Path
    saved: Path = None   # where the learner's version went (None: nothing to save)
    changed: bool = True
    message: str = ""


def _which_lab(lab, solutions):
    names = ", ".join(solutions) or "none"
    spelled = lab_spelling(lab)  # the spellings `check` and `hint` accept (paths.resolve_lab)
    if spelled is None:
        raise UnknownLab(f"{lab!r} is not a lab number; the labs are {names} (e.g. `python -m ddpcourse reset 00`)")
    number, name = spelled
    if number not in solutions:
        raise UnknownLab(f"there is no lab {number}; the labs are {names}")
    solution = solutions[number]
    if name is not None and name != solution.stem:
        raise UnknownLab(f"lab {number} is {solution.stem}, not {name}; "
                         f"the labs are {names}")
    return solution


def reset(lab, labs=None, solutions=None, now=None):
    """Restore ``labs/NN_name.py`` to its generated state; the learner's version is first saved beside it
    as ``NN_name.saved-YYYYmmdd-HHMMSS.py``. Raises UnknownLab for anything but a course lab."""
    known = solution_files(solutions)
    solution = _which_lab(lab, known)
    labs_dir = Path(labs or COURSE_ROOT / "labs")
    target = labs_dir / solution.name
    text = generated_text(solution)
    result = ResetResult(target)
    shown = display_path(target)
    if target.exists():
        mine = target.read_text(encoding="utf-8", errors="replace")
        if same_text(mine, text):
            result.changed = False
            result.message = f"{shown} is already in its generated state: nothing saved, nothing changed."
            return result
        stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
        saved = labs_dir / f"{solution.stem}.saved-{stamp}.py"
        extra = 2
        while saved.exists():  # two resets in one second: never overwrite a saved version
            saved = labs_dir / f"{solution.stem}.saved-{stamp}-{extra}.py"
            extra += 1
        saved.write_bytes(target.read_bytes())
        result.saved = saved
    labs_dir.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    forget_levels(target)
    todos = len(open_todos(text))
    kept = f"your version is saved as {display_path(result.saved)}; " if result.saved else "there was no file to save; "
    result.message = f"{kept}{shown} is back to its generated state ({todos} TODOs open)."
    return result


def main_reset(lab, labs=None, out=None, err=None):
    """The CLI's ``reset``: 0 when done, 2 for an unknown lab (with the list of labs)."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        result = reset(lab, labs)
    except UnknownLab as exc:
        print(f"reset: {exc}", file=err)
        return 2
    print(result.message, file=out)
    return 0
