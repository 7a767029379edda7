"""Demo for notebook 04: when DDP all-reduces during backward (the first and the second step, tiny and default
buckets), and which collectives its forward launches; gradient accumulation with no_sync() (right, off by
one, unscaled loss, synced every time; its all-reduces counted), and which of the forward and the backward
no_sync() has to cover; a checksum all-reduce that names a diverging rank, and what it costs for three model
sizes.

python -m ddpcourse run notebooks/demos/04_no_sync_and_checksum.py --nproc 2
"""
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse import init_distributed, report
from ddpcourse.lab import CollectiveLog, compare_replicas
from ddpcourse.toy import build_model, make_dataset

# -------------------------------------------------------------------------------------------- config
ACCUMULATION_STEPS = 4   # micro-batches per optimizer step
MICRO_BATCH = 4          # samples per micro-batch and rank
TRAIN_STEPS = 16         # divergence experiment
CHECK_EVERY = 4          # checksum every k steps
BREAK_AT_STEP = 6        # rank 1 silently changes one weight after this step
TIMING_REPEATS = 50
STEP_REPEATS = 10
CHECK_HIDDEN_SIZES = (16, 1600, 160000)  # TinyNet's width, then 100x and 10,000x the parameters
# -----------------------------------------------------------------------------------------------------

rank, world_size, device = init_distributed()
data = make_dataset(samples=ACCUMULATION_STEPS * MICRO_BATCH * world_size * TRAIN_STEPS, seed=3)


def micro_batch(i, step=0):
    """Rank r's i-th micro-batch of optimizer step `step`."""
    start = ((step * ACCUMULATION_STEPS + i) * world_size + rank) * MICRO_BATCH
    return data.tensors[0][start:start + MICRO_BATCH], data.tensors[1][start:start + MICRO_BATCH]


