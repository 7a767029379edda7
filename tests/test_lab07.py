"""Lab 07 (ShardedOptimizer, FSDP): realistic wrong versions fail with the message that names the mistake. The
solution passing on 1, 2 and 3 ranks is notebook 07's check cell (nbval), as for every lab.

Mutants whose mistakes different checks catch share a launch; the two that crash run alone.
"""
from helpers import detail, wrong_version

LAB = "07_sharded_data_parallel.py"
OWN = 'own_groups = [{**group, "params": [p for p in group["params"] if self.owner[id(p)] == self.rank]}'
BROADCAST = ("        works = [dist.broadcast(p, group_src=self.owner[id(p)], group=self.process_group, async_op=True)\n"
             "                 for p in self.params]\n")
FREE_AFTER_FORWARD = "    def _post_forward(self, unit, args, output):\n        self._free(unit)\n"
MASTER = "torch.cat([p.detach().reshape(-1) for p in unit.params]).to(torch.float32)"
AVERAGE = "op=dist.ReduceOp.AVG, group=self.process_group,"
REDUCE_SCATTER = ("        reduced = grad.new_empty(unit.shard_numel)\n"
                  "        work = dist.reduce_scatter_single(reduced, grad, op=dist.ReduceOp.AVG, group=self.process_group,\n"
                  "                                          async_op=True)\n")
PADDING = "unit.padded = math.ceil(unit.total / self.world_size) * self.world_size"


@wrong_version(LAB, (OWN, 'own_groups = [{**group, "params": group["params"]}'),
               (FREE_AFTER_FORWARD, "    def _post_forward(self, unit, args, output):\n        pass  # kept for the "
                                    "backward\n"),
               (MASTER, MASTER.replace("torch.float32", "self.compute_dtype")), nproc=2)
def test_lab07_every_rank_steps_everything_full_parameters_kept_and_bf16_masters(report):
    for title in ("SGD with momentum", "Adam"):
        owned = detail(report, f"ShardedOptimizer ({title}): each rank's optimizer holds")
        assert not owned.passed and "every rank steps everything" in owned.detail
        assert detail(report, f"ShardedOptimizer ({title}, two param groups) equals").passed  # same numbers
    memory = detail(report, "full copy freed after its forward")
    assert not memory.passed and "full parameters kept after forward" in memory.detail
    calls = detail(report, "collectives per step")
    assert not calls.passed and "5 all-gathers in a step, expected 10" in calls.detail
    mixed = detail(report, "compute_dtype=torch.bfloat16")
    assert not mixed.passed and "mixed precision master weights lost (shards in bf16)" in mixed.detail
    assert detail(report, "FSDP (fp32) equals one process").passed


@wrong_version(LAB, (BROADCAST, "        works = []  # each rank keeps its own update\n"),
               (AVERAGE, "group=self.process_group,"), nproc=2)
def test_lab07_updated_parameters_never_sent_and_gradients_summed(report):
    for title in ("SGD with momentum", "Adam"):
        equal = detail(report, f"ShardedOptimizer ({title}, two param groups) equals")
        assert not equal.passed and "forgot to send the updated parameters" in equal.detail
        assert detail(report, f"ShardedOptimizer ({title}): each rank's optimizer holds").passed
    fsdp = detail(report, "FSDP (fp32) equals one process")
    assert not fsdp.passed and "2x the mean: the SUM over ranks" in fsdp.detail
    assert detail(report, "collectives per step").passed and detail(report, "freed after its forward").passed


@wrong_version(LAB, (REDUCE_SCATTER, "        reduced = grad\n        work = dist.all_reduce(grad, op=dist.ReduceOp.AVG, "
                                     "group=self.process_group, async_op=True)\n"), nproc=2)
def test_lab07_all_reduce_without_slicing(report):
    (failure,) = report.failures  # a crash: the shard cannot take the whole unit's gradient
    assert "the lab runs to the end" in failure.name
    assert "all_reduce leaves every rank the full gradient" in failure.detail and "reduce-scatter" in failure.detail


@wrong_version(LAB, (REDUCE_SCATTER, "        reduced = grad\n        work = dist.all_reduce(grad, op=dist.ReduceOp.AVG, "
                                     "group=self.process_group, async_op=True)\n"), nproc=1)
def test_lab07_all_reduce_on_one_rank_runs_but_the_collectives_give_it_away(report):
    # one rank: the whole gradient is the shard's, so it runs, and the dispatcher's log shows what was missing
    calls = detail(report, "collectives per step")
    assert not calls.passed and "gradients not reduce-scattered" in calls.detail and "allreduce_" in calls.detail
    assert detail(report, "FSDP (fp32) equals one process").passed


@wrong_version(LAB, (PADDING, "unit.padded = unit.total // self.world_size * self.world_size"), nproc=3)
def test_lab07_padding_rounded_down_fails_with_three_ranks(report):
    # the course model's units split evenly over 2 ranks: only 3 show the mistake
    (failure,) = report.failures
    assert failure.nproc == 3 and "padding wrong" in failure.detail
