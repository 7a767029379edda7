"""Lab checks: every solution passes, every generated lab fails naming its open TODO, and realistic
wrong versions fail with the message that names the mistake."""
import re

import pytest

from ddpcourse.__main__ import main
from ddpcourse.authoring.notebooks import notebook_files
from ddpcourse.checks import check_lab, declared_check
from ddpcourse.authoring.makelabs import make_lab
from ddpcourse.paths import COURSE_ROOT, lab_files
from ddpcourse.learner.hints import reveal_hint
from ddpcourse.todos import solution_regions, todo_line
from helpers import detail, wrong_version

SOLUTIONS = lab_files(COURSE_ROOT / "solutions")
CHECK_CALL = re.compile(r'check_lab\("(?:\.\./solutions/)?(\d\d)[^"]*"(?:, nproc=(\d+))?\)')


def notebook_checks():
    """{(lab number, world size)} that the notebooks' own check cells judge. Under this suite those cells
    check solutions/ (conftest.py) and nbval compares their output with the committed "lab passes"."""
    import json

    judged = set()
    for notebook in notebook_files():
        for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "code":
                continue
            for number, size in CHECK_CALL.findall("".join(cell["source"])):
                judged |= {(number, int(s)) for s in ((size,) if size else declared_check(number).nprocs)}
    return judged


NOTEBOOK_CHECKS = notebook_checks()
LEFT_TO_THIS_FILE = [(solution, size) for solution in SOLUTIONS for size in declared_check(solution.name[:2]).nprocs
                     if (solution.name[:2], size) not in NOTEBOOK_CHECKS]


def test_every_solution_has_a_notebook_check_cell():
    assert {number for number, _ in NOTEBOOK_CHECKS} == {solution.name[:2] for solution in SOLUTIONS}


@pytest.mark.parametrize("solution, nproc", LEFT_TO_THIS_FILE, ids=lambda v: getattr(v, "name", str(v)))
def test_solution_passes_where_no_notebook_checks_it(solution, nproc, recorded_check):
    """Each solution passes its check at every world size: here for the sizes no notebook cell judges (from
    a recorded run, stale when the solution changes: tests/recorded_runs.py)."""
    report = recorded_check(solution, nproc=nproc)
    assert report.passed, "\n".join(map(str, report.failures))


@pytest.fixture
def no_launch(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("check_lab launched a lab with open TODOs")
    monkeypatch.setattr("ddpcourse.checks.launch", refuse)


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.name)
def test_generated_lab_lists_its_open_todos_and_next_hint_without_launching(solution, tmp_path, no_launch, capsys):
    # generated afresh, so the test holds after a learner completed labs/ (make-labs --check covers drift)
    lab = tmp_path / "labs" / solution.name
    lab.parent.mkdir()
    lab.write_text(make_lab(solution.read_text(), solution.name))
    regions = solution_regions(solution)
    report = check_lab(lab)
    assert not report.passed and not report.launched
    assert report.todos == sorted(regions) and len(report.results) == 1
    shown = capsys.readouterr().out
    assert f"{lab} is not started yet" in shown and "nothing was run" in shown
    assert f"Next: TODO 1 (line {todo_line(lab.read_text(), 1)}): {regions[1].hints[1]}" in shown
    assert f'hint("{solution.name[:2]}")' in shown


def test_a_started_lab_shows_the_hint_level_the_learner_revealed(tmp_path, no_launch, capsys):
    solution = SOLUTIONS[0]
    lab = tmp_path / solution.name
    text = make_lab(solution.read_text(), solution.name)
    started, done = re.subn(r"    raise NotImplementedError\((['\"])TODO 1", r"    return value  # raise NotImplementedError(\1TODO 1",
                            text, count=1)  # make-labs quotes a hint with either quote
    assert done == 1
    lab.write_text(started)
    reveal_hint(lab)  # the learner asked for TODO 2's level 2 ...
    report = check_lab(lab)
    assert report.todos == [2, 3] and not report.launched
    shown = capsys.readouterr().out
    assert "has open TODOs (TODOs 2, 3)" in shown
    assert f": {solution_regions(solution)[2].hints[2]}" in shown  # ... so the check shows level 2