def flat_grad(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def grad_spread(model):
    """Largest difference between this rank's gradients and any other rank's (a collective)."""
    mine = flat_grad(model)
    every = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(every, mine)
    return max(float((g - mine).abs().max()) for g in every)


# ---- when DDP all-reduces during backward: tiny buckets, then the default ----------------------------
def logging_allreduce(events):
    def hook(state, bucket):
        """DDP's own work (average the bucket), plus a note of when it starts."""
        events.append(f"all_reduce bucket {bucket.index()}")
        future = dist.all_reduce(bucket.buffer().div_(world_size), async_op=True).get_future()
        return future.then(lambda fut: fut.value()[0])
    return hook


def backward_events(**ddp_options):
    """The order of 'gradient ready' and 'bucket all-reduce starts' in the first and the second backward of a
    DDP model: [first step's events, second step's], the c10d collectives each step's forward launched (every
    collective, DDP's C++ ones included, as CollectiveLog sees them), and whether each backward returned with
    the same gradients on every rank."""
    events, steps, forward_collectives, backward_complete = [], [], [], []
    ddp = DDP(build_model(seed=0), **ddp_options)
    for name, param in ddp.module.named_parameters():
        param.register_post_accumulate_grad_hook(lambda p, name=name: events.append(f"grad {name}"))
    ddp.register_comm_hook(None, logging_allreduce(events))
    x, y = micro_batch(0)
    for _ in range(2):  # the constructor made one bucket; the second forward rebuilds them in arrival order
        events.clear()
        with CollectiveLog() as forward_log:
            loss = F.mse_loss(ddp(x), y)
        forward_collectives.append(forward_log.names)
        loss.backward()
        steps.append(list(events))
        # backward returned only once every all-reduce was done: the gradients are the same on every rank
        backward_complete.append(grad_spread(ddp.module) == 0.0)
    del ddp
    return steps, forward_collectives, backward_complete


# bucket_cap_mb=1e-6 (about one byte): once rebuilt, every parameter has a bucket of its own, so the order shows
(tiny_first, tiny_events), tiny_forwards, tiny_complete = backward_events(bucket_cap_mb=1e-6)
# as shipped: bucket_cap_mb=25, and a first bucket of dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB) when rebuilt
(default_first, default_events), default_forwards, default_complete = backward_events()
print("first backward, bucket_cap_mb=1e-6:", ", ".join(tiny_first))
print("second backward, bucket_cap_mb=1e-6 (one bucket per parameter):", ", ".join(tiny_events))
print("second backward, default buckets:", ", ".join(default_events))
report(backward_events=tiny_events, default_backward_events=default_events,
       first_backward_events={"bucket_cap_mb=1e-6": tiny_first, "default": default_first},
       forward_collectives={"bucket_cap_mb=1e-6": tiny_forwards, "default": default_forwards},
       backward_complete=tiny_complete + default_complete,
       first_bucket_bytes=dist._DEFAULT_FIRST_BUCKET_BYTES,
       tiny_net_bytes=sum(p.numel() * p.element_size() for p in build_model(seed=0).parameters()))

# ---- gradient accumulation with no_sync() ---------------------------------------------------------------
# The reference: one model, one backward over the whole global batch (every rank's micro-batches).
reference = build_model(seed=0)
everything = [torch.cat(parts) for parts in zip(*(
    (data.tensors[0][((i * world_size + r) * MICRO_BATCH):((i * world_size + r) + 1) * MICRO_BATCH],
     data.tensors[1][((i * world_size + r) * MICRO_BATCH):((i * world_size + r) + 1) * MICRO_BATCH])
    for i in range(ACCUMULATION_STEPS) for r in range(world_size)))]
F.mse_loss(reference(everything[0]), everything[1]).backward()
reference_grad = flat_grad(reference)


def counting_allreduce(calls):
    def hook(state, bucket):
        """torch's default all-reduce hook (DDP's own averaging), counted."""
        calls.append(bucket.index())
        return allreduce_hook(state, bucket)
    return hook


def accumulate(sync_last, scale_loss, sync_every=False):
    """One optimizer step's worth of micro-batches; returns what was measured."""
    model = DDP(build_model(seed=0))
    calls = []
    model.register_comm_hook(None, counting_allreduce(calls))
    spreads = []
    for i in range(ACCUMULATION_STEPS):
        last = i == ACCUMULATION_STEPS - 1
        synced = sync_every or (last and sync_last)  # the right loop syncs on the last one only
        context = nullcontext() if synced else model.no_sync()
        x, y = micro_batch(i)
        with context:
            loss = F.mse_loss(model(x), y)
            (loss / ACCUMULATION_STEPS if scale_loss else loss).backward()
        spreads.append(grad_spread(model))
    grad = flat_grad(model)
    measured = {"spread_per_micro_step": spreads,
                "vs_large_batch": float((grad - reference_grad).abs().max()),
                "ratio_to_large_batch": float(grad.norm() / reference_grad.norm()),
                "all_reduces": len(calls)}
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    measured["replicas_identical_after_step"] = compare_replicas(model).identical
    return measured


# What no_sync() has to cover: DDP's forward decides whether the backward after it all-reduces (it prepares
# the reducer only when require_backward_grad_sync is set, the flag no_sync() clears). One micro-batch, with
# the forward and the backward on different sides of the context manager.
def split_no_sync(forward_inside):
    model = DDP(build_model(seed=0))
    calls = []
    model.register_comm_hook(None, counting_allreduce(calls))
    x, y = micro_batch(0)
    if forward_inside:
        with model.no_sync():
            loss = F.mse_loss(model(x), y)
        loss.backward()
    else:
        loss = F.mse_loss(model(x), y)
        with model.no_sync():
            loss.backward()
    return {"all_reduces": len(calls), "grad_spread": grad_spread(model)}


no_sync_split = {"forward inside, backward outside": split_no_sync(forward_inside=True),
                 "forward outside, backward inside": split_no_sync(forward_inside=False)}
for name, m in no_sync_split.items():
    print(f"no_sync() around one pass only, {name}: all-reduces {m['all_reduces']}, "
          f"grad spread {round(m['grad_spread'], 4)}")
report(no_sync_split=no_sync_split)

variants = {"right": accumulate(sync_last=True, scale_loss=True),
            "all in no_sync": accumulate(sync_last=False, scale_loss=True),
            "loss not scaled": accumulate(sync_last=True, scale_loss=False),
            "sync every one": accumulate(sync_last=True, scale_loss=True, sync_every=True)}
def rounding(diff):
    """A float difference as printed: its last bits vary between machines, so small ones read '< 1e-5'."""
    return "< 1e-5" if diff < 1e-5 else f"{diff:.2g}"


for name, m in variants.items():
    print(f"{name:>15}: grad spread per micro-step {[round(s, 4) for s in m['spread_per_micro_step']]}, "
          f"|grad - large batch| {rounding(m['vs_large_batch'])}, norm ratio {m['ratio_to_large_batch']:.3f}, "
          f"replicas identical after step: {m['replicas_identical_after_step']}, all-reduces {m['all_reduces']}")
report(accumulation=variants)

# ---- a checksum every k steps names a diverging rank ------------------------------------------------------


def local_checksum(model):
    """This rank's float64 sum of its parameters: reads every parameter once (O(P) work, no message)."""
    return sum(p.detach().double().sum() for p in model.parameters())


def gather_checksums(value):
    """Every rank's checksum, on every rank: one all_reduce of world_size numbers, whatever the model."""
    values = torch.zeros(world_size, dtype=torch.float64)
    values[rank] = value
    dist.all_reduce(values)  # each rank filled only its own slot: the sum gathers them all
    return values


def checksums(model):
    return gather_checksums(local_checksum(model))


model = DDP(build_model(seed=0))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
detections = []
for step in range(1, TRAIN_STEPS + 1):
    optimizer.zero_grad()
    x, y = micro_batch(0, step)
    F.mse_loss(model(x), y).backward()
    optimizer.step()
    if step == BREAK_AT_STEP and rank == 1:  # a write outside forward and backward: a stale reload, a bit flip
        with torch.no_grad():
            model.module.fc1.weight[0, 0] += 1e-4
    if step % CHECK_EVERY == 0:
        sums = checksums(model)
        diverged = [r for r in range(world_size) if sums[r] != sums[0]]
        by = float((sums - sums[0]).abs().max())
        detections.append({"step": step, "diverged_ranks": diverged, "by": by})
        if diverged and rank == 0:
            print(f"step {step}: checksum of rank(s) {diverged} differs from rank 0's "
                  f"(by {by:.1e}): the replicas have diverged")
still_differ = not compare_replicas(model).identical  # DDP kept averaging gradients; nothing repaired it
def median_ms(fn, repeats=TIMING_REPEATS):
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3  # the median: robust to a spike


# What a check costs, split in its two parts, next to a DDP step of the same model, for TinyNet and for
# models 100x and 10,000x larger.
check_cost = []
for hidden in CHECK_HIDDEN_SIZES:
    sized = DDP(build_model(seed=0, hidden=hidden))
    sized_optimizer = torch.optim.SGD(sized.parameters(), lr=0.01)
    x, y = micro_batch(0)

    def one_step():
        sized_optimizer.zero_grad()
        F.mse_loss(sized(x), y).backward()
        sized_optimizer.step()

    value = local_checksum(sized)
    with CollectiveLog() as check_log:  # what the check sends, as the dispatcher sees it
        gather_checksums(value)
    check_cost.append({"hidden": hidden, "parameters": sum(p.numel() for p in sized.parameters()),
                       "check_collectives": check_log.calls,
                       "sum_ms": median_ms(lambda: local_checksum(sized)),
                       "all_reduce_ms": median_ms(lambda: gather_checksums(value)),
                       "step_ms": median_ms(one_step, repeats=STEP_REPEATS)})
    del sized
print(f"timed for {len(check_cost)} model sizes: the checksum's local sum and its all_reduce (median of "
      f"{TIMING_REPEATS}), a DDP step (median of {STEP_REPEATS}); the numbers are in the report")
report(detections=detections, still_differ=still_differ, check_cost=check_cost)
del model
if __name__ == "__main__":  # run alone; inside 04_sync.py the next part uses the same group
    dist.destroy_process_group()
