"""Generate the learner labs from the solutions: ``python -m ddpcourse make-labs [--check]``.

Introduced in notebooks/00_start_here.ipynb ("How the labs are made"). ``solutions/NN_name.py`` is the
only source: each ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region becomes a numbered TODO whose
comment shows hint level 1 (the format is ddpcourse.todos'), under a banner. ``--check`` changes nothing
and exits 1 when labs/ is stale, so a test catches a solution edited without regenerating.
"""
import sys
from pathlib import Path

from ddpcourse.paths import COURSE_ROOT, lab_files, lab_number
from ddpcourse.todos import BEGIN, END, MarkerError, Region, parse_regions, todo_lines

__all__ = ["BEGIN", "END", "MarkerError", "make_lab", "make_labs", "expected_labs"]

BANNER = """\
# =====================================================================================================
# Lab {number}, learner copy: fill in every TODO, then check your work with
#     python -m ddpcourse check labs/{name}
# Stuck on a TODO? `python -m ddpcourse hint {number}` shows the next hint, one level at a time.
# Generated from solutions/{name} by `python -m ddpcourse make-labs`; course authors edit that file.
# =====================================================================================================
"""


def make_lab(source, name):
    """The learner text for one solution file's text."""
    regions, pieces = parse_regions(source, name)
    if not regions:
        raise MarkerError(f"{name}: no {BEGIN} region, so the lab would have nothing to do")
    body = "".join(todo_lines(p.number, p.hint(1, name), p.indent) if isinstance(p, Region) else p
                   for p in pieces)
    return BANNER.format(number=lab_number(name) or "?", name=name) + body


def expected_labs(solutions_dir):
    return {path.name: make_lab(path.read_text(encoding="utf-8"), path.name)
            for path in lab_files(solutions_dir)}


def make_labs(solutions_dir=None, labs_dir=None, check=False, out=sys.stdout):
    """Write (or with check=True, compare) every lab. Returns the names that were (or are) stale."""
    solutions_dir = Path(solutions_dir or COURSE_ROOT / "solutions")
    labs_dir = Path(labs_dir or COURSE_ROOT / "labs")
    stale = []
    for name, text in expected_labs(solutions_dir).items():
        target = labs_dir / name
        if target.exists() and target.read_text(encoding="utf-8") == text:
            continue
        stale.append(name)
        if not check:
            labs_dir.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    expected = set(expected_labs(solutions_dir))
    orphans = sorted(p.name for p in lab_files(labs_dir) if p.name not in expected)
    for name in stale:
        print(f"{'stale' if check else 'wrote'}: labs/{name}", file=out)
    for name in orphans:
        print(f"labs/{name} has no solutions/{name}", file=out)
    if check and not stale and not orphans:
        print(f"labs/ is up to date with solutions/ ({len(expected)} labs)", file=out)
    return stale + orphans
