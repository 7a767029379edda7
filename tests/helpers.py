"""Helpers for the lab-check tests: realistic wrong versions of a solution, and finding a check."""
from ddpcourse.paths import COURSE_ROOT


def mutant(tmp_path, solution_name, *edits, folder="learner"):
    """A copy of solutions/<solution_name> with `edits` (old, new) applied: a learner's wrong version.

    The copy keeps the file name, since the check identifies the lab by it. Fails loudly when the
    solution no longer contains `old`, so the test is updated with the solution.
    """
    text = (COURSE_ROOT / "solutions" / solution_name).read_text()
    for old, new in edits:
        assert old in text, f"the solution no longer contains {old!r}: update this test"
        text = text.replace(old, new)
    where = tmp_path / folder
    where.mkdir(exist_ok=True)
    path = where / solution_name
    path.write_text(text)
    return path


def detail(report, name_part):
    """The first check whose name contains `name_part` (fails if none does)."""
    found = [c for c in report.results if name_part in c.name]
    assert found, [c.name for c in report.results]
    return found[0]


def wrong_version(solution_name, *edits, nproc=2):
    """Declare the wrong version a test judges: solutions/<solution_name> with ``edits`` applied (see mutant),
    checked on ``nproc`` ranks (None: the check's own world sizes). The test receives its CheckReport as the
    ``report`` fixture (tests/conftest.py)."""
    def declare(test):
        test.wrong_version = (solution_name, edits, nproc)
        return test
    return declare
