"""``hint("NN")`` in a notebook and ``python -m ddpcourse hint NN [k]``: one more hint level of a lab's next
open TODO (or of TODO k), every level seen so far shown. The format and the remembered levels are
ddpcourse.todos'."""
from ddpcourse.paths import display_path, find_lab
from ddpcourse.todos import LEVELS, open_todos, remember_level, revealed_level, solution_regions


def reveal_hint(lab, number=None):
    """Reveal one more hint level of TODO ``number`` (default: the lab's first open TODO) and return the
    text to show: every level seen so far. ``lab``: a number such as "00" or a lab file."""
    lab = find_lab(lab)
    path, ident, solution = lab.file, lab.number, lab.solution
    if solution is None:
        raise ValueError(f"{path.name} is no lab of this course (lab files are named NN_name.py)")
    regions = solution_regions(solution)
    if number is None:
        open_now = open_todos(path.read_text(encoding="utf-8", errors="replace"))
        if not open_now:
            return (f"{display_path(path)} has no open TODO. For the hints of TODO k: "
                    f"hint(\"{ident}\", k), or python -m ddpcourse hint {ident} k")
        number = open_now[0][0]
    if number not in regions:
        raise ValueError(f"lab {ident} has TODOs {', '.join(map(str, regions))}, not {number}")
    level = min(revealed_level(path, number) + 1, LEVELS)
    if path.parent != solution.parent:  # the solutions are complete: nothing to remember there
        remember_level(path, number, level)
    # hint 1 is the TODO's own comment, already in the file: say so, or a first "hint 2 of 3" surprises
    lines = [f"TODO {number} of {display_path(path)}: hints 1 to {level} of {LEVELS} (hint 1 is the TODO's comment):"]
    names = {1: "the idea", 2: "the calls", 3: "where to look"}
    lines += [f"  {k} ({names[k]}): {regions[number].hint(k, solution.name)}" for k in range(1, level + 1)]
    if level == LEVELS:
        lines.append("That was the last level.")
    return "\n".join(lines)
