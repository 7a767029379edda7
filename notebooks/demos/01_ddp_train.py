"""Demo for notebook 01: what DistributedDataParallel does, reported so the notebook can check it.

python -m ddpcourse run notebooks/demos/01_ddp_train.py --nproc 3

One launch of 3 processes reports everything the notebook's DDP sections verify. Worlds of 1, 2 and 3
ranks come from process groups: ranks 0 and 1 form a group of 2 (DDP's process_group=), rank 2 a group
of its own, and all three the default group.
  1. training: STEPS steps of DDP in each world size N (N = 2 and N = 1 at the same time, then N = 3), each
     rank on its own block of PER_RANK_BATCH samples; the weights, and for N = 2 the gradients of the
     first step and what a communication hook saw (bytes, calls during backward);
  2. construction: replicas built with different seeds are identical once wrapped (N = 3);
  3. pitfalls (N = 2): reduction='sum', an unequal last batch (and its exact fix); for the notebook's Appendix F,
     DistributedSampler's padding, and a per-rank DataLoader(drop_last=True) on unequal shares (steps per rank;
     run under ddp.join()) against DistributedSampler(drop_last=True);
  4. the order of DDP's averaging without a hook: a float16 gradient that a sum would overflow (N = 2), and
     unequal float16 gradients whose mean DDP rounds (N = 3), against a float16 all_reduce(SUM) then a division;
  5. timing (N = 2): milliseconds per DDP step of a larger TinyNet (CPU figures; the notebook compares);
  6. every collective DDP calls in its constructor and in each forward and backward of 3 iterations (N = 2),
     with the default settings, with find_unused_parameters=True, and for a model with BatchNorm buffers;
  7. buckets (N = 2): how many per step, and how many gradients were still to come when each was all-reduced;
  8. the constructor's checks (N = 2): a rank with more parameters, a rank with a wider layer;
  9. BatchNorm at a fixed global batch (N = 2), and SyncBatchNorm on CPU tensors (train mode, then eval mode);
 10. a DataLoader training loop over 2 epochs with DistributedSampler, without and with set_epoch (N = 2).
Rank 2 takes part in what needs all three ranks (sections 1 and 2, section 4's N = 3) and waits during the rest.
"""
import contextlib
import gc
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddpcourse import init_distributed, report
from ddpcourse.lab import CollectiveLog, compare_replicas
from ddpcourse.toy import build_model, make_dataset

# ----------------------------------------------------------------------------- config
SEED = 0
PER_RANK_BATCH = 4      # B; the global batch of one step is N * B samples
STEPS = 3               # k
LR = 0.1
TIMING_FEATURES, TIMING_HIDDEN = 256, 1024   # the model the notebook also times with its DP simulation
TIMING_BATCH = 64       # per rank
TIMING_STEPS = 20

rank, world_size, device = init_distributed("gloo")  # CPU tensors on any machine
if world_size != 3:
    raise SystemExit("this demo needs 3 ranks: python -m ddpcourse run notebooks/demos/01_ddp_train.py --nproc 3")
pair = dist.new_group([0, 1])       # a world of N = 2 (every rank must call new_group, members or not)
alone = dist.new_group([2])         # a world of N = 1
my_group = pair if rank in (0, 1) else alone
in_pair = rank in (0, 1)
x_all, y_all = make_dataset(samples=96, seed=SEED).tensors


def block(first, rank, size):
    """Indices of `rank`'s block of `size` samples in a global batch that starts at sample `first`."""
    start = first + rank * size
    return list(range(start, start + size))


def spans(shards):
    """'0..3, 8..11, 16..19': the first and last sample of each block this rank trained on."""
    return ", ".join(f"{s[0]}..{s[-1]}" for s in shards)


