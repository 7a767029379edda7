"""The TODO and HINT format of the labs, in one place: this module writes a lab's text (``make_lab``; the
``make-labs`` command only writes the files), parses the solutions' regions, counts a lab's open TODOs and
decides whether a lab is untouched (exactly as generated), has open TODOs, or is done (``TodoStatus``).
The worker, ``check``, ``run_lab``, ``status``, ``reset`` and ``hint`` ask it; none of them parses the format.
It sits at the package's floor, beside ddpcourse.paths: the runtime (a rank naming a TODO, the checks) and the
authoring tools (make-labs) both read it, and it reads neither.

Introduced in notebooks/00_start_here.ipynb ("How the labs are made"). In ``solutions/NN_name.py`` a region

    ### BEGIN SOLUTION
    ### HINT 1: the idea (may repeat: the lines are joined)
    ### HINT 2: the calls to use
    ...the answer...
    ### END SOLUTION

becomes, in ``labs/NN_name.py``, at the same indentation,

    # TODO k: <hint 1>
    raise NotImplementedError('TODO k: <hint 1>')

Hint level 3 is generated: where in ``solutions/`` the answer is (file, function, lines).
``python -m ddpcourse hint NN [k]`` and ``hint("NN")`` (ddpcourse.learner.hints) reveal one more level of the
next open TODO (or of TODO k); this module remembers it in ``.hint-levels.json`` beside the lab (git ignores it).
"""
import ast
import json
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from ddpcourse.paths import Lab, lab_number, lab_of_file

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
HINT = re.compile(r"^### HINT(?: (\d))?:\s*(.*)$")  # "### HINT:" (no level) counts as level 1
LEVELS = 3  # 1: the idea, 2: the calls, 3: where in solutions/ to look
DEFAULT_HINT = "complete this step"
STATE_FILE = ".hint-levels.json"
COMMENT_WIDTH = 100
_RAISE = re.compile(r"^\s*raise\s+NotImplementedError\((.*)\)\s*(?:#.*)?$")
_MESSAGE = re.compile(r"^TODO (\d+)\b:?\s*(.*)$", re.S)


class MarkerError(ValueError):
    """A solution file whose BEGIN/END/HINT markers do not make a lab."""


@dataclass
class Region:
    """One ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region of a solution file: TODO ``number``."""
    number: int
    indent: str
    first_line: int      # the BEGIN line (1-based)
    last_line: int = 0   # the END line
    code_lines: list = field(default_factory=list)  # the answer's lines (neither markers nor hints)
    function: str = ""   # the enclosing def, if any
    hints: dict = field(default_factory=dict)  # level -> text

    def hint(self, level, solution_name):
        """The hint at ``level`` (1..LEVELS); level 3 says where in solutions/ the answer is."""
        if level >= LEVELS:
            where = f" in {self.function}()" if self.function else ""
            lines = (f"lines {self.code_lines[0]}-{self.code_lines[-1]}" if self.code_lines
                     else f"after line {self.first_line}")
            return f"solutions/{solution_name}{where}, {lines}: read only that part, close it, then write it yourself"
        for candidate in range(level, 0, -1):  # a missing level 2 repeats level 1
            if candidate in self.hints:
                return self.hints[candidate]
        return DEFAULT_HINT


def todo_lines(number, hint, indent=""):
    """What a region becomes in the lab: a comment a learner reads (wrapped) and the raise that stops the
    run there, whose message the worker reads back with todo_in_message."""
    message = f"TODO {number}: {hint}"
    head = f"{indent}# TODO {number}: "
    comment = textwrap.wrap(hint, width=max(40, COMMENT_WIDTH - len(head)))
    lines = [head + comment[0]] + [f"{indent}#{' ' * (len(head) - len(indent) - 1)}{more}" for more in comment[1:]]
    return "\n".join(lines) + f"\n{indent}raise NotImplementedError({message!r})\n"


