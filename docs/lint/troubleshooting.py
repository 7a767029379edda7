"""docs/troubleshooting.md, row by row: every row marked **tested** has its tests, and every test named exists.

    python docs/lint/troubleshooting.py --check   # one line per problem, exit 1; else a one-line "ok"

Why: **tested** is a promise to the learner that the error text is the one torch prints and that the fix
works, kept by a test that reproduces the row (tests/test_troubleshooting.py, or the test the row names) and
checks the row's text against what it reproduces, so that a changed row, or a changed torch, fails it. A
row marked **tested** that no test reads, or a test named that no longer exists, is a promise nobody keeps.

1. Every row of the doc's tables has 3 cells (symptom, cause, fix; an escaped pipe `\\|` is a pipe).
2. TESTS below names, for each row that tests something (by a phrase of its symptom, which must be in
   exactly one row), its tests: a name in tests/test_troubleshooting.py, or tests/FILE.py::name. Every row
   marked **tested** has an entry; every test named there is a function of its file.
3. A test a row names in its text (`test_...` or `tests/FILE.py::test_...`) exists (in that file, else in
   some tests/test_*.py).

Each rule returns its problems as one-line messages naming the file and the line; ``problems(root)`` runs
them all. Standard library only.
"""
import ast
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared command line beside it
import lint_main  # noqa: E402

COURSE_ROOT = Path(__file__).resolve().parents[2]
DOC = Path("docs") / "troubleshooting.md"  # relative to the course's root
DEFAULT_TESTS = "tests/test_troubleshooting.py"  # where a test named without a file lives

# Each row that tests something, by a phrase of its symptom: its tests, in tests/test_troubleshooting.py (a
# name) or in another file (tests/FILE.py::name). Rows marked **tested** must all be here; each test must exist.
TESTS = {
    "ProxyError('Cannot connect to proxy.'": ["tests/test_docs.py::test_pip_behind_a_proxy_it_cannot_reach"],
    "No module named 'ddpcourse'": ["tests/test_docs.py::test_a_kernel_without_the_course_environment"],
    "a Predict or progress cell shows only text": [
        "tests/test_docs.py::test_the_widget_extension_comes_with_the_pinned_install"],
    "name: EADDRINUSE, message: address already in use": [
        "test_port_already_in_use_then_a_free_port", "test_torchrun_on_a_port_in_use_then_standalone"],
    "The IPv6 network addresses of (no-such-host.invalid, 29500)": [
        "test_host_name_that_does_not_resolve_then_loopback"],
    "the doctor's `localhost` line is red": ["test_doctor_red_localhost_line_and_its_fix"],
    "environment variable RANK expected, but not set": [
        "tests/test_docs.py::test_a_script_started_without_a_launcher_needs_rank"],
    "plain `torchrun` (not the course's launcher) on macOS or on a VPN": [
        "tests/test_docs.py::test_plain_torchrun_advertises_getfqdn_unless_local_addr"],
    "Do you want the application": [
        "tests/test_launcher.py::test_two_runs_at_once_report_per_rank_and_list_their_sockets"],
    "use_libuv was requested but PyTorch was built without libuv support": [
        "test_use_libuv_0_is_read_by_torchs_stores"],
    "The module torch.distributed.launch is deprecated": [
        "test_legacy_launch_appends_local_rank_which_a_torchrun_script_rejects"],
    "(stopped after T s, start-up included); all its processes were killed": [
        "test_a_hang_in_a_collective_is_stopped_with_each_ranks_stack"],
    "the ranks did not start within 120 s": [
        "tests/test_launcher.py::test_a_start_up_timeout_says_the_ranks_did_not_start"],
    "exited with code 3 without a Python exception": ["test_a_rank_that_dies_is_named"],
    "Received data size doesn't match expected size": ["test_collective_sizes_that_differ_abort_on_gloo"],
    "training with N ranks is much slower than expected": [
        "test_threads_outside_any_launcher_use_more_than_cores_per_rank",
        "test_torchrun_sets_omp_num_threads_to_1_and_says_so",
        "test_a_hang_in_a_collective_is_stopped_with_each_ranks_stack",
        "tests/test_launcher.py::test_threads_divide_the_usable_cores_unless_the_user_chose"],
    "is not done yet (line L)": ["test_todos_one_at_a_time_versus_status"],
    "Root Cause (first observed failure)": ["test_torchrun_without_record_reports_no_traceback"],
    "terminate called without an active exception": ["test_destroy_process_group_leaves_no_group_open_at_exit"],
    "ended with its process group open": ["tests/test_launcher.py::test_a_process_group_left_open_fails_the_run"],
}


