"""Demo for notebook 04: what a forward pass changes, averaging replicas by hand and with torch's
PeriodicModelAverager, and broadcasting rank 0's weights (per tensor and flattened).

python -m ddpcourse run notebooks/demos/04_averaging.py --nproc 2
"""
import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from ddpcourse import init_distributed, report
from ddpcourse.lab import compare_replicas
from ddpcourse.toy import build_model, make_dataset

# -------------------------------------------------------------------------------------------- config
STEPS = 16            # local SGD steps in the drift experiment
AVERAGE_EVERY = 4     # k
LEARNING_RATE = 0.05
BATCH_SIZE = 8
DEEP_LAYERS = 40      # the broadcast timing model: many small tensors, like a real network
DEEP_WIDTH = 64
BROADCAST_REPEATS = 30
# -----------------------------------------------------------------------------------------------------

rank, world_size, device = init_distributed()
data = make_dataset(samples=BATCH_SIZE * STEPS * world_size, seed=0)


def my_batch(step):
    """Rank r's batch at `step`: a slice no other rank sees."""
    start = (step * world_size + rank) * BATCH_SIZE
    return data.tensors[0][start:start + BATCH_SIZE], data.tensors[1][start:start + BATCH_SIZE]


def train_step(model, optimizer, x, y):
    optimizer.zero_grad()
    F.mse_loss(model(x), y).backward()
    optimizer.step()


def flat_parameters(model):
    return parameters_to_vector(model.parameters()).detach().clone()


def average_parameters_by_hand(model):
    """The source's pattern (its Example 2): all_reduce(SUM) each parameter, then divide."""
    with torch.no_grad():
        for param in model.parameters():
            dist.all_reduce(param, op=dist.ReduceOp.SUM)
            param /= world_size


def rounding(diff):
    """A float difference as printed: its last bits vary between machines, so small ones read '< 1e-5'."""
    return "< 1e-5" if diff < 1e-5 else f"{diff:.2g}"


def distance_between_replicas(model):
    """The L2 distance of this rank's parameters from rank 0's (every rank calls it: a collective)."""
    mine = flat_parameters(model)
    theirs = mine.clone()
    dist.broadcast(theirs, src=0)
    gathered = torch.zeros(world_size, dtype=torch.float64)
    gathered[rank] = float((mine - theirs).norm())
    dist.all_reduce(gathered)  # every rank's distance, on every rank
    return float(gathered.max())


# ---- 1. a forward pass changes no parameter, only buffers ----------------------------------------------
model = build_model(seed=0, batchnorm=True)  # the same seed everywhere: identical replicas
params_before = flat_parameters(model)
buffers_before = {name: b.clone() for name, b in model.named_buffers()}
with torch.no_grad():
    model(my_batch(0)[0])  # train mode, no backward, no optimizer step
params_unchanged = torch.equal(flat_parameters(model), params_before)
buffers_changed = [name for name, b in model.named_buffers() if not torch.equal(b, buffers_before[name])]
after_forward = compare_replicas(model)
print(f"forward (train mode): parameters unchanged {params_unchanged}, buffers changed {buffers_changed}")
print(f"after the forward: {after_forward}")

model.eval()
state = {k: v.clone() for k, v in model.state_dict().items()}
with torch.no_grad():
    model(my_batch(1)[0])
eval_unchanged = all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
print(f"forward (eval mode): everything unchanged {eval_unchanged}")

# The source's Example 2 right after that forward: averaging identical parameters changes nothing.
average_parameters_by_hand(model)
example2_change = float((flat_parameters(model) - params_before).abs().max())
print(f"source's Example 2 after a forward: parameters moved by {example2_change}")
report(params_unchanged=params_unchanged, buffers_changed=buffers_changed, eval_unchanged=eval_unchanged,
       after_forward=after_forward.as_dict(), example2_change=example2_change)

# ---- 2. local SGD: drift, then average; by hand and with torch's PeriodicModelAverager -------------
by_hand = build_model(seed=0, batchnorm=True)
library = build_model(seed=0, batchnorm=True)
default = build_model(seed=0, batchnorm=True)
optimizers = [torch.optim.SGD(m.parameters(), lr=LEARNING_RATE) for m in (by_hand, library, default)]
# PeriodicModelAverager averages on its first call (its step 0); warmup_steps = k - 1 moves its
# averagings to after steps k, 2k, ... like the hand-written loop.
aligned = PeriodicModelAverager(period=AVERAGE_EVERY, warmup_steps=AVERAGE_EVERY - 1)
as_shipped = PeriodicModelAverager(period=AVERAGE_EVERY)
drift_before, drift_after, vs_library, default_averaged_at = [], [], [], []
for step in range(1, STEPS + 1):
    x, y = my_batch(step)
    for m, opt in zip((by_hand, library, default), optimizers):
        train_step(m, opt, x, y)
    drift_before.append(distance_between_replicas(by_hand))
    if step % AVERAGE_EVERY == 0:
        average_parameters_by_hand(by_hand)
    drift_after.append(distance_between_replicas(by_hand))
    aligned.average_parameters(library.parameters())
    as_shipped.average_parameters(default.parameters())
    if distance_between_replicas(default) == 0.0:
        default_averaged_at.append(step)
    vs_library.append(float((flat_parameters(by_hand) - flat_parameters(library)).abs().max()))