# ----------------------------------------------------------------------------- 1. DDP training
def train(group):
    """STEPS steps of DDP in `group`; returns the model, the wrapper, its samples, first gradients, hook log."""
    n, group_rank = dist.get_world_size(group), dist.get_rank(group)
    model = build_model(SEED)
    ddp_model = DDP(model, process_group=group)  # gloo on CPU: no device_ids
    seen = {"bytes": [], "in_backward": [], "in_step": False}

    def counting_hook(state, bucket):
        """Record what DDP hands to the all-reduce, then do exactly what DDP does by default."""
        buffer = bucket.buffer()
        seen["bytes"].append(buffer.numel() * buffer.element_size())
        seen["in_backward"].append(seen["in_step"])
        return default_hooks.allreduce_hook(state, bucket)  # torch's default hook (the notebook's section 2: its result)

    ddp_model.register_comm_hook(group, counting_hook)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=LR)  # each rank steps its own optimizer
    shards = []
    for step in range(STEPS):
        indices = block(step * n * PER_RANK_BATCH, group_rank, PER_RANK_BATCH)
        shards.append(indices)
        optimizer.zero_grad()
        loss = F.mse_loss(ddp_model(x_all[indices]), y_all[indices])
        seen["in_step"] = True
        loss.backward()  # the hook's all-reduces run in here, bucket by bucket
        seen["in_step"] = False
        if step == 0:
            first_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        optimizer.step()
    return model, ddp_model, shards, first_grads, seen


model, ddp_model, shards, first_grads, seen = train(my_group)  # N = 2 on ranks 0, 1; N = 1 on rank 2
trained = {str(dist.get_world_size(my_group)): {"shards": shards, "weights": dict(model.named_parameters())}}
parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
first_shard = shards[0]
if in_pair:
    print(f"N = 2: {STEPS} steps on this rank's blocks {spans(shards)}; "
          f"all-reduced per step: {sum(seen['bytes']) // STEPS} bytes = the gradient size ({parameter_bytes} "
          f"bytes), {len(seen['bytes']) // STEPS} bucket(s), all during backward: {all(seen['in_backward'])}")
    report(shards=shards, first_grads=first_grads, hook_bytes=seen["bytes"], hook_in_backward=seen["in_backward"],
           parameter_bytes=parameter_bytes)
    # What changes for code that used the plain model: its attributes and state_dict names sit under .module.
    report(wrapper_keys=list(ddp_model.state_dict()), module_is_model=ddp_model.module is model,
           fc1_through_wrapper=hasattr(ddp_model, "fc1"))

world_model = train(dist.group.WORLD)  # N = 3
trained["3"] = {"shards": world_model[2], "weights": dict(world_model[0].named_parameters())}
replicas = compare_replicas(world_model[1])
print(f"N = 3: {STEPS} steps on this rank's blocks {spans(world_model[2])}: {replicas}")
report(trained=trained, replicas=replicas.as_dict())

# ----------------------------------------------------------------------------- 2. construction
different = build_model(seed=100 + rank)  # a different start on every rank
before = compare_replicas(different)
wrapped = DDP(different)                 # the constructor broadcasts rank 0's parameters and buffers
after = compare_replicas(wrapped)
print(f"built with seeds 100+rank: identical before DDP(): {before.identical}, after: {after.identical}")
report(identical_before_wrap=before.identical, identical_after_wrap=after.identical,
       replicas_before_wrap=before.as_dict(), counted=(before.parameters, before.buffers))

# ----------------------------------------------------------------------------- 3. pitfalls (N = 2)
def one_ddp_gradient(indices, loss_fn):
    """Every gradient after one DDP backward of ranks 0 and 1 on this rank's `indices`, from the seed's start."""
    net = DDP(build_model(SEED), process_group=pair)
    loss_fn(net(x_all[indices]), y_all[indices]).backward()
    return {name: p.grad for name, p in net.module.named_parameters()}


