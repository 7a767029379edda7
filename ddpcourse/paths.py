"""Where the course's files are, and which copy of a lab a cell runs.

Introduced in notebooks/00_start_here.ipynb. ``run_lab("00")`` means ``labs/00_*.py`` (the learner's
copy) unless DDPCOURSE_LAB_SOURCE=solutions is set: an instructor's demo mode (docs/instructors.md, "What
to demo live"), in which the notebooks run the complete solutions; the suite runs the notebooks that way.
"""
import os
import re
from dataclasses import dataclass
from pathlib import Path

COURSE_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = COURSE_ROOT / "notebooks"  # the executed reference notebooks; their cells run from here
LAB_SOURCE_ENV = "DDPCOURSE_LAB_SOURCE"
LAB_NAME = re.compile(r"^(\d\d)_\w+\.py$")
LAB_SPELLING = re.compile(r"^(\d\d)(_\w+)?$")  # "00" or "00_first_collectives"


def lab_files(folder):
    """The lab files in `folder` (NN_name.py), sorted; a learner's saved copies (NN_name.saved-...py) are not labs."""
    return sorted(path for path in Path(folder).glob("[0-9][0-9]_*.py") if LAB_NAME.match(path.name))


def lab_spelling(lab):
    """How a learner names a lab, for check, hint and reset alike: "00", "00_first_collectives", or that
    name with .py or a folder in front. Returns (number, name or None for a bare number), or None ("3" too:
    the labs are named with two digits everywhere)."""
    name = Path(str(lab).strip()).name.removesuffix(".py")
    match = LAB_SPELLING.match(name)
    return (match.group(1), name if match.group(2) else None) if match else None


def lab_folder():
    source = os.environ.get(LAB_SOURCE_ENV, "labs")
    if source not in ("labs", "solutions"):
        raise ValueError(f"{LAB_SOURCE_ENV} must be 'labs' or 'solutions', not {source!r}")
    return COURSE_ROOT / source


def resolve_lab(lab):
    """A lab file: a path to an existing file, or a lab number such as "00" / "00_first_collectives"
    (looked up in lab_folder()). A path that does not exist is an error, never another lab."""
    path = Path(lab)
    if path.suffix == ".py" or len(path.parts) > 1:
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {lab}")
        return path.resolve()
    spelled = lab_spelling(lab)
    if spelled is None:
        raise FileNotFoundError(f"{lab!r} is neither a file nor a lab number such as \"00\"")
    number = spelled[0]
    folder = lab_folder()
    matches = [path for path in lab_files(folder) if path.name.startswith(f"{number}_")]
    if not matches:
        raise FileNotFoundError(f"no lab {number} in {display_path(folder)}/")
    if path.name != number and matches[0].stem != path.name:
        raise FileNotFoundError(f"lab {number} is {matches[0].stem}, not {lab}")
    return matches[0]


def lab_number(path):
    """The lab's identity: the two-digit number a file name starts with ("00" for 00_first_collectives.py
    or a copy of it anywhere), None for a file that is no lab."""
    match = re.match(r"^(\d\d)_", Path(path).name)
    return match.group(1) if match else None


def solution_of(lab):
    """solutions/NN_name.py of a lab file (or number), or None when the course has no such lab."""
    number = lab_number(lab) or (lab_spelling(lab) or (None,))[0]
    found = [path for path in lab_files(COURSE_ROOT / "solutions") if path.name.startswith(f"{number}_")]
    return found[0] if number and found else None


@dataclass(frozen=True)
class Lab:
    """One lab, resolved once from however it was named ("03", "03_change_a_wrapped_model", a path): check,
    run, hint and status pass this on from there, and nothing works the lab out again on the way."""
    number: str          # "03"; None for a file of no lab (its TODOs are still counted)
    file: Path           # the copy that runs: labs/ (or solutions/, DDPCOURSE_LAB_SOURCE), or a copy anywhere
    solution: Path       # solutions/NN_name.py, the source of its TODOs and hints; None when the course has none

    @property
    def shown(self):
        """The file as a learner would type it."""
        return display_path(self.file)


def find_lab(lab):
    """The Lab a learner means by ``lab`` (resolve_lab's spellings; a Lab is returned as it is)."""
    if isinstance(lab, Lab):
        return lab
    return lab_of_file(resolve_lab(lab))


def lab_of_file(path):
    """The Lab whose copy is the file ``path`` (a course lab when its name starts with a lab's number)."""
    path = Path(path)
    number = lab_number(path)
    return Lab(number, path, solution_of(number) if number else None)


def compile_error(path):
    """The SyntaxError (or ValueError, e.g. a null byte) that keeps ``path`` from compiling, else None.
    The one syntax check: the launcher runs it before starting N interpreters, status before a check."""
    try:
        compile(Path(path).read_bytes(), str(path), "exec")
    except (SyntaxError, ValueError) as exc:
        return exc
    return None


def display_path(path):
    """A path as a learner would type it: relative to the course root when inside it."""
    path = Path(path).resolve()
    try:
        return path.relative_to(COURSE_ROOT).as_posix()
    except ValueError:
        return str(path)