def test_check_lab_resolves_the_lab_once_on_the_way_to_its_verdict(tmp_path, monkeypatch):
    """From check_lab("NN") to the judged run the lab's name is looked up once and its solution found once:
    every step after that is handed the one frozen Lab (its TODO status, its hints, the launch)."""
    import dataclasses

    import ddpcourse.paths as paths
    from ddpcourse.launch.launcher import RunResult

    calls = {"resolve_lab": 0, "solution_of": 0}
    for name in calls:
        def counted(*args, _name=name, _real=getattr(paths, name)):
            calls[_name] += 1
            return _real(*args)
        monkeypatch.setattr(paths, name, counted)
    solution = SOLUTIONS[0]
    (tmp_path / solution.name).write_text(solution.read_text())  # a finished copy: it gets launched
    monkeypatch.setenv("DDPCOURSE_LAB_SOURCE", "labs")
    monkeypatch.setattr(paths, "lab_folder", lambda: tmp_path)
    launched = []

    def fake_launch(path, nproc, **options):
        launched.append(path)
        return RunResult(file=str(path), nproc=nproc, returncode=0, duration=0.0)
    monkeypatch.setattr("ddpcourse.checks.launch", fake_launch)
    report = check_lab(solution.name[:2], nproc=1, quiet=True)
    assert launched == [tmp_path / solution.name] and report.launched
    assert calls == {"resolve_lab": 1, "solution_of": 1}
    lab = paths.find_lab(tmp_path / solution.name)
    assert (lab.number, lab.solution) == (solution.name[:2], solution)
    with pytest.raises(dataclasses.FrozenInstanceError):
        lab.number = "99"


def test_a_path_that_does_not_exist_is_an_error_never_another_lab(tmp_path, no_launch):
    with pytest.raises(FileNotFoundError, match="no such file: 01_my_copy_typo.py"):
        check_lab("01_my_copy_typo.py")
    assert main(["check", str(tmp_path / "00_first_collectives.py")]) == 2


def test_a_value_the_lab_did_not_report_is_a_fail_naming_it(tmp_path, monkeypatch):
    """No traceback out of check_lab: the run 'succeeded' but one rank never reported mean_loss."""
    from ddpcourse.launch.launcher import RunResult

    def launched(path, nproc, **kwargs):
        reports = {0: {"local_loss": 1.0, "local_grad_norm": 1.0, "max_grad_norm": 6.0, "all_losses": [1.0, 1.5]},
                   1: {"local_loss": 1.5, "local_grad_norm": 6.0, "max_grad_norm": 6.0, "all_losses": [1.0, 1.5],
                       "mean_loss": 1.25}}
        return RunResult(file=str(path), nproc=nproc, returncode=0, duration=1.0, reports=reports, launched=True)

    monkeypatch.setattr("ddpcourse.checks.launch", launched)
    report = check_lab(SOLUTIONS[0], nproc=2, quiet=True)
    assert not report.passed and report.launched
    (failure,) = report.failures
    assert failure.claim == "the lab reports every value its check reads" and failure.nproc == 2
    assert "'mean_loss'" in failure.detail and "[0]" in failure.detail


@wrong_version("00_first_collectives.py",
               ("return total / world_size", "return total"),
               ("op=dist.ReduceOp.MAX", "op=dist.ReduceOp.SUM"),
               ("return torch.stack(parts)", "return torch.stack(parts[::-1])"), nproc=None)
