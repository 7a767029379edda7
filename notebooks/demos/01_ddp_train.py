"""Demo for notebook 01: what DistributedDataParallel does, reported so the notebook can check it.

python -m ddpcourse run notebooks/demos/01_ddp_train.py --nproc 2

One launch reports everything the notebook's DDP sections verify:
  1. training: STEPS steps of DDP, each rank on its own block of PER_RANK_BATCH samples; the weights,
     the gradients of the first step, and what a communication hook saw (bytes, calls during backward);
  2. construction: replicas built with different seeds are identical once wrapped;
  3. pitfalls: reduction='sum', an unequal last batch (and its exact fix), DistributedSampler's padding;
  4. the order of DDP's averaging without a hook: a float16 gradient that a sum would overflow;
  5. timing: milliseconds per DDP step of a larger TinyNet (CPU figures; the notebook compares);
  6. every collective DDP calls in its constructor and in each forward and backward of 3 iterations,
     with the default settings and with find_unused_parameters=True.
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
PER_RANK_BATCH = 4      # B; the global batch of one step is world_size * B samples
STEPS = 3               # k
LR = 0.1
TIMING_FEATURES, TIMING_HIDDEN = 256, 1024   # the model the notebook also times with its DP simulation
TIMING_BATCH = 64       # per rank
TIMING_STEPS = 20

rank, world_size, device = init_distributed()
x_all, y_all = make_dataset(samples=96, seed=SEED).tensors


def block(first, rank, size):
    """Indices of `rank`'s block of `size` samples in a global batch that starts at sample `first`."""
    start = first + rank * size
    return list(range(start, start + size))


# ----------------------------------------------------------------------------- 1. DDP training
model = build_model(SEED)
ddp_model = DDP(model)  # gloo on CPU: no device_ids
seen = {"bytes": [], "in_backward": []}
in_backward = False


def counting_hook(state, bucket):
    """Record what DDP hands to the all-reduce, then do exactly what DDP does by default."""
    buffer = bucket.buffer()
    seen["bytes"].append(buffer.numel() * buffer.element_size())
    seen["in_backward"].append(in_backward)
    return default_hooks.allreduce_hook(state, bucket)  # divide by world size first, then all_reduce(SUM)


ddp_model.register_comm_hook(dist.group.WORLD, counting_hook)
optimizer = torch.optim.SGD(ddp_model.parameters(), lr=LR)  # each rank steps its own optimizer
shards = []
for step in range(STEPS):
    indices = block(step * world_size * PER_RANK_BATCH, rank, PER_RANK_BATCH)
    shards.append(indices)
    optimizer.zero_grad()
    loss = F.mse_loss(ddp_model(x_all[indices]), y_all[indices])
    in_backward = True
    loss.backward()  # the hook's all-reduces run in here, bucket by bucket
    in_backward = False
    if step == 0:
        first_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    optimizer.step()
replicas = compare_replicas(ddp_model)
parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
print(f"DDP, {STEPS} steps on samples {shards[0][0]}..{shards[-1][-1]} (blocks of {PER_RANK_BATCH}): {replicas}")
print(f"  all-reduced per step: {sum(seen['bytes']) // STEPS} bytes = the gradient size ({parameter_bytes} bytes), "
      f"{len(seen['bytes']) // STEPS} bucket(s), all during backward: {all(seen['in_backward'])}")
report(shards=shards, weights={n: p for n, p in model.named_parameters()}, first_grads=first_grads,
       replicas=replicas.as_dict(), hook_bytes=seen["bytes"], hook_in_backward=seen["in_backward"],
       parameter_bytes=parameter_bytes)
# What changes for code that used the plain model: its attributes and state_dict names sit under .module.
report(wrapper_keys=list(ddp_model.state_dict()), module_is_model=ddp_model.module is model,
       fc1_through_wrapper=hasattr(ddp_model, "fc1"))

# ----------------------------------------------------------------------------- 2. construction
different = build_model(seed=100 + rank)  # a different start on every rank
before = compare_replicas(different)
wrapped = DDP(different)                 # the constructor broadcasts rank 0's parameters and buffers
after = compare_replicas(wrapped)
print(f"built with seeds 100+rank: identical before DDP(): {before.identical}, after: {after.identical}")
report(identical_before_wrap=before.identical, identical_after_wrap=after.identical,
       replicas_before_wrap=before.as_dict(), counted=(before.parameters, before.buffers))