print("distance between replicas before averaging:", " ".join(f"{d:.3f}" for d in drift_before))
print("after (averaging after steps 4, 8, ...):   ", " ".join(f"{d:.3f}" for d in drift_after))
print(f"max |by hand - PeriodicModelAverager| over all steps: {max(vs_library):.2g}")
print(f"PeriodicModelAverager(period={AVERAGE_EVERY}) without warmup averaged after steps {default_averaged_at}")

library_replicas = compare_replicas(library)  # the library averaged parameters only
# Buffers handed to an averager: it filters its input (parameters that have a gradient) only on the calls
# where it averages, so the calls before pass silently and the first averaging call raises.
buffers_averager = PeriodicModelAverager(period=AVERAGE_EVERY, warmup_steps=AVERAGE_EVERY - 1)
buffers_calls = []
for call in range(1, AVERAGE_EVERY + 1):
    try:
        buffers_averager.average_parameters(library.buffers())
        buffers_calls.append("returned")
    except NotImplementedError as error:  # buffers are plain tensors, not nn.Parameter
        buffers_calls.append(f"NotImplementedError: {error}")
print(f"after PeriodicModelAverager: {library_replicas}")
print(f"giving it model.buffers(), calls 1 to {AVERAGE_EVERY}: {buffers_calls}")
report(drift_before=drift_before, drift_after=drift_after, vs_library=vs_library,
       default_averaged_at=default_averaged_at, library_replicas=library_replicas.as_dict(),
       buffers_calls=buffers_calls)

# Averaging the weights after every step (k = 1) vs DDP (gradient averaging), for three optimizers.
# SGD's update, momentum and weight decay included, is linear in the gradients: the mean of the ranks'
# updates is the update of the mean gradient. Adam divides by the root of its second moment: not linear.
OPTIMIZERS = {
    "SGD": lambda params: torch.optim.SGD(params, lr=LEARNING_RATE),
    "SGD momentum=0.9 weight_decay=0.01": lambda params: torch.optim.SGD(
        params, lr=LEARNING_RATE, momentum=0.9, weight_decay=0.01),
    "Adam": lambda params: torch.optim.Adam(params, lr=LEARNING_RATE),
}
k1_vs_ddp, momentum_spread, momentum_mean_vs_ddp = {}, None, None
for label, make_optimizer in OPTIMIZERS.items():
    every_step = build_model(seed=1)
    ddp = nn.parallel.DistributedDataParallel(build_model(seed=1))
    opt_a, opt_b = make_optimizer(every_step.parameters()), make_optimizer(ddp.parameters())
    for step in range(1, 6):
        x, y = my_batch(step)
        train_step(every_step, opt_a, x, y)
        average_parameters_by_hand(every_step)
        train_step(ddp, opt_b, x, y)
    k1_vs_ddp[label] = float((flat_parameters(every_step) - flat_parameters(ddp.module)).abs().max())
    if "momentum" in label:  # each rank's momentum differs; their mean is DDP's momentum
        mine = torch.cat([opt_a.state[p]["momentum_buffer"].reshape(-1) for p in every_step.parameters()])
        ddps = torch.cat([opt_b.state[p]["momentum_buffer"].reshape(-1) for p in ddp.module.parameters()])
        others = mine.clone()
        dist.broadcast(others, src=0)
        spread = torch.tensor([float((mine - others).abs().max())])
        dist.all_reduce(spread, op=dist.ReduceOp.MAX)
        momentum_spread = float(spread)
        dist.all_reduce(mine)
        momentum_mean_vs_ddp = float((mine / world_size - ddps).abs().max())
    del ddp
for label, diff in k1_vs_ddp.items():
    print(f"averaging weights every step vs DDP, 5 steps of {label}: max |diff| {rounding(diff)}")
print(f"momentum buffers: differ between ranks by up to {momentum_spread:.2g}; "
      f"their mean vs DDP's: max |diff| {rounding(momentum_mean_vs_ddp)}")
report(k1_vs_ddp=k1_vs_ddp, momentum_spread=momentum_spread, momentum_mean_vs_ddp=momentum_mean_vs_ddp)

# Two premises of the source, run. "Only rank 0 runs the forward", then rank 0's weights are broadcast:
replica = build_model(seed=0, batchnorm=True)  # identical replicas
before = {name: t.clone() for name, t in list(replica.named_parameters()) + list(replica.named_buffers())}
if rank == 0:
    with torch.no_grad():
        replica(my_batch(0)[0])  # train mode: BatchNorm statistics change on rank 0 only
with torch.no_grad():
    for tensor in list(replica.parameters()) + list(replica.buffers()):
        dist.broadcast(tensor, src=0)  # the source's Example 1, one tensor at a time
moved = sorted(name for name, t in list(replica.named_parameters()) + list(replica.named_buffers())
               if not torch.equal(t, before[name]))