def table_rows(text):
    """(line number, cells) of every row of a markdown text's tables, header and separator rows left out;
    an escaped pipe (`\\|`) inside a cell is a pipe."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("|"):
            continue
        cells = [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        if cells[0].startswith("symptom") or set("".join(cells)) <= set("-: "):
            continue
        rows.append((number, cells))
    return rows


def doc_text(root=COURSE_ROOT):
    return (Path(root) / DOC).read_text(encoding="utf-8")


def doc_rows(root=COURSE_ROOT):
    """[symptom, cause, fix] of every well-formed row of the doc (a row of another width: row_problems)."""
    return [cells for _, cells in table_rows(doc_text(root)) if len(cells) == 3]


def row(key, root=COURSE_ROOT):
    """The whole text of the one row whose symptom contains ``key``; LookupError unless exactly one has it."""
    found = [" | ".join(cells) for cells in doc_rows(root) if key in cells[0]]
    if len(found) != 1:
        raise LookupError(f"{len(found)} rows of {DOC.as_posix()} have {key!r} in their symptom")
    return found[0]


def row_problems(text, name=DOC.as_posix()):
    """Rule 1: a table row without exactly 3 cells."""
    return [f"{name} line {number}: a row with {len(cells)} cells, not 3 (symptom, cause, fix): {cells[0][:60]!r}"
            for number, cells in table_rows(text) if len(cells) != 3]


def functions_of(path):
    """The names of the top-level test functions of a test file."""
    return {node.name for node in ast.parse(Path(path).read_text(encoding="utf-8")).body
            if isinstance(node, ast.FunctionDef)}


def registry_problems(text, root=COURSE_ROOT, tests=TESTS, name=DOC.as_posix()):
    """Rule 2: each key of `tests` in exactly one row's symptom, each **tested** row with an entry, and each
    test an entry names a function of its file."""
    rows = [(number, cells) for number, cells in table_rows(text) if len(cells) == 3]
    problems = []
    for key in tests:
        count = sum(key in cells[0] for _, cells in rows)
        if count != 1:
            problems.append(f"docs/lint/troubleshooting.py TESTS: {key!r} is in {count} rows' symptoms of {name} "
                            "(one): update TESTS")
    for number, cells in rows:
        if "**tested**" in " ".join(cells) and not any(key in cells[0] for key in tests):
            problems.append(f"{name} line {number}: marked **tested**, but no test in TESTS: {cells[0][:80]!r}")
    found = {}
    for key, names in tests.items():
        for test in names:
            path, _, function = test.rpartition("::")
            file = Path(root) / (path or DEFAULT_TESTS)
            if file not in found:
                found[file] = functions_of(file) if file.is_file() else set()
            if function not in found[file]:
                problems.append(f"docs/lint/troubleshooting.py TESTS[{key[:40]!r}]: {test} is no test of "
                                f"{file.relative_to(root).as_posix()}")
    return problems


def named_test_problems(text, root=COURSE_ROOT, name=DOC.as_posix()):
    """Rule 3: a test a row names in its text exists (in the file it names, else in some tests/test_*.py)."""
    problems, every_test = [], sorted((Path(root) / "tests").glob("test_*.py"))
    sources = {}
    for number, cells in table_rows(text):
        for path, function in re.findall(r"`(?:(tests/\w+\.py)::)?(test_\w+)`", " ".join(cells)):
            files = [Path(root) / path] if path else every_test
            for file in files:
                if file not in sources:
                    sources[file] = file.read_text(encoding="utf-8") if file.is_file() else ""
            if not any(f"def {function}(" in sources[file] for file in files):
                problems.append(f"{name} line {number}: names {path + '::' if path else ''}{function}, "
                                "which no test file defines")
    return problems


def problems(root=COURSE_ROOT):
    """Every problem of the three rules on the course at `root`, one line each."""
    text = doc_text(root)
    return row_problems(text) + registry_problems(text, root) + named_test_problems(text, root)


def _summary(root):
    """The one line said when nothing is wrong."""
    tested = sum("**tested**" in " ".join(cells) for cells in doc_rows(root))
    return (f"troubleshooting ok: {len(doc_rows(root))} rows, {tested} marked **tested**, each with its tests "
            f"({sum(map(len, TESTS.values()))} named in TESTS)")


def main(argv=None):
    return lint_main.check(__doc__, problems, _summary, COURSE_ROOT, argv)


if __name__ == "__main__":
    sys.exit(main())