# ----------------------------------------------------------------------------- 3. pitfalls
def one_ddp_gradient(indices, loss_fn):
    """Every gradient after one DDP backward on this rank's `indices`, from the seed's start."""
    net = DDP(build_model(SEED))
    loss_fn(net(x_all[indices]), y_all[indices]).backward()
    return {name: p.grad for name, p in net.module.named_parameters()}


# 3a. reduction='sum': each rank's loss is a sum over its block; DDP still divides by world_size.
sum_grads = one_ddp_gradient(shards[0], lambda out, y: F.mse_loss(out, y, reduction="sum"))

# 3b. an unequal last batch: the global batch has world_size * B - 2 samples, the last rank gets B - 2.
uneven_total = world_size * PER_RANK_BATCH - 2
uneven = [i for i in block(0, rank, PER_RANK_BATCH) if i < uneven_total]
uneven_grads = one_ddp_gradient(uneven, F.mse_loss)  # each rank's mean, then DDP's mean of the means
# The exact fix: a sum over this rank's samples divided by the GLOBAL count, times world_size
# (DDP divides by world_size again): every sample then weighs 1 / global count.
count = torch.tensor(float(len(uneven)))
dist.all_reduce(count)
fixed_grads = one_ddp_gradient(
    uneven, lambda out, y: F.mse_loss(out, y, reduction="sum") * world_size / count)

# 3c. DistributedSampler on 13 samples: it gives every rank the same number of samples.
sampler = {str(drop): list(DistributedSampler(range(13), num_replicas=world_size, rank=rank,
                                               shuffle=False, drop_last=drop)) for drop in (False, True)}
print(f"pitfalls: block {uneven} of a {uneven_total}-sample global batch; DistributedSampler on 13 "
      f"samples gives {sampler['False']} (drop_last=False), {sampler['True']} (drop_last=True)")
report(sum_grads=sum_grads, uneven=uneven, uneven_grads=uneven_grads, fixed_grads=fixed_grads,
       sampler=sampler)

# ----------------------------------------------------------------------------- 4. division before the sum
# No hook registered: DDP's built-in reducer. Every rank's float16 gradient is 40000; their sum (80000)
# does not fit in float16 (max 65504), their mean does. A finite mean shows the division came first.
one_weight = nn.Linear(1, 1, bias=False).half()
half_model = DDP(one_weight)
half_model(torch.full((1, 1), 40000.0, dtype=torch.half)).sum().backward()  # d(w * x)/dw = x
report(half_grad=float(one_weight.weight.grad))

# ----------------------------------------------------------------------------- 5. timing (CPU figures)
torch.manual_seed(SEED + rank)
timing_model = DDP(build_model(SEED, in_features=TIMING_FEATURES, hidden=TIMING_HIDDEN))
timing_optimizer = torch.optim.SGD(timing_model.parameters(), lr=0.01)
x_time = torch.randn(TIMING_BATCH, TIMING_FEATURES)
y_time = torch.randn(TIMING_BATCH, 1)
durations = []
for step in range(TIMING_STEPS + 3):  # 3 warm-up steps
    dist.barrier()                     # every rank starts the step together
    start = time.perf_counter()
    timing_optimizer.zero_grad()
    F.mse_loss(timing_model(x_time), y_time).backward()
    timing_optimizer.step()
    durations.append(time.perf_counter() - start)
step_ms = 1000 * sorted(durations[3:])[TIMING_STEPS // 2]  # the median
report(step_ms=step_ms, threads=torch.get_num_threads())  # the launcher sets cores // nproc


# ----------------------------------------------------------------------------- 6. every collective, per phase
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
        logged = DDP(net, find_unused_parameters=find_unused)
    phases["constructor"] = log.calls
    for iteration in (1, 2, 3):
        with CollectiveLog() as log:
            loss = F.mse_loss(logged(x_all[:PER_RANK_BATCH]), y_all[:PER_RANK_BATCH])
        phases[f"forward {iteration}"] = log.calls
        with CollectiveLog() as log:
            loss.backward()
        phases[f"backward {iteration}"] = log.calls
    return phases


report(collectives={"default": collectives_per_phase(False), "find_unused": collectives_per_phase(True)},
       pid=os.getpid())  # one process per rank

del ddp_model, wrapped, half_model, timing_model, timing_optimizer, optimizer
gc.collect()  # free every DDP wrapper (each holds the process group) before the group goes: a clean exit
dist.destroy_process_group()