print(f"only rank 0 ran a forward, then broadcast: tensors that changed on this rank: {moved}")

# "Gradients computed by a separate process": rank 1 takes rank 0's output and runs backward on a loss of
# it. Rank 0's weights produced those values, rank 1's did not, so the true gradient reaches rank 0 only.
def backward_through(send):
    """This rank's (weight gradient's abs sum, warnings) after rank 1's loss on rank 0's output, sent by `send`."""
    net = build_model(seed=0)  # identical replicas; each rank's forward runs on its own batch
    x, y = my_batch(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        received = send(net(x))
        # every rank calls backward (a differentiable collective's backward is a collective too); only rank 1's
        # loss counts
        (F.mse_loss(received, y) if rank == 1 else 0 * received.sum()).backward()
    return {"grad": float(sum(p.grad.abs().sum() for p in net.parameters())),
            "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}


def plain_broadcast(out):
    dist.broadcast(out, src=0)  # writes rank 0's values into this rank's output, in place
    return out


# torch.distributed.nn.functional: collectives with a backward; broadcast's sends the gradient back to the source
broadcast_backward = {"dist.broadcast": backward_through(plain_broadcast),
                      "torch.distributed.nn.functional.broadcast": backward_through(
                          lambda out: torch.distributed.nn.functional.broadcast(out, 0))}
import torch.distributed.autograd  # noqa: E402  cross-process autograd exists, for the RPC framework
import torch.distributed.rpc as rpc  # noqa: E402
for how, result in broadcast_backward.items():
    print(f"rank 1's backward on rank 0's output received by {how}: this rank's weight gradient "
          f"{'none' if result['grad'] == 0.0 else 'non-zero'}; warnings "
          f"{[w.split('. This behavior')[0] for w in result['warnings']]}")
report(rank0_forward_moved=moved, broadcast_backward=broadcast_backward,
       distributed_autograd=hasattr(torch.distributed.autograd, "backward") and rpc.is_available())

# ---- 3. broadcasting rank 0's weights -----------------------------------------------------------------
try:
    dist.broadcast(build_model(seed=rank).parameters(), src=0)  # the source's Example 1, as written
    source_error = ""
except TypeError as error:
    source_error = " ".join(f"TypeError: {error}".split())
print(f"dist.broadcast(model.parameters(), src=0) -> {source_error}")


def broadcast_per_tensor(model):
    """One message per parameter and per buffer."""
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor, src=0)


def broadcast_flat(model):
    """One message for all parameters: flatten, broadcast, copy back (buffers: per tensor, there are few)."""
    with torch.no_grad():
        flat = parameters_to_vector(model.parameters())
        dist.broadcast(flat, src=0)
        vector_to_parameters(flat, model.parameters())
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)


checks = {}
for name, fn in (("per tensor", broadcast_per_tensor), ("flattened", broadcast_flat)):
    replica = build_model(seed=rank, batchnorm=True)  # a different model on every rank
    differ_before = not compare_replicas(replica).identical
    fn(replica)
    checks[name] = differ_before and compare_replicas(replica).identical
print(f"replicas identical after broadcast: {checks}")


def deep_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Linear(DEEP_WIDTH, DEEP_WIDTH) for _ in range(DEEP_LAYERS)])


deep = deep_model(seed=rank)
timings = {}
for name, fn in (("per tensor", broadcast_per_tensor), ("flattened", broadcast_flat)):
    fn(deep)  # warm-up
    times = []
    for _ in range(BROADCAST_REPEATS):
        dist.barrier()
        start = time.perf_counter()
        fn(deep)
        times.append(time.perf_counter() - start)
    timings[name] = sorted(times)[len(times) // 2]  # the median
tensors = len(list(deep.parameters()))
numel = sum(p.numel() for p in deep.parameters())
print(f"timed: broadcast of {tensors} tensors ({numel * 4 / 2**20:.2f} MiB) per tensor and flattened "
      f"(median of {BROADCAST_REPEATS}; the numbers are in the report)")
report(source_error=source_error, broadcast_ok=checks, broadcast_ms={k: v * 1e3 for k, v in timings.items()},
       deep_tensors=tensors, deep_mib=numel * 4 / 2**20)

# ---- the source's "custom shared memory" suggestion: what the named module holds -----------------------
nvtx_functions = sorted(n for n in dir(torch.cuda.nvtx) if not n.startswith("_") and callable(getattr(torch.cuda.nvtx, n)))
shared = torch.zeros(4).share_memory_()
report(nvtx_functions=nvtx_functions, share_memory=shared.is_shared())

# Library facts the notebook states: the post-local-SGD optimizer exists, DDP's default bucket size.
import torch.distributed.optim
import torch.nn.parallel.distributed as ddp_module
report(post_local_sgd_optimizer=hasattr(torch.distributed.optim, "PostLocalSGDOptimizer"),
       default_bucket_cap_mb=ddp_module._DEFAULT_BUCKET_CAP_MB)
if __name__ == "__main__":  # run alone; inside 04_sync.py the next part uses the same group
    dist.destroy_process_group()