def test_lab00_sum_instead_of_mean_sum_instead_of_max_and_wrong_gather_order(report):
    # the lab's own world sizes, 1, 2, 3: it stops at the first failing one
    assert not report.passed
    # with one rank a sum, a max and a one-element gather are all right: only more ranks reveal the mistakes
    assert [c.passed for c in report.results if c.name.startswith("nproc=1")] == [True] * 4
    assert "not run with nproc=3" in report.skipped
    mean = detail(report, "nproc=2: mean_loss")
    assert not mean.passed and "the SUM over ranks" in mean.detail and "divide the sum by the world size" in mean.detail
    peak = detail(report, "nproc=2: max_grad_norm")
    assert not peak.passed and "op=dist.ReduceOp.MAX" in peak.detail
    gathered = detail(report, "nproc=2: all_losses")
    assert not gathered.passed and "not in rank order" in gathered.detail
    assert detail(report, "nproc=2: each rank's own values").passed  # told apart from the mistakes above


@wrong_version("00_first_collectives.py",
               ("dist.all_reduce(total, op=dist.ReduceOp.SUM)", "dist.reduce(total, dst=0, op=dist.ReduceOp.SUM)"),
               ("largest = value.clone()", "largest = value"), nproc=2)
def test_lab00_result_on_rank0_only_and_in_place_reduction(report):
    mean = detail(report, "mean_loss")
    assert not mean.passed and "reached rank 0 only" in mean.detail and "rank 1" in mean.detail
    assert "rank 0:" not in mean.detail  # rank 0 itself is right
    inputs = detail(report, "left unchanged")
    assert not inputs.passed and "reduce a clone()" in inputs.detail
    assert "rank 0: local_grad_norm became 6 (was 1): global_max changed its input in place" in inputs.detail


def test_every_lab_declares_a_check_that_can_fail(tmp_path):
    """Each lab of solutions/ has a LabCheck (what it judges with, on which world sizes, with which runs) whose
    judge fails a run that reported nothing: a judge that passes anything (``lambda results: []``) fails here.
    A judge that raises on the missing values fails too: check_lab turns that into a failed check."""
    from ddpcourse.checks import LabCheck, declared_check
    from ddpcourse.launch.launcher import RunResult
    from ddpcourse.paths import lab_number

    for solution in lab_files(COURSE_ROOT / "solutions"):
        declared = declared_check(lab_number(solution))
        assert isinstance(declared, LabCheck), solution.name
        assert callable(declared.judge) and declared.nprocs and all(n >= 1 for n in declared.nprocs)
        size = declared.nprocs[0]
        silent = RunResult(file=str(solution), nproc=size, returncode=0, duration=1.0,
                           reports={rank: {} for rank in range(size)}, launched=True)
        results = {name: silent for name in declared.runs(str(tmp_path), size)} if declared.runs else silent
        try:
            outcome = declared.judge(results)
        except (KeyError, TypeError, ValueError, IndexError):
            continue
        assert outcome and not all(check.passed for check in outcome), f"{solution.name}: its judge passes a silent run"
    assert declared_check("99") is None


def test_a_lab_whose_harness_settings_changed_fails_with_them_named():
    from types import SimpleNamespace

    from ddpcourse.checks import changed_settings

    run = SimpleNamespace(values=lambda key: [{"steps": 2}] if key == "config" else [])
    assert changed_settings(run, {"steps": 2}) == []
    [check] = changed_settings(run, {"steps": 3})
    assert not check.passed and "the lab reports {'steps': 2}, expected {'steps': 3}" in check.detail


def test_every_recorded_run_belongs_to_a_test_that_replays_it():
    """tests/recorded_runs/<file>/<test>.json.gz: a recording whose test was renamed or removed is dead weight."""
    import importlib

    from recorded_runs import NOTEBOOK_CHECKS, RECORDINGS

    files = sorted(path for path in RECORDINGS.glob("*/*.json.gz") if path.parent != NOTEBOOK_CHECKS)
    assert files
    for path in files:
        module = importlib.import_module(path.parent.name)
        test_name = path.name.removesuffix(".json.gz").split("[")[0]
        assert hasattr(module, test_name), f"{path.relative_to(COURSE_ROOT)}: no test {test_name} in {module.__name__}"
