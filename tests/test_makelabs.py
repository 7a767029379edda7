"""make-labs: solutions/ is the single source of labs/, and a drift fails the suite."""
import subprocess
import sys
import textwrap

import pytest

from ddpcourse.makelabs import MarkerError, make_lab, make_labs
from ddpcourse.paths import COURSE_ROOT, lab_files

SOLUTION = textwrap.dedent('''\
    import torch

    def mean(t, world):
        ### BEGIN SOLUTION
        ### HINT: all_reduce a clone,
        ### HINT: then divide by world
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


def test_regions_become_numbered_todos_at_their_indentation():
    lab = make_lab(SOLUTION, "03_example.py")
    assert lab.startswith("# ====")
    assert "Lab 03, learner copy" in lab and "python -m ddpcourse check labs/03_example.py" in lab
    assert "    # TODO 1: all_reduce a clone, then divide by world\n" in lab
    assert "    raise NotImplementedError('TODO 1: all_reduce a clone, then divide by world')\n" in lab
    assert "            # TODO 2: complete this step\n" in lab
    assert "            raise NotImplementedError('TODO 2: complete this step')\n" in lab
    for hidden in ("total = t.clone()", "self.x = 1", "BEGIN SOLUTION", "HINT"):
        assert hidden not in lab
    assert "return self.x" in lab and "import torch" in lab  # everything outside the regions is kept
    compile(lab, "lab", "exec")  # and the learner copy is valid Python


@pytest.mark.parametrize("source, problem", [
    ("### BEGIN SOLUTION\nx = 1\n", "never closed"),
    ("x = 1\n### END SOLUTION\n", "without"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "inside another"),
    ("x = 1\n", "nothing to do"),
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
    (solutions / "05_x.py").write_text(SOLUTION.replace("divide by world", "divide by the world size"))
    assert make_labs(solutions, labs, check=True) == ["05_x.py"]
    (labs / "06_orphan.py").write_text("# no solution for this one\n")
    assert "06_orphan.py" in make_labs(solutions, labs, check=True)
    (labs / "06_orphan.py").unlink()
    (labs / "05_x.saved-20261121-101500.py").write_text("# a learner's saved copy: not a lab\n")
    assert make_labs(solutions, labs, check=True) == ["05_x.py"]
