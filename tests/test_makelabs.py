"""make-labs: solutions/ is the single source of labs/, and a drift fails the suite."""
import re
import subprocess
import sys
import textwrap

import pytest

from ddpcourse.authoring.makelabs import MarkerError, make_lab, make_labs
from ddpcourse.paths import COURSE_ROOT, lab_files
from ddpcourse.todos import open_todos, parse_regions, todo_in_message

SOLUTION = textwrap.dedent('''\
    import torch

    def mean(t, world):
        ### BEGIN SOLUTION
        ### HINT 1: all ranks' values summed,
        ### HINT 1: then divided by world
        ### HINT 2: t.clone(), dist.all_reduce
        total = t.clone()
        return total / world
        ### END SOLUTION

    class Trainer:
        def step(self):
            if True:
                ### BEGIN SOLUTION
                self.x = 1
                ### END SOLUTION
            return self.x
    ''')


def test_regions_become_numbered_todos_at_their_indentation_showing_hint_level_1_only():
    lab = make_lab(SOLUTION, "03_example.py")
    assert lab.startswith("# ====")
    assert "Lab 03, learner copy" in lab and "python -m ddpcourse check labs/03_example.py" in lab
    assert "python -m ddpcourse hint 03" in lab
    assert "    # TODO 1: all ranks' values summed, then divided by world\n" in lab
    assert """    raise NotImplementedError("TODO 1: all ranks' values summed, then divided by world")\n""" in lab
    assert "            # TODO 2: complete this step\n" in lab
    assert "            raise NotImplementedError('TODO 2: complete this step')\n" in lab
    for hidden in ("total = t.clone()", "self.x = 1", "BEGIN SOLUTION", "HINT", "dist.all_reduce"):
        assert hidden not in lab
    assert "return self.x" in lab and "import torch" in lab  # everything outside the regions is kept
    compile(lab, "lab", "exec")  # and the learner copy is valid Python


@pytest.mark.parametrize("source, problem", [
    ("### BEGIN SOLUTION\nx = 1\n", "never closed"),
    ("x = 1\n### END SOLUTION\n", "without"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "inside another"),
    ("x = 1\n", "nothing to do"),
    ("### BEGIN SOLUTION\n### HINT 3: where\n### END SOLUTION\n", "level 3, where to look, is generated"),
])
def test_broken_markers_are_rejected_with_the_line(source, problem):
    with pytest.raises(MarkerError, match=problem):
        make_lab(source, "09_broken.py")


def test_committed_labs_match_their_solutions():
    """If this fails: run `python -m ddpcourse make-labs` and commit labs/."""
    check = subprocess.run([sys.executable, "-m", "ddpcourse", "make-labs", "--check"],
                           capture_output=True, text=True, cwd=COURSE_ROOT)
    assert check.returncode == 0, check.stdout + check.stderr
    solutions = [p.name for p in lab_files(COURSE_ROOT / "solutions")]
    labs = [p.name for p in lab_files(COURSE_ROOT / "labs")]
    assert solutions and solutions == labs


def test_check_detects_a_solution_edited_without_regenerating(tmp_path):
    solutions, labs = tmp_path / "solutions", tmp_path / "labs"
    solutions.mkdir()
    (solutions / "05_x.py").write_text(SOLUTION)
    assert make_labs(solutions, labs) == ["05_x.py"]          # first generation writes it
    assert make_labs(solutions, labs, check=True) == []       # then it is up to date
    (solutions / "05_x.py").write_text(SOLUTION.replace("then divided by world", "then divided by the world size"))
    assert make_labs(solutions, labs, check=True) == ["05_x.py"]
    (labs / "06_orphan.py").write_text("# no solution for this one\n")
    assert "06_orphan.py" in make_labs(solutions, labs, check=True)
    (labs / "06_orphan.py").unlink()
    (labs / "05_x.saved-20261121-101500.py").write_text("# a learner's saved copy: not a lab\n")
    assert make_labs(solutions, labs, check=True) == ["05_x.py"]


def test_hint_levels_and_both_kinds_of_quotes_round_trip(tmp_path):
    idea = """the 'sum' of "every" rank's value, then a \\ backslash"""
    solution = SOLUTION.replace("### HINT 1: all ranks' values summed,\n", f"### HINT 1: {idea}\n").replace(
        "    ### HINT 1: then divided by world\n", "")
    lab = make_lab(solution, "03_example.py")
    compile(lab, "lab", "exec")
    assert open_todos(lab) == [(1, idea), (2, "complete this step")]  # what status and check read back
    with pytest.raises(NotImplementedError) as raised:  # what the worker reads back from the exception
        exec(compile(lab + "\nmean(None, 1)\n", "lab", "exec"), {})
    assert todo_in_message(str(raised.value)) == (1, idea)
    regions, _ = parse_regions(solution, "03_example.py")
    first = regions[0]
    assert first.hint(1, "03_example.py") == idea and first.hint(2, "03_example.py") == "t.clone(), dist.all_reduce"
    code = [i for i, line in enumerate(solution.splitlines(), 1) if line.strip() in ("total = t.clone()", "return total / world")]
    assert first.hint(3, "03_example.py") .startswith(f"solutions/03_example.py in mean(), lines {code[0]}-{code[1]}:")
    assert regions[1].hint(2, "03_example.py") == "complete this step"  # no hint: the default at every level
    assert regions[1].hint(3, "03_example.py").startswith("solutions/03_example.py in step(), lines")


def test_every_solution_region_has_an_idea_and_the_calls_and_the_idea_names_no_call():
    for solution in lab_files(COURSE_ROOT / "solutions"):
        regions, _ = parse_regions(solution.read_text(), solution.name)
        for region in regions:
            where = f"{solution.name} TODO {region.number}"
            assert set(region.hints) == {1, 2}, where
            idea = region.hints[1]
            assert not re.search(r"\w\(|dist\.|=", idea), f"{where}: level 1 gives code away: {idea}"