def parse_regions(source, name="solution"):
    """(regions, lines outside them) of a solution's text; raises MarkerError for broken markers."""
    regions, outside, current, function = [], [], None, ""
    for lineno, line in enumerate(source.splitlines(keepends=True), start=1):
        stripped = line.strip()
        if stripped.startswith(BEGIN):
            if current is not None:
                raise MarkerError(f"{name}:{lineno}: {BEGIN} inside another solution region")
            indent = line[: len(line) - len(line.lstrip())]
            current = Region(len(regions) + 1, indent, lineno, function=function)
        elif stripped.startswith(END):
            if current is None:
                raise MarkerError(f"{name}:{lineno}: {END} without {BEGIN}")
            current.last_line = lineno
            regions.append(current)
            outside.append(current)  # where the TODO goes
            current = None
        elif current is not None:
            match = HINT.match(stripped)
            if match:
                level = int(match.group(1) or 1)
                if not 1 <= level < LEVELS:
                    raise MarkerError(f"{name}:{lineno}: hint level {level}: write levels 1 and 2 "
                                      f"(level {LEVELS}, where to look, is generated)")
                text = match.group(2).strip()
                current.hints[level] = f"{current.hints[level]} {text}" if level in current.hints else text
            elif stripped:
                current.code_lines.append(lineno)
        else:
            found = re.match(r"^\s*(?:async\s+)?def\s+(\w+)", line)
            if found:
                function = found.group(1)
            outside.append(line)
    if current is not None:
        raise MarkerError(f"{name}:{current.first_line}: {BEGIN} is never closed")
    return regions, outside


# ----------------------------------------------------------------------------- writing a lab
BANNER = """\
# =====================================================================================================
# Lab {number}, learner copy: replace each TODO's raise line with your code, then check your work with
#     python -m ddpcourse check labs/{name}
# Stuck on a TODO? `python -m ddpcourse hint {number}` shows the next hint, one level at a time.
# Generated from solutions/{name} by `python -m ddpcourse make-labs`; course authors edit that file.
# =====================================================================================================
"""


def make_lab(source, name):
    """The learner text for one solution file's text: the banner, then every region as its TODO (hint 1)."""
    regions, pieces = parse_regions(source, name)
    if not regions:
        raise MarkerError(f"{name}: no {BEGIN} region, so the lab would have nothing to do")
    body = "".join(todo_lines(p.number, p.hint(1, name), p.indent) if isinstance(p, Region) else p
                   for p in pieces)
    return BANNER.format(number=lab_number(name) or "?", name=name) + body


def generated_text(solution):
    """The learner text of the solution file ``solution``: what make-labs writes and reset restores."""
    solution = Path(solution)
    return make_lab(solution.read_text(encoding="utf-8"), solution.name)


# ----------------------------------------------------------------------------- reading a learner's lab
def todo_in_message(message):
    """(k, hint) when ``message`` (a NotImplementedError's text) is an unfinished TODO k, else None.

    The worker uses it to tell an open TODO from any other exception."""
    match = _MESSAGE.match(str(message).strip())
    return (int(match.group(1)), match.group(2).strip()) if match else None


def open_todos(text):
    """[(k, hint), ...] for every ``raise NotImplementedError('TODO k: hint')`` line still in ``text``
    (comments do not count; either quote style, escapes included)."""
    found = []
    for line in text.splitlines():
        match = _RAISE.match(line)
        if not match:
            continue
        try:
            message = ast.literal_eval(match.group(1).strip())
        except (ValueError, SyntaxError):
            continue
        todo = todo_in_message(message) if isinstance(message, str) else None
        if todo:
            found.append(todo)
    return found


def todo_line(text, number):
    """The line number of TODO ``number``'s raise in ``text`` (None if it is done)."""
    for lineno, line in enumerate(text.splitlines(), start=1):
        if [k for k, _ in open_todos(line)] == [number]:
            return lineno
    return None


# ----------------------------------------------------------------------------- hint levels
def _state_path(lab_path):
    return Path(lab_path).parent / STATE_FILE


