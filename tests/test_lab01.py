"""Lab 01 (data parallel by hand, then DDP): realistic wrong versions fail with the message naming the
mistake. Each runs on 2 ranks (on 1 rank a sum, a skipped or a partial all-reduce are all invisible);
one file combines two mistakes when different checks catch them, to save a launch."""
from helpers import detail, wrong_version

LAB = "01_dataparallel_vs_ddp.py"
RIGHT_SHARD = "start = (step * world_size + rank) * per_rank_batch\n    return"
REDUCE_LOOP = "for param in model.parameters():\n        dist.all_reduce(param.grad)\n        param.grad /= world_size"


@wrong_version(LAB,
               (RIGHT_SHARD, "start = step * world_size * per_rank_batch\n    return"),
               ("        param.grad /= world_size\n", ""), nproc=2)
def test_lab01_same_shard_on_every_rank_and_summed_gradients(report):
    shard = detail(report, "own block")
    assert not shard.passed and "every rank trains on the same samples [0, 1, 2, 3]" in shard.detail
    grads = detail(report, "averaged gradients")
    assert not grads.passed and "the SUM over ranks, 2x the mean" in grads.detail
    assert "divide by world_size" in grads.detail
    # Both ranks applied the same (wrong) gradient: the replicas agree, and the check says so.
    assert detail(report, "identical after training by hand").passed
    assert not detail(report, "weights after 3 steps by hand").passed


@wrong_version(LAB, ("        dist.all_reduce(param.grad)\n", ""), nproc=2)
def test_lab01_all_reduce_skipped(report):
    grads = detail(report, "averaged gradients")
    assert not grads.passed and "no all_reduce combined them" in grads.detail
    assert "rank 0:" in grads.detail and "rank 1:" in grads.detail
    replicas = detail(report, "identical after training by hand")
    assert not replicas.passed and "parameter fc1.weight: 2 versions (ranks 0 vs ranks 1)" in replicas.detail
    assert detail(report, "own block").passed
    agree = detail(report, "DDP and the hand-written version agree")
    assert not agree.passed and detail(report, "with DDP equal one process").passed


@wrong_version(LAB, (REDUCE_LOOP, REDUCE_LOOP.replace("model.parameters()", "model.fc1.parameters()")
                               .replace("all_reduce(param.grad)", "all_reduce(param.grad, op=dist.ReduceOp.AVG)")), nproc=2)
def test_lab01_only_some_parameters_reduced_with_avg_and_divided(report):
    grads = detail(report, "averaged gradients")
    assert not grads.passed
    assert "fc1.weight, fc1.bias: the mean divided by world_size once more (2x too small)" in grads.detail
    assert "op=ReduceOp.AVG already averages" in grads.detail
    assert "only fc1.weight, fc1.bias were all-reduced; fc2.weight, fc2.bias kept this rank's own gradient" in grads.detail
    replicas = detail(report, "identical after training by hand")
    assert not replicas.passed and "fc2.weight" in replicas.detail and "fc1.weight" not in replicas.detail
