"""Demo for notebook 04: DDP all-reduces during backward; gradient accumulation with no_sync() (right,
off by one, unscaled loss); a checksum all-reduce that names a diverging rank, and what it costs.

python -m ddpcourse run notebooks/demos/04_no_sync_and_checksum.py --nproc 2
"""
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse import init_distributed, report
from ddpcourse.lab import compare_replicas
from ddpcourse.toy import build_model, make_dataset

# -------------------------------------------------------------------------------------------- config
ACCUMULATION_STEPS = 4   # micro-batches per optimizer step
MICRO_BATCH = 4          # samples per micro-batch and rank
TRAIN_STEPS = 16         # divergence experiment
CHECK_EVERY = 4          # checksum every k steps
BREAK_AT_STEP = 6        # rank 1 silently changes one weight after this step
TIMING_REPEATS = 50
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


# ---- DDP starts all-reducing gradients during backward, bucket by bucket ---------------------------
events = []
ddp = DDP(build_model(seed=0), bucket_cap_mb=1e-6)  # tiny buckets: one per parameter, to see the order
for name, param in ddp.module.named_parameters():
    param.register_post_accumulate_grad_hook(lambda p, name=name: events.append(f"grad {name}"))


def logging_allreduce(state, bucket):
    """DDP's own work (average the bucket), plus a note of when it starts."""
    events.append(f"all_reduce bucket {bucket.index()}")
    future = dist.all_reduce(bucket.buffer().div_(world_size), async_op=True).get_future()
    return future.then(lambda fut: fut.value()[0])


ddp.register_comm_hook(None, logging_allreduce)
x, y = micro_batch(0)
for _ in range(2):  # DDP settles its buckets in the first iteration; look at the second
    events.clear()
    F.mse_loss(ddp(x), y).backward()
print("backward of a DDP model, in order:", ", ".join(events))
report(backward_events=list(events))
del ddp

# ---- gradient accumulation with no_sync() ---------------------------------------------------------------
# The reference: one model, one backward over the whole global batch (every rank's micro-batches).
reference = build_model(seed=0)
everything = [torch.cat(parts) for parts in zip(*(
    (data.tensors[0][((i * world_size + r) * MICRO_BATCH):((i * world_size + r) + 1) * MICRO_BATCH],
     data.tensors[1][((i * world_size + r) * MICRO_BATCH):((i * world_size + r) + 1) * MICRO_BATCH])
    for i in range(ACCUMULATION_STEPS) for r in range(world_size)))]
F.mse_loss(reference(everything[0]), everything[1]).backward()
reference_grad = flat_grad(reference)


def accumulate(sync_last, scale_loss):
    """One optimizer step's worth of micro-batches; returns what was measured."""
    model = DDP(build_model(seed=0))
    spreads = []
    for i in range(ACCUMULATION_STEPS):
        last = i == ACCUMULATION_STEPS - 1
        context = nullcontext() if (last and sync_last) else model.no_sync()  # sync only on the last one
        x, y = micro_batch(i)
        with context:
            loss = F.mse_loss(model(x), y)
            (loss / ACCUMULATION_STEPS if scale_loss else loss).backward()
        spreads.append(grad_spread(model))
    grad = flat_grad(model)
    measured = {"spread_per_micro_step": spreads,
                "vs_large_batch": float((grad - reference_grad).abs().max()),
                "ratio_to_large_batch": float(grad.norm() / reference_grad.norm())}
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    measured["replicas_identical_after_step"] = compare_replicas(model).identical
    return measured


variants = {"right": accumulate(sync_last=True, scale_loss=True),
            "all in no_sync": accumulate(sync_last=False, scale_loss=True),
            "loss not scaled": accumulate(sync_last=True, scale_loss=False)}
for name, m in variants.items():
    print(f"{name:>15}: grad spread per micro-step {[round(s, 4) for s in m['spread_per_micro_step']]}, "
          f"|grad - large batch| {m['vs_large_batch']:.2g}, norm ratio {m['ratio_to_large_batch']:.3f}, "
          f"replicas identical after step: {m['replicas_identical_after_step']}")
report(accumulation=variants)

# ---- a checksum every k steps names a diverging rank ------------------------------------------------------


def checksums(model):
    """Every rank's float64 sum of its parameters, on every rank: one all_reduce of world_size numbers."""
    values = torch.zeros(world_size, dtype=torch.float64)
    values[rank] = sum(p.detach().double().sum() for p in model.parameters())
    dist.all_reduce(values)  # each rank filled only its own slot: the sum gathers them all
    return values


model = DDP(build_model(seed=0))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
detections = []
step_times = []
for step in range(1, TRAIN_STEPS + 1):
    start = time.perf_counter()
    optimizer.zero_grad()
    x, y = micro_batch(0, step)
    F.mse_loss(model(x), y).backward()
    optimizer.step()
    step_times.append(time.perf_counter() - start)
    if step == BREAK_AT_STEP and rank == 1:  # e.g. a non-deterministic kernel, a stale checkpoint reload
        with torch.no_grad():
            model.module.fc1.weight[0, 0] += 1e-4
    if step % CHECK_EVERY == 0:
        sums = checksums(model)
        diverged = [r for r in range(world_size) if sums[r] != sums[0]]
        detections.append({"step": step, "diverged_ranks": diverged})
        if diverged and rank == 0:
            print(f"step {step}: checksum of rank(s) {diverged} differs from rank 0's "
                  f"(by {float((sums - sums[0]).abs().max()):.1e}): the replicas have diverged")
still_differ = not compare_replicas(model).identical  # DDP kept averaging gradients; nothing repaired it
check_times = []
for _ in range(TIMING_REPEATS):
    dist.barrier()
    start = time.perf_counter()
    checksums(model)
    check_times.append(time.perf_counter() - start)
median = lambda values: sorted(values)[len(values) // 2]
report(detections=detections, still_differ=still_differ, check_ms=median(check_times) * 1e3,
       step_ms=median(step_times) * 1e3, parameters=sum(p.numel() for p in model.parameters()))
del model
dist.destroy_process_group()
