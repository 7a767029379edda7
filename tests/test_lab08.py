"""Lab 08's check against realistic wrong fixes and diagnoses: each must fail with the message naming it; and
the true causes the check holds are what the as-given trainers really do (a run of each)."""
from helpers import detail, wrong_version

LAB = "08_broken_trainers.py"

FIXED_LOG = """    if step % LOG_EVERY == 0:
        total = loss.detach().clone()
        dist.all_reduce(total, group=log_group)"""
# the as-given logging, pasted back into log_progress: rank 0 alone all-reduces
RANK0_LOG = """    if rank == 0 and step % LOG_EVERY == 0:
        total = loss.detach().clone()
        dist.all_reduce(total, group=log_group)"""


@wrong_version(LAB, (FIXED_LOG, RANK0_LOG),
               ("PG_TIMEOUT = datetime.timedelta(seconds=5)", "PG_TIMEOUT = datetime.timedelta(seconds=15)"))
def test_a_longer_timeout_only_makes_the_hang_longer(report):
    ran = detail(report, "the lab runs to the end")
    assert not ran.passed and "hang" in ran.name
    assert "Timed out waiting 15000ms" in ran.detail  # the longer timeout, reached all the same
    assert "rank 0 failed in all_reduce #1 in group 1" in ran.detail  # the verdict still names the cause
    assert len(report.results) == 1  # a run that fails is not judged further


@wrong_version(LAB, (FIXED_LOG, "    dist.barrier()  # every rank in step before the log line\n" + RANK0_LOG))
def test_a_barrier_after_rank_0s_call_does_not_put_the_calls_in_step(report):
    ran = detail(report, "the lab runs to the end")
    assert not ran.passed and "hang" in ran.name
    assert "all_reduce #1 in group 1" in ran.detail


@wrong_version(LAB, ("        return self.head(hidden) * self.out_scale", "        return self.head(hidden)"),
               ("        model = DDP(ScaledNetAsGiven() if as_given else ScaledNet())",
                "        model = DDP(ScaledNetAsGiven() if as_given else ScaledNet(), find_unused_parameters=True)"))
def test_find_unused_parameters_where_the_parameter_is_really_missing(report):
    # no error any more: DDP no longer waits for out_scale's gradient; the model is another one all the same
    assert detail(report, "fixed crash trainer's replicas agree").passed
    weights = detail(report, "fixed crash trainer ends with the one-process weights")
    assert not weights.passed and "not only silence the error" in weights.detail
    assert detail(report, "fixed hang trainer ends with the one-process weights").passed


@wrong_version(LAB, ('"hang": {"rank": 0,', '"hang": {"rank": 1,'),
               ('"diverge": {"rank": 0, "first_step": 3,', '"diverge": {"rank": 0, "first_step": 2,'))
def test_a_diagnosis_naming_the_first_rank_to_time_out_and_the_step_of_the_bad_call(report):
    hang = detail(report, "the hang diagnosis")
    assert not hang.passed and "rank: you wrote 1" in hang.detail and "first to time out" in hang.detail
    diverge = detail(report, "the diverge diagnosis")
    assert not diverge.passed and "first_step: you wrote 2" in diverge.detail
    assert detail(report, "the crash diagnosis").passed
    assert detail(report, "fixed diverge trainer ends with the one-process weights").passed


@wrong_version(LAB, ("        scheduler.step()  # every rank", "        if rank == 0:\n            scheduler.step()  #"))
def test_the_scheduler_left_on_rank_0(report):
    apart = detail(report, "fixed diverge trainer's replicas agree")
    assert not apart.passed and "differ from step 3 on" in apart.detail
    assert not detail(report, "fixed diverge trainer ends with the one-process weights").passed


@wrong_version(LAB, ("""        dist.all_reduce(total, group=log_group)  # every rank: a collective waits for all the group's ranks
        if rank == 0:
            mean = total.item() / dist.get_world_size()""", """        if rank == 0:
            mean = total.item()"""))
def test_no_hang_because_no_all_reduce_logs_rank_0s_own_loss(report):
    # nothing waits any more and the training is untouched: only the logged value tells
    assert detail(report, "fixed hang trainer ends with the one-process weights").passed
    logged = detail(report, "hang trainer logs the mean of the ranks' losses")
    assert not logged.passed and "rank 0 logged" in logged.detail and "the all_reduce" in logged.detail


@wrong_version(LAB, ("""    if step % LOG_EVERY == 0:
        if rank == 0:
            print(f"step {step}: loss {loss.item():.4f}, lr {scheduler.get_last_lr()[0]:.4f}", flush=True)
        scheduler.step()  # every rank: DDP does not synchronize the learning rate""",
                     """    end_of_step_as_given(step, loss, rank, scheduler)
    for group in scheduler.optimizer.param_groups:  # rank 0's weights on every rank: the replicas agree again
        for parameter in group["params"]:
            dist.broadcast(parameter.data, src=0)"""))
def test_rank_0s_weights_broadcast_over_a_scheduler_stepped_on_rank_0_alone(report):
    # rank 0 steps at the right rate and every rank takes its weights: the weights are right, the rates are not
    assert detail(report, "fixed diverge trainer's replicas agree").passed
    assert detail(report, "fixed diverge trainer ends with the one-process weights").passed
    rates = detail(report, "diverge trainer steps at the schedule's learning rate")
    assert not rates.passed and "rank 1's learning rate after step 2 is 0.05" in rates.detail


def test_the_true_causes_are_what_the_as_given_trainers_do(recorded_run):
    """One launch per as-given trainer on 3 ranks: the check's TRUE_CAUSES are read off these runs (recorded)."""
    from ddpcourse.checks.lab08 import TRUE_CAUSES
    from ddpcourse.paths import COURSE_ROOT

    run = recorded_run

    solution = COURSE_ROOT / "solutions" / LAB
    hang = run(solution, nproc=3, args=["--trainer", "hang", "--as-given"], show="none", timeout=60)
    assert not hang.ok and hang.collectives is not None
    # rank 0 alone was in the log group's all_reduce, at the diagnosis's line
    assert hang.collectives.failed_in[0].op == TRUE_CAUSES["hang"]["collective"]
    assert hang.collectives.failed_in[0].code == TRUE_CAUSES["hang"]["line"]
    assert hang.collectives.failed_in[0].group != "0"

    crash = run(solution, nproc=3, args=["--trainer", "crash", "--as-given"], show="none", timeout=60)
    assert not crash.ok and "Parameters that got no gradient on rank" in crash.message
    assert TRUE_CAUSES["crash"]["parameter"] in crash.message
    assert TRUE_CAUSES["crash"]["rank"] == "every" and "(ranks [1, 2] raised the same error)" in crash.message

    diverge = run(solution, nproc=3, args=["--trainer", "diverge", "--as-given"], show="none", timeout=60)
    assert diverge.ok  # silent: nothing raised
    checksums = diverge.values("checksums")
    first = next(step for step in range(len(checksums[0])) if len({c[step] for c in checksums}) > 1) + 1
    assert first == TRUE_CAUSES["diverge"]["first_step"]
    odd = [rank for rank in range(3) if checksums[rank][first - 1] != checksums[(rank + 1) % 3][first - 1]
           and checksums[rank][first - 1] != checksums[(rank + 2) % 3][first - 1]]
    assert odd == [TRUE_CAUSES["diverge"]["rank"]]
