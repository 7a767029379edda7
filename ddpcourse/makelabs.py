"""Generate the learner labs from the solutions: ``python -m ddpcourse make-labs [--check]``.

Introduced in notebooks/00_start_here.ipynb ("How the labs are made"). ``solutions/NN_name.py`` is the
only source. Each region

    ### BEGIN SOLUTION
    ### HINT: what to do, in one line (optional, may repeat)
    ...the answer...
    ### END SOLUTION

becomes, at the same indentation,

    # TODO k: what to do
    raise NotImplementedError("TODO k: what to do")

numbered from 1 in file order, under a banner. ``--check`` changes nothing and exits 1 when labs/ is
stale, so a test catches a solution edited without regenerating.
"""
import re
import sys
from pathlib import Path

from ddpcourse.paths import COURSE_ROOT, lab_files

BEGIN, END, HINT = "### BEGIN SOLUTION", "### END SOLUTION", "### HINT:"
BANNER = """\
# =====================================================================================================
# Lab {number}, learner copy: fill in every TODO, then check your work with
#     python -m ddpcourse check labs/{name}
# Generated from solutions/{name} by `python -m ddpcourse make-labs`; course authors edit that file.
# =====================================================================================================
"""


class MarkerError(ValueError):
    pass


def make_lab(source, name):
    """The learner text for one solution file's text."""
    out, todo, region = [], 0, None  # region: (indent, hints, start line) while inside one
    for lineno, line in enumerate(source.splitlines(keepends=True), start=1):
        stripped = line.strip()
        if stripped.startswith(BEGIN):
            if region is not None:
                raise MarkerError(f"{name}:{lineno}: {BEGIN} inside another solution region")
            region = (line[: len(line) - len(line.lstrip())], [], lineno)
        elif stripped.startswith(END):
            if region is None:
                raise MarkerError(f"{name}:{lineno}: {END} without {BEGIN}")
            indent, hints, _ = region
            todo += 1
            hint = " ".join(hints) or "complete this step"
            out.append(f"{indent}# TODO {todo}: {hint}\n")
            out.append(f"{indent}raise NotImplementedError({f'TODO {todo}: {hint}'!r})\n")
            region = None
        elif region is not None:
            if stripped.startswith(HINT):
                region[1].append(stripped[len(HINT):].strip())
        else:
            out.append(line)
    if region is not None:
        raise MarkerError(f"{name}:{region[2]}: {BEGIN} is never closed")
    if todo == 0:
        raise MarkerError(f"{name}: no {BEGIN} region, so the lab would have nothing to do")
    number = re.match(r"(\d+)", name).group(1) if re.match(r"\d", name) else "?"
    return BANNER.format(number=number, name=name) + "".join(out)


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