def pitfalls(n=2):
    # 3a. reduction='sum': each rank's loss is a sum over its block; DDP still divides by n.
    sum_grads = one_ddp_gradient(first_shard, lambda out, y: F.mse_loss(out, y, reduction="sum"))

    # 3b. an unequal last batch: the global batch has n * B - 2 samples, the last rank gets B - 2.
    uneven_total = n * PER_RANK_BATCH - 2
    uneven = [i for i in block(0, rank, PER_RANK_BATCH) if i < uneven_total]
    uneven_grads = one_ddp_gradient(uneven, F.mse_loss)  # each rank's mean, then DDP's mean of the means
    # The exact fix: a sum over this rank's samples divided by the GLOBAL count, times n
    # (DDP divides by n again): every sample then weighs 1 / global count.
    count = torch.tensor(float(len(uneven)))
    dist.all_reduce(count, group=pair)
    fixed_grads = one_ddp_gradient(uneven, lambda out, y: F.mse_loss(out, y, reduction="sum") * n / count)

    # 3c. DistributedSampler on 13 samples: it gives every rank the same number of samples.
    sampler = {str(drop): list(DistributedSampler(range(13), num_replicas=n, rank=rank,
                                                   shuffle=False, drop_last=drop)) for drop in (False, True)}
    print(f"pitfalls: block {uneven} of a {uneven_total}-sample global batch")  # not the sampler: notebook 05 asks
    report(sum_grads=sum_grads, uneven=uneven, uneven_grads=uneven_grads, fixed_grads=fixed_grads,
           sampler=sampler)


def short_last_batch(samples=14):
    """14 samples in global batches of 2 x B: rank 0 holds 0..3, 8..11; rank 1 holds 4..7, 12..13 (its last block
    is short). Steps per rank with a per-rank DataLoader(drop_last=True), run inside ddp.join() (without it, the
    next collective of the rank with one step more, its forward's broadcast of the rebuilt bucket order, would
    have no partner), and with DistributedSampler(drop_last=True)."""
    mine = [i for start in range(0, samples, 2 * PER_RANK_BATCH) for i in block(start, rank, PER_RANK_BATCH) if i < samples]
    loaders = {
        "per_rank": DataLoader(TensorDataset(torch.tensor(mine)), batch_size=PER_RANK_BATCH, drop_last=True),
        "sampler": DataLoader(TensorDataset(torch.arange(samples)), batch_size=PER_RANK_BATCH, drop_last=True,
                              sampler=DistributedSampler(range(samples), num_replicas=2, rank=rank, shuffle=False,
                                                         drop_last=True)),
    }
    runs = {}
    for name, loader in loaders.items():
        net = DDP(build_model(SEED), process_group=pair)
        optimizer = torch.optim.SGD(net.parameters(), lr=LR)
        steps = 0
        with net.join() if name == "per_rank" else contextlib.nullcontext():  # join: torch's fix for uneven steps
            for (indices,) in loader:
                optimizer.zero_grad()
                F.mse_loss(net(x_all[indices]), y_all[indices]).backward()
                optimizer.step()
                steps += 1
        runs[name] = {"samples": mine if name == "per_rank" else list(loader.sampler), "batches": len(loader),
                      "steps": steps, "weights": dict(net.module.named_parameters())}
    report(short_last_batch=runs)


# ----------------------------------------------------------------------------- 4. division before the sum (N = 2)
def division_first():
    # No hook registered: DDP's built-in reducer. Each rank's float16 gradient is 40000; their sum (80000)
    # does not fit in float16 (max 65504), their mean does. A finite mean shows the division came first.
    one_weight = nn.Linear(1, 1, bias=False).half()
    half_model = DDP(one_weight, process_group=pair)
    half_model(torch.full((1, 1), 40000.0, dtype=torch.half)).sum().backward()  # d(w * x)/dw = x
    report(half_grad=float(one_weight.weight.grad))


def unequal_mean_in_float16():
    # Every rank, the default group (N = 3): float16 gradients 8000 x (7, 1, 4) = 56000, 8000, 32000, whose sum
    # (96000) does not fit in float16. DDP's built-in reducer divides first; then the other order by hand.
    own_grad = 8000 * (7.0, 1.0, 4.0)[rank]
    one_weight = nn.Linear(1, 1, bias=False).half()
    half_model = DDP(one_weight)  # kept in a name: a wrapper freed before backward() would reduce nothing
    half_model(torch.full((1, 1), own_grad, dtype=torch.half)).sum().backward()  # d(w * x)/dw = x
    summed = torch.tensor(own_grad, dtype=torch.half)
    dist.all_reduce(summed)  # sum first ...
    report(unequal_own_grad=own_grad, unequal_half_grad=float(one_weight.weight.grad),
           sum_then_divide=float(summed / world_size))  # ... then divide


