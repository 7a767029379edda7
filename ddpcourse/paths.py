"""Where the course's files are, and which copy of a lab a cell runs.

Introduced in notebooks/00_start_here.ipynb. ``run_lab("00")`` means ``labs/00_*.py`` (the learner's
copy) unless the environment variable DDPCOURSE_LAB_SOURCE=solutions is set: the test suite sets it so
that CI runs every notebook against the complete solutions.
"""
import os
import re
from pathlib import Path

COURSE_ROOT = Path(__file__).resolve().parent.parent
LAB_SOURCE_ENV = "DDPCOURSE_LAB_SOURCE"
LAB_NAME = re.compile(r"^(\d\d)_\w+\.py$")


def lab_files(folder):
    """The lab files in `folder` (NN_name.py), sorted; a learner's saved copies (NN_name.saved-...py) are not labs."""
    return sorted(path for path in Path(folder).glob("[0-9][0-9]_*.py") if LAB_NAME.match(path.name))


def lab_folder():
    source = os.environ.get(LAB_SOURCE_ENV, "labs")
    if source not in ("labs", "solutions"):
        raise ValueError(f"{LAB_SOURCE_ENV} must be 'labs' or 'solutions', not {source!r}")
    return COURSE_ROOT / source


def resolve_lab(lab):
    """A path to an existing file, or a lab number such as "00" / "00_first_collectives"."""
    path = Path(lab)
    if path.suffix == ".py" and path.exists():
        return path.resolve()
    number = str(lab)[:2]
    if not number.isdigit():
        raise FileNotFoundError(f"no such file: {lab}")
    folder = lab_folder()
    matches = [path for path in lab_files(folder) if path.name.startswith(f"{number}_")]
    if not matches:
        raise FileNotFoundError(f"no lab {number} in {display_path(folder)}/")
    return matches[0]


def lab_number(path):
    """The two-digit lab number from a file name like 00_first_collectives.py (or a copy of it)."""
    match = re.match(r"^(\d\d)_", Path(path).name)
    return match.group(1) if match else None


def display_path(path):
    """A path as a learner would type it: relative to the course root when inside it."""
    path = Path(path).resolve()
    try:
        return path.relative_to(COURSE_ROOT).as_posix()
    except ValueError:
        return str(path)
