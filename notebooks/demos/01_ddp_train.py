"""Demo for notebook 01: what DistributedDataParallel does, reported so the notebook can check it.

python -m ddpcourse run notebooks/demos/01_ddp_train.py --nproc 3

One launch of 3 processes reports everything the notebook's DDP sections verify. Worlds of 1, 2 and 3
ranks come from process groups: ranks 0 and 1 form a group of 2 (DDP's process_group=), rank 2 a group
of its own, and all three the default group.
  1. training: STEPS steps of DDP in each world size N (N = 2 and N = 1 at the same time, then N = 3), each
     rank on its own block of PER_RANK_BATCH samples; the weights, and for N = 2 the gradients of the
     first step and what a communication hook saw (bytes, calls during backward);
  2. construction: replicas built with different seeds are identical once wrapped (N = 3);
  3. pitfalls (N = 2): reduction='sum', an unequal last batch (and its exact fix), DistributedSampler's padding;
  4. the order of DDP's averaging without a hook (N = 2): a float16 gradient that a sum would overflow;
  5. timing (N = 2): milliseconds per DDP step of a larger TinyNet (CPU figures; the notebook compares);
  6. every collective DDP calls in its constructor and in each forward and backward of 3 iterations (N = 2),
     with the default settings and with find_unused_parameters=True.
Rank 2 takes part in what needs all three ranks (sections 1 and 2) and waits during the rest.
"""
import gc
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DistributedSampler

from ddpcourse import init_distributed, report
from ddpcourse.lab import compare_replicas
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
        return default_hooks.allreduce_hook(state, bucket)  # divide by the group's size first, then all_reduce(SUM)

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
    print(f"N = 2: {STEPS} steps on samples {shards[0][0]}..{shards[-1][-1]} (blocks of {PER_RANK_BATCH}); "
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
print(f"N = 3: {STEPS} steps on samples {world_model[2][0][0]}..{world_model[2][-1][-1]}: {replicas}")
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
    print(f"pitfalls: block {uneven} of a {uneven_total}-sample global batch; DistributedSampler on 13 "
          f"samples gives {sampler['False']} (drop_last=False), {sampler['True']} (drop_last=True)")
    report(sum_grads=sum_grads, uneven=uneven, uneven_grads=uneven_grads, fixed_grads=fixed_grads,
           sampler=sampler)


# ----------------------------------------------------------------------------- 4. division before the sum (N = 2)
def division_first():
    # No hook registered: DDP's built-in reducer. Each rank's float16 gradient is 40000; their sum (80000)
    # does not fit in float16 (max 65504), their mean does. A finite mean shows the division came first.
    one_weight = nn.Linear(1, 1, bias=False).half()
    half_model = DDP(one_weight, process_group=pair)
    half_model(torch.full((1, 1), 40000.0, dtype=torch.half)).sum().backward()  # d(w * x)/dw = x
    report(half_grad=float(one_weight.weight.grad))


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
class CollectiveLog(TorchDispatchMode):
    """Names every c10d operation dispatched while active, the C++ reducer's own calls included."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket._qualified_op_name
        if name.startswith("c10d::"):
            self.calls.append(name[len("c10d::"):])
        return func(*args, **(kwargs or {}))


def collectives_per_phase(find_unused):
    """{phase: [collective, ...]} for DDP's constructor and 3 forward/backward iterations."""
    net = build_model(SEED)
    if find_unused:
        net.spare = nn.Linear(1, 1)  # never used by forward: the case the flag is made for
    phases = {}
    with CollectiveLog() as log:
        logged = DDP(net, process_group=pair, find_unused_parameters=find_unused)
    phases["constructor"] = log.calls
    for iteration in (1, 2, 3):
        with CollectiveLog() as log:
            loss = F.mse_loss(logged(x_all[:PER_RANK_BATCH]), y_all[:PER_RANK_BATCH])
        phases[f"forward {iteration}"] = log.calls
        with CollectiveLog() as log:
            loss.backward()
        phases[f"backward {iteration}"] = log.calls
    return phases


if in_pair:
    pitfalls()
    division_first()
    step_time()
    report(collectives={"default": collectives_per_phase(False), "find_unused": collectives_per_phase(True)},
           pid=os.getpid())  # one process per rank
dist.barrier()  # rank 2 waits here for the others

del ddp_model, world_model, wrapped
gc.collect()  # free every DDP wrapper (each holds a process group) before the groups go: a clean exit
dist.destroy_process_group()
