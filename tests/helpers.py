"""Helpers for the tests: realistic wrong versions of a solution, finding a check, a markdown section, a
course tool under docs/ imported from its path."""
import importlib.util
import re

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


def section(markdown, heading):
    """The lines under the heading that starts with ``heading``, up to the next heading of the same or a
    higher level (lines inside code blocks are no headings)."""
    level, lines, inside, code = len(heading.split(" ")[0]), [], False, False
    for line in markdown.splitlines():
        code = code != line.startswith("```")
        is_heading = not code and re.match(r"^(#+) ", line)
        if inside and is_heading and len(is_heading.group(1)) <= level:
            break
        inside = inside or line.startswith(heading)
        if inside:
            lines.append(line)
    assert lines, f"no heading {heading!r}"
    return "\n".join(lines)


def docs_tool(relative_path):
    """A course tool under docs/ (``"docs/lint/glossary.py"``), imported from its path: docs/ is no package,
    the tools are scripts, and a test calls their functions."""
    path = COURSE_ROOT / relative_path
    spec = importlib.util.spec_from_file_location(f"docs_tool_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
