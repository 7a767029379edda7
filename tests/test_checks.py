"""Lab checks: every solution passes, every generated lab fails naming its open TODO, and realistic
wrong versions fail with the message that names the mistake."""
import pytest

from ddpcourse.__main__ import main
from ddpcourse.checks import CACHE_ENV, check_lab
from ddpcourse.authoring.makelabs import make_lab
from ddpcourse.paths import COURSE_ROOT, lab_files
from ddpcourse.authoring.todos import reveal_hint, solution_regions, todo_line
from helpers import detail, wrong_version

SOLUTIONS = lab_files(COURSE_ROOT / "solutions")


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.name)
def test_solution_passes_its_check(solution):
    report = check_lab(solution, quiet=True)
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
    lab.write_text(text.replace("    raise NotImplementedError('TODO 1", "    return value  # raise NotImplementedError('TODO 1", 1))
    reveal_hint(lab)  # the learner asked for TODO 2's level 2 ...
    report = check_lab(lab)
    assert report.todos == [2, 3] and not report.launched
    shown = capsys.readouterr().out
    assert "has open TODOs (TODOs 2, 3)" in shown
    assert f": {solution_regions(solution)[2].hints[2]}" in shown  # ... so the check shows level 2


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
    monkeypatch.delenv(CACHE_ENV, raising=False)  # the solution's real verdict may be cached: judge this run
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


def test_check_cache_keeps_only_passing_verdicts_of_identical_inputs(tmp_path, monkeypatch):
    from ddpcourse.checks import CACHE_ENV, Check, _cached, _remember
    from ddpcourse.checks import lab00 as module

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    lab = tmp_path / "00_first_collectives.py"
    lab.write_text("print('v1')\n")
    _remember(lab, module, 2, [Check("a", True), Check("b", False, "why")])
    assert _cached(lab, module, 2) is None  # a failure is never reused
    _remember(lab, module, 2, [Check("a", True)])
    assert [c.name for c in _cached(lab, module, 2)] == ["a"]
    assert _cached(lab, module, 3) is None  # another world size
    elsewhere = tmp_path / "copy" / lab.name  # the key is the content, not the path (test_learner_path's copy)
    elsewhere.parent.mkdir()
    elsewhere.write_text(lab.read_text())
    assert [c.name for c in _cached(elsewhere, module, 2)] == ["a"]
    lab.write_text("print('v2')\n")
    assert _cached(lab, module, 2) is None  # another lab text


def test_a_verdict_another_process_is_computing_is_awaited_and_a_dead_claim_is_void(tmp_path, monkeypatch):
    """The suite computes the solutions' verdicts in a background process (conftest.py): a check that needs
    one of them meanwhile waits for it instead of launching the same runs again."""
    import subprocess
    import sys
    import threading
    import time

    from ddpcourse.checks import CACHE_ENV, Check, _cache_file, _cached, _claim_file, _remember
    from ddpcourse.checks import lab00 as module

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    lab = tmp_path / "00_first_collectives.py"
    lab.write_text("print('v1')\n")
    claim = _claim_file(_cache_file(lab, module, 2))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claim.write_text(str(other.pid))  # another live process is checking this very text on 2 ranks
        assert _cached(lab, module, 2) is None  # without wait (the status table): no verdict yet

        def verdict_arrives():
            _remember(lab, module, 2, [Check("a", True)])
            claim.unlink()

        threading.Timer(0.5, verdict_arrives).start()
        start = time.monotonic()
        assert [c.name for c in _cached(lab, module, 2, wait=True)] == ["a"]
        assert time.monotonic() - start >= 0.4  # it waited for the other process's verdict
    finally:
        other.kill()
        other.wait()
    _claim_file(_cache_file(lab, module, 3)).write_text(str(other.pid))  # its claimant died (a crashed check)
    start = time.monotonic()
    assert _cached(lab, module, 3, wait=True) is None  # nothing to wait for: this process checks it itself
    assert time.monotonic() - start < 1.0


def test_check_lab_runs_in_threads_one_judgement_at_a_time(monkeypatch):
    """check_lab may be called from threads (a notebook's widgets, a caller's pool); the checks recompute
    expected values with torch's global RNG (toy.build_model seeds it), so two judgements must not interleave."""
    import threading
    import time

    import torch

    from ddpcourse.checks import Check
    from ddpcourse.checks import lab00 as module
    from ddpcourse.launch.launcher import RunResult

    def launched(path, nproc, **kwargs):
        return RunResult(file=str(path), nproc=nproc, returncode=0, duration=1.0, launched=True)

    torch.manual_seed(1)
    expected = torch.rand(2).tolist()

    def seeded_draws(run):
        torch.manual_seed(1)
        first = torch.rand(1).item()
        time.sleep(0.2)  # the other thread's judgement would reseed the RNG and draw here
        return [Check("the draws of seed 1", [first, torch.rand(1).item()] == expected)]

    monkeypatch.setattr("ddpcourse.checks.launch", launched)
    monkeypatch.setattr(module, "LAB_CHECK", module.LabCheck(judge=seeded_draws, nprocs=module.NPROCS))
    monkeypatch.delenv(CACHE_ENV, raising=False)
    reports = []
    threads = [threading.Thread(target=lambda: reports.append(check_lab(SOLUTIONS[0], nproc=2, quiet=True)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [report.passed for report in reports] == [True, True]


def test_every_lab_declares_its_check():
    """Each lab of solutions/ has a LabCheck: what it judges with, on which world sizes, with which runs."""
    from ddpcourse.checks import LabCheck, declared_check
    from ddpcourse.paths import lab_number

    for solution in lab_files(COURSE_ROOT / "solutions"):
        declared = declared_check(lab_number(solution))
        assert isinstance(declared, LabCheck), solution.name
        assert callable(declared.judge) and declared.nprocs and all(n >= 1 for n in declared.nprocs)
    assert declared_check("99") is None