# ----------------------------------------------------------------------------- 5. timing (N = 2, CPU figures)
def step_time():
    # cores // 2, set here rather than taken from the launcher (which divides the usable cores among all the
    # ranks it starts, or keeps the user's OMP_NUM_THREADS): the same setting as the notebook's DP side.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
    torch.manual_seed(SEED + rank)
    timing_model = DDP(build_model(SEED, in_features=TIMING_FEATURES, hidden=TIMING_HIDDEN), process_group=pair)
    timing_optimizer = torch.optim.SGD(timing_model.parameters(), lr=0.01)
    x_time = torch.randn(TIMING_BATCH, TIMING_FEATURES)
    y_time = torch.randn(TIMING_BATCH, 1)
    durations = []
    for step in range(TIMING_STEPS + 3):  # 3 warm-up steps
        dist.barrier(group=pair)           # both ranks start the step together
        start = time.perf_counter()
        timing_optimizer.zero_grad()
        F.mse_loss(timing_model(x_time), y_time).backward()
        timing_optimizer.step()
        durations.append(time.perf_counter() - start)
    step_ms = 1000 * sorted(durations[3:])[TIMING_STEPS // 2]  # the median
    report(step_ms=step_ms, threads=torch.get_num_threads())


# ----------------------------------------------------------------------------- 6. every collective, per phase (N = 2)
def collectives_per_phase(find_unused, batchnorm=False):
    """{phase: [collective, ...]} for DDP's constructor and 3 forward/backward iterations."""
    net = build_model(SEED, batchnorm=batchnorm)  # BatchNorm: float32 running stats, an int64 batch count
    if find_unused:
        net.spare = nn.Linear(1, 1)  # never used by forward: the case the flag is made for
    phases = {}
    with CollectiveLog() as log:
        logged = DDP(net, process_group=pair, find_unused_parameters=find_unused)
    phases["constructor"] = log.names
    for iteration in (1, 2, 3):
        with CollectiveLog() as log:
            loss = F.mse_loss(logged(x_all[:PER_RANK_BATCH]), y_all[:PER_RANK_BATCH])
        phases[f"forward {iteration}"] = log.names
        with CollectiveLog() as log:
            loss.backward()
        phases[f"backward {iteration}"] = log.names
    return phases


# ----------------------------------------------------------------------------- 7. buckets (N = 2)
def bucket_probe(net, find_unused=False, steps=3):
    """Buckets in each step, and for each bucket's all-reduce how many gradients were still to come (None)."""
    wrapper = DDP(net, process_group=pair, find_unused_parameters=find_unused)
    params = [p for name, p in net.named_parameters() if not name.startswith("spare")]  # those the forward uses
    name_at = {p.data_ptr(): name for name, p in net.named_parameters()}
    launches = []

    def probe_hook(state, bucket):
        launches[-1].append({"bucket": bucket.index(), "parameters": [name_at[p.data_ptr()] for p in bucket.parameters()],
                             "gradients_to_come": sum(p.grad is None for p in params)})
        return default_hooks.allreduce_hook(state, bucket)  # then exactly what DDP does by default

    wrapper.register_comm_hook(pair, probe_hook)
    buckets = []
    for _ in range(steps):
        wrapper.zero_grad(set_to_none=True)  # every .grad is None until autograd writes it
        launches.append([])
        wrapper(torch.ones(4, params[0].shape[1])).sum().backward()
        buckets.append(len(wrapper.reducer._get_zeros_like_grad_buckets()))
    return {"buckets": buckets, "launches": launches}


class ThreeLayers(nn.Module):
    """Three Linear(1024, 1024): 12 MiB of parameters. `spare`: one more layer that the forward never uses."""

    def __init__(self, spare=False):
        super().__init__()
        torch.manual_seed(SEED)
        self.layers = nn.ModuleList(nn.Linear(1024, 1024) for _ in range(3))
        if spare:
            self.spare = nn.Linear(1, 1)  # the case find_unused_parameters=True is made for

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


# ----------------------------------------------------------------------------- 8. the constructor's checks (N = 2)
def constructor_checks():
    """DDP's constructor first all-gathers the NUMBER of parameters, then compares sizes and strides with rank
    0's (a broadcast of rank 0's metadata). What each rank raises when rank 1's model differs."""
    errors = {}
    counted = build_model(SEED)
    if rank == 1:
        counted.extra = nn.Linear(1, 1)  # two more parameters on rank 1
    try:
        DDP(counted, process_group=pair)
        errors["count"] = None
    except RuntimeError as error:
        errors["count"] = str(error)
    wider = build_model(SEED, hidden=17 if rank == 1 else 16)  # as many parameters, one of other sizes
    try:
        DDP(wider, process_group=pair)
        errors["sizes"] = None
    except RuntimeError as error:
        errors["sizes"] = str(error)
        # rank 0, the reference, raised nothing and now broadcasts its state: stand in for that broadcast
        dist.broadcast(torch.empty(sum(p.numel() for p in build_model(SEED).parameters())), src=0, group=pair)
    report(constructor_errors=errors)


# ----------------------------------------------------------------------------- 9. BatchNorm (N = 2)
def batchnorm_at_fixed_global_batch():
    """TinyNet with BatchNorm (train mode), each rank on its block of step 1: the gradients after backward."""
    net = DDP(build_model(SEED, batchnorm=True), process_group=pair)
    F.mse_loss(net(x_all[first_shard]), y_all[first_shard]).backward()
    sync = nn.SyncBatchNorm.convert_sync_batchnorm(build_model(SEED, batchnorm=True), process_group=pair)
    try:
        sync(x_all[first_shard])
        sync_error = None
    except ValueError as error:  # raised before any communication
        sync_error = str(error)
    sync.eval()  # eval mode syncs nothing: plain batch_norm with the running statistics, CPU tensors too
    plain = build_model(SEED, batchnorm=True).eval()
    sync_eval_equal = torch.equal(sync(x_all[first_shard]), plain(x_all[first_shard]))
    report(batchnorm_grads={name: p.grad for name, p in net.module.named_parameters()}, syncbn_error=sync_error,
           syncbn_eval_equal=sync_eval_equal)


# ----------------------------------------------------------------------------- 10. epochs with DistributedSampler (N = 2)
def sampler_epochs(samples=16, epochs=2):
    """A DataLoader training loop; the sample indices each rank trained on, per epoch."""
    dataset = TensorDataset(torch.arange(samples))  # the loader yields indices into x_all, y_all
    orders = {}
    for call_set_epoch in (False, True):
        sampler = DistributedSampler(dataset, num_replicas=2, rank=rank)  # shuffle left at its default
        loader = DataLoader(dataset, batch_size=PER_RANK_BATCH, sampler=sampler)
        net = DDP(build_model(SEED), process_group=pair)
        optimizer = torch.optim.SGD(net.parameters(), lr=LR)
        per_epoch = []
        for epoch in range(epochs):
            if call_set_epoch:
                sampler.set_epoch(epoch)  # the order of epoch e comes from seed + e
            seen = []
            for (indices,) in loader:
                optimizer.zero_grad()
                F.mse_loss(net(x_all[indices]), y_all[indices]).backward()
                optimizer.step()
                seen += indices.tolist()
            per_epoch.append(seen)
        orders[str(call_set_epoch)] = per_epoch
    report(sampler_shuffle=sampler.shuffle, epoch_orders=orders)


unequal_mean_in_float16()  # N = 3: every rank
if in_pair:
    pitfalls()
    short_last_batch()
    division_first()
    step_time()
    report(collectives={"default": collectives_per_phase(False), "find_unused": collectives_per_phase(True),
                        "batchnorm": collectives_per_phase(False, batchnorm=True)},
           pid=os.getpid())  # one process per rank
    report(buckets={"tiny": bucket_probe(build_model(SEED)), "three_layers": bucket_probe(ThreeLayers()),
                    "three_layers_find_unused": bucket_probe(ThreeLayers(spare=True), find_unused=True)})
    constructor_checks()
    batchnorm_at_fixed_global_batch()
    sampler_epochs()
dist.barrier()  # rank 2 waits here for the others

del ddp_model, world_model, wrapped
gc.collect()  # free every DDP wrapper (each holds a process group) before the groups go: a clean exit
dist.destroy_process_group()
