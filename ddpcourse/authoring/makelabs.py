"""Generate the learner labs from the solutions: ``python -m ddpcourse make-labs [--check]``.

Introduced in notebooks/00_start_here.ipynb ("How the labs are made"). ``solutions/NN_name.py`` is the
only source: each ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region becomes a numbered TODO whose
comment shows hint level 1, under a banner. The text of a lab is ddpcourse.todos' (``make_lab``), the owner
of the TODO format, so that what status and run_lab call "untouched" is exactly what this module writes;
this module only writes (or compares) the files. ``--check`` changes nothing and exits 1 when labs/ is
stale, so a test catches a solution edited without regenerating.
"""
import sys
from pathlib import Path

from ddpcourse.paths import COURSE_ROOT, lab_files
from ddpcourse.todos import BEGIN, END, MarkerError, generated_text, make_lab

# make_lab, the markers and MarkerError belong to ddpcourse.todos; they are exported here too because
# course authors (notebook 00, benchmarks/planted_changes.py) reach them through the make-labs module.
__all__ = ["BEGIN", "END", "MarkerError", "make_lab", "make_labs", "expected_labs"]


def expected_labs(solutions_dir):
    """{file name: learner text} of every solution in ``solutions_dir``."""
    return {path.name: generated_text(path) for path in lab_files(solutions_dir)}


def make_labs(solutions_dir=None, labs_dir=None, check=False, out=None):
    """Write (or with check=True, compare) every lab. Returns the names that were (or are) stale.
    out: where to say so; the sys.stdout of the moment by default (a default bound at import would keep
    whatever stdout was then)."""
    out = out or sys.stdout
    solutions_dir = Path(solutions_dir or COURSE_ROOT / "solutions")
    labs_dir = Path(labs_dir or COURSE_ROOT / "labs")
    expected = expected_labs(solutions_dir)
    stale = []
    for name, text in expected.items():
        target = labs_dir / name
        if target.exists() and target.read_text(encoding="utf-8") == text:
            continue
        stale.append(name)
        if not check:
            labs_dir.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    orphans = sorted(p.name for p in lab_files(labs_dir) if p.name not in expected)
    for name in stale:
        print(f"{'stale' if check else 'wrote'}: labs/{name}", file=out)
    for name in orphans:
        print(f"labs/{name} has no solutions/{name}", file=out)
    if check and not stale and not orphans:
        print(f"labs/ is up to date with solutions/ ({len(expected)} labs)", file=out)
    return stale + orphans