def _read_state(lab_path):
    try:
        return json.loads(_state_path(lab_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def revealed_level(lab_path, number):
    """How many hint levels of TODO ``number`` the learner has seen (1: the TODO comment itself)."""
    lab_path = Path(lab_path)
    level = _read_state(lab_path).get(lab_path.name, {}).get(str(number), 1)
    return level if isinstance(level, int) and 1 <= level <= LEVELS else 1


def remember_level(lab_path, number, level):
    lab_path = Path(lab_path)
    state = _read_state(lab_path)
    state.setdefault(lab_path.name, {})[str(number)] = level
    try:
        _state_path(lab_path).write_text(json.dumps(state, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    except OSError:
        pass  # a read-only folder: the hint is still shown, only not remembered


def forget_levels(lab_path):
    """A reset lab starts its hints again from the TODO comment."""
    lab_path = Path(lab_path)
    state = _read_state(lab_path)
    if state.pop(lab_path.name, None) is not None:
        try:
            _state_path(lab_path).write_text(json.dumps(state, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        except OSError:
            pass


def solution_regions(solution):
    """The regions of a solution file, by TODO number."""
    solution = Path(solution)
    regions, _ = parse_regions(solution.read_text(encoding="utf-8"), solution.name)
    return {region.number: region for region in regions}


def current_hint(lab_path, solution, number):
    """TODO ``number``'s hint at the level the learner has revealed so far."""
    region = solution_regions(solution).get(number)
    if region is None:
        return DEFAULT_HINT
    return region.hint(revealed_level(lab_path, number), Path(solution).name)


# ----------------------------------------------------------------------------- a lab's TODO status
@dataclass
class TodoStatus:
    """What a learner's lab file still has to do, read from the file (nothing is launched).

    The one place that decides a lab's stage: ``untouched`` (exactly as generated: run_lab does not launch
    it, status says "not started"), open TODOs (``todos``: check does not launch it), or ``done`` (every
    TODO replaced: only the lab's check can judge it)."""
    lab: Lab
    todos: list = field(default_factory=list)  # [(k, hint at the level revealed so far, line)]
    generated: bool = False                     # the text equals what make-labs writes (line endings aside)

    @property
    def path(self):
        return self.lab.file

    @property
    def numbers(self):
        return [k for k, _, _ in self.todos]

    @property
    def untouched(self):
        """Exactly as make-labs generated it, so every TODO is open (a generated lab has at least one)."""
        return self.generated and bool(self.todos)

    @property
    def done(self):
        """No open TODO left (whether the code is right is the check's question)."""
        return not self.todos

    def describe(self):
        """Which TODOs are open and the next one's hint: what check_lab and run_lab print instead of running."""
        shown, number = self.lab.shown, self.lab.number
        state = "is not started yet" if self.untouched else "has open TODOs"
        plural = "s" if len(self.todos) > 1 else ""
        k, hint, line = self.todos[0]
        # a learner who wrote the code above the raise line left it open: say what closes a TODO
        closes = "" if self.untouched else (" (a TODO stays open while its raise NotImplementedError line is "
                                            "there: replace that line with your code)")
        return (f"{shown} {state} (TODO{plural} {', '.join(map(str, self.numbers))}), so nothing was run{closes}.\n"
                f"Next: TODO {k}{f' (line {line})' if line else ''}: {hint}\n"
                f'More help, one level at a time: hint("{number}") in a notebook, '
                f"or python -m ddpcourse hint {number}")


def todo_status(lab):
    """The TodoStatus of a Lab (or of the lab file at a path: its TODOs are counted even for no course lab)."""
    lab = lab if isinstance(lab, Lab) else lab_of_file(lab)
    path, solution = lab.file, lab.solution
    text = path.read_text(encoding="utf-8", errors="replace")
    status = TodoStatus(lab)
    for k, hint in open_todos(text):
        if solution is not None:
            hint = current_hint(path, solution, k)
        status.todos.append((k, hint, todo_line(text, k)))
    if solution is not None:
        try:
            expected = generated_text(solution)
        except MarkerError:
            expected = None
        status.generated = expected is not None and same_text(text, expected)
    return status


def same_text(a, b):
    """Equal but for line endings (an editor on Windows may have rewritten them)."""
    return a.replace("\r\n", "\n") == b.replace("\r\n", "\n")
