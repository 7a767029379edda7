"""Lab 02's check against realistic wrong versions of the solution (each names its mistake).

Each mutant combines mistakes that different checks catch, so three launches cover the four mistakes the
issue lists (parameters only, broadcast_object_list, a fixed source rank, unsharded data) and three more
(a sampler seeded per rank, an all-reduce instead of a broadcast, an unshuffled sampler); a fourth launch
drops the solution's torch.no_grad(), which only torch's warning in the training's backward shows."""
from helpers import detail, wrong_version

LAB = "02_initialization_and_broadcast.py"
NO_GRAD = ("    with torch.no_grad():  # a copy into the parameters, not a step of the model: "
           "autograd must not record it\n")
LOOP = ("        for tensor in list(module.parameters()) + list(module.buffers()):\n"
        "            dist.broadcast(tensor, src=src)")
SAMPLER = "sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=SEED)"


@wrong_version(LAB,
               (LOOP, LOOP.replace("list(module.parameters()) + list(module.buffers())", "module.parameters()")),
               ("dist.broadcast(tensor, src=src)", "dist.broadcast(tensor, src=0)"),
               (SAMPLER, "sampler = None"), nproc=2)
def test_lab02_parameters_only_fixed_source_rank_and_unsharded_data(report):
    values = detail(report, "src's parameters")
    assert not values.passed and "every rank holds rank 0's parameters, not rank 1's" in values.detail
    assert "pass src to dist.broadcast" in values.detail and "src=0:" not in values.detail  # src=0 was right
    buffers = detail(report, "src's buffers")
    assert not buffers.passed and "only the parameters were broadcast" in buffers.detail
    assert "module.buffers()" in buffers.detail and "norm.running_mean" in buffers.detail
    data = detail(report, "own shard")
    assert not data.passed and "every rank read the same 96 samples" in data.detail
    assert "DistributedSampler" in data.detail
    assert detail(report, "tensor objects").passed  # in place, even if incomplete
    # part 2 broadcasts from rank 0 a model without buffers: this broadcast is right there
    assert detail(report, "before DDP").passed and detail(report, "after DDP training").passed


@wrong_version(LAB,
               (LOOP, "        tensors = [t.data for t in list(module.parameters()) + list(module.buffers())]\n"
                      "        dist.broadcast_object_list(tensors, src=src)"),
               (SAMPLER, SAMPLER.replace("seed=SEED", "seed=SEED + rank")), nproc=2)
def test_lab02_broadcast_object_list_and_sampler_seeded_per_rank(report):
    values = detail(report, "src's parameters")
    assert not values.passed and "still hold their own initial parameters" in values.detail
    assert "broadcast_object_list" in values.detail and "NEW tensors" in values.detail
    before = detail(report, "before DDP")
    assert not before.passed
    data = detail(report, "own shard")
    assert not data.passed and "shards overlap" in data.detail and "same seed" in data.detail
    # DDP(model, init_sync=False) does not repair the start: the replicas train apart
    after = detail(report, "after DDP training")
    assert not after.passed and "DDP(model, init_sync=False) broadcast nothing" in after.detail
    assert not detail(report, "from rank 0's start").passed


@wrong_version(LAB,
               ("dist.broadcast(tensor, src=src)", "dist.all_reduce(tensor)"),
               (SAMPLER, SAMPLER.replace("shuffle=True", "shuffle=False")), nproc=2)
def test_lab02_all_reduce_instead_of_broadcast_and_unshuffled_sampler(report):
    values = detail(report, "src's parameters")
    assert not values.passed and "not rank 0's start" in values.detail
    # every rank holds the same sum: identical replicas, trained in sync, but not from rank 0's start
    assert detail(report, "before DDP").passed and detail(report, "after DDP training").passed
    trained = detail(report, "from rank 0's start")
    assert not trained.passed and "must hold rank 0's values unchanged" in trained.detail
    data = detail(report, "own shard")
    assert not data.passed and "shuffle=True" in data.detail and "other batches" in data.detail


@wrong_version(LAB, (NO_GRAD + LOOP, "\n".join(line[4:] for line in LOOP.splitlines())), nproc=2)
def test_lab02_broadcast_recorded_by_autograd(report):
    autograd = detail(report, "not recorded by autograd")
    assert not autograd.passed and "ranks [0, 1]" in autograd.detail
    assert "c10d::broadcast_: an autograd kernel was not registered" in autograd.detail
    assert "with torch.no_grad():" in autograd.detail and "tensor.detach()" in autograd.detail
    # the values are right: only the warning tells this version from the solution
    assert [c.name for c in report.failures] == [autograd.name]
