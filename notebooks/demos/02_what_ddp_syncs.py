"""Demo for notebook 02, sections 3, 4 and 6: what DDP sends after its constructor, what it never syncs, and a
seeding policy.

python -m ddpcourse run notebooks/demos/02_what_ddp_syncs.py --nproc 2
"""
import gc
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.join import Join
from torch.distributed.algorithms.model_averaging.utils import average_parameters
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from ddpcourse import init_distributed, report
from ddpcourse.lab import CollectiveLog, compare_replicas
from ddpcourse.toy import TinyNet, build_model, make_dataset

# -----------------------------------------------------------------------------
SEED = 0          # shared seed: initial weights, the sampler's shuffle
BATCH_SIZE = 8    # per rank
LR = 0.1
STEPS = 3
# -----------------------------------------------------------------------------

rank, world_size, device = init_distributed()
dataset = make_dataset(seed=SEED)
x_all, y_all = dataset.tensors


def gather(value):
    """`value` from every rank, in rank order (an all_gather_object: fine for small Python values)."""
    values = [None] * world_size
    dist.all_gather_object(values, value)
    return values


def train(ddp, optimizer, steps=STEPS, shift=0.0, collectives=None):
    """A few SGD steps on rank-specific batches (rank r reads rows r*8...; `shift` moves its inputs).
    Given a list `collectives`, appends the names of the collectives each step launched."""
    for step in range(steps):
        rows = slice((step * world_size + rank) * BATCH_SIZE, (step * world_size + rank + 1) * BATCH_SIZE)
        with CollectiveLog() as log:
            loss = nn.functional.mse_loss(ddp(x_all[rows] + shift * rank), y_all[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if collectives is not None:
            collectives.append(log.names)


facts = {}

# 3a. A parameter edited after wrapping: a plain training loop never sends weights again. Each step's
# collectives are logged: the gradients' all-reduce, and in step 2 the rebuilt bucket order.
def edited_after_wrap():
    ddp = DDP(build_model(seed=SEED))
    if rank == 1:
        with torch.no_grad():
            ddp.module.fc2.weight.mul_(2.0)  # say, a custom init applied on one rank after DDP(...)
    return ddp


ddp, step_collectives = edited_after_wrap(), []
train(ddp, torch.optim.SGD(ddp.parameters(), lr=LR), collectives=step_collectives)
facts["edit_after_wrap"] = compare_replicas(ddp)
# Under Join (uneven inputs: rank 1 takes one step more) DDP does send weights: once every rank has joined,
# it broadcasts the parameters of the last rank to join (_sync_final_model), and the edit spreads.
ddp = edited_after_wrap()
with CollectiveLog() as join_log:
    with Join([ddp]):
        train(ddp, torch.optim.SGD(ddp.parameters(), lr=LR), steps=STEPS - 1 + rank)
facts["after_join"] = compare_replicas(ddp)
join = {"source_rank": int(ddp._authoritative_rank), "last_collectives": join_log.names[-2:]}

# 3b. A plain tensor attribute is not a buffer: neither DDP nor compare_replicas sees it.
class WithInputMean(nn.Module):
    """Subtracts a mean computed from this rank's data: once as a plain attribute, once as a buffer."""

    def __init__(self, net, mean):
        super().__init__()
        self.net = net
        self.plain_mean = mean.clone()                    # a plain attribute: invisible to DDP
        self.register_buffer("buffer_mean", mean.clone())  # a registered buffer: broadcast by DDP

    def forward(self, x):
        return self.net(x - self.buffer_mean)


local_rows = slice(rank * BATCH_SIZE, (rank + 1) * BATCH_SIZE)
wrapped = DDP(WithInputMean(build_model(seed=SEED), x_all[local_rows].mean(0)))
facts["plain_attribute"] = compare_replicas(wrapped)
plain_means = gather(round(float(wrapped.module.plain_mean[0]), 4))
buffer_means = gather(round(float(wrapped.module.buffer_mean[0]), 4))

# 3c. Optimizer state: rank 0 resumes its Adam state from a checkpoint, the other ranks start fresh.
ddp = DDP(build_model(seed=SEED))
optimizer = torch.optim.Adam(ddp.parameters(), lr=0.01)
if rank == 0:
    warm = build_model(seed=SEED)
    warm_optimizer = torch.optim.Adam(warm.parameters(), lr=0.01)
    for _ in range(5):  # the run that wrote the "checkpoint"
        warm_optimizer.zero_grad()
        nn.functional.mse_loss(warm(x_all), y_all).backward()
        warm_optimizer.step()
    optimizer.load_state_dict(warm_optimizer.state_dict())  # loaded on rank 0 only
train(ddp, optimizer)
adam_steps = gather(int(optimizer.state[ddp.module.fc1.weight]["step"]))
facts["optimizer_state"] = compare_replicas(ddp)

# 3d. RNG streams: dropout draws from each rank's own generator; DDP does not touch it.
ddp = DDP(build_model(seed=SEED, dropout=0.5))  # build_model seeded every rank alike: same stream
ones = torch.ones(16)
# Only whether the masks agree is reported: the masks themselves depend on the CPU (bernoulli_ uses MKL's
# generator on Intel CPUs, torch's own elsewhere), so printing them would not repeat on another machine.
masks = gather((ddp.module.drop(ones) > 0).int().tolist())
torch.manual_seed(SEED + 1 + rank)             # now one stream per rank
masks_per_rank = gather((ddp.module.drop(ones) > 0).int().tolist())
masks_equal = {"one shared stream": masks[0] == masks[1], "a stream per rank": masks_per_rank[0] == masks_per_rank[1]}

# 3e. Data: a DataLoader knows nothing about ranks; a DistributedSampler gives each rank its shard.
plain_indices = gather([int(i) for batch in DataLoader(range(len(dataset)), BATCH_SIZE) for i in batch])
sharded = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=SEED)
sharded_indices = gather(list(sharded))
report(edit_after_wrap=facts["edit_after_wrap"].as_dict(), step_collectives=step_collectives,
       after_join=facts["after_join"].as_dict(), join=join, plain_attribute=facts["plain_attribute"].as_dict(),
       plain_means=plain_means, buffer_means=buffer_means, optimizer_state=facts["optimizer_state"].as_dict(),
       adam_steps=adam_steps, masks_equal=masks_equal,
       plain_indices=plain_indices, sharded_indices=sharded_indices)
for name, result in facts.items():
    print(f"{name:16s} {result}")
print(f"plain attribute plain_mean[0] per rank {plain_means}, registered buffer_mean[0] per rank {buffer_means}")
print(f"Adam steps per rank {adam_steps}")
print(f"dropout masks equal on every rank: {masks_equal}")

# 4. Buffers at each forward. torch 2.13 renamed broadcast_buffers to forward_sync_buffers, and the two
# differ at construction: broadcast_buffers=False skips the constructor's buffer broadcast too.
def warmed(rank):
    model = build_model(seed=SEED, batchnorm=True)
    model(x_all[:BATCH_SIZE] + 2.0 * rank)  # running statistics of this rank's own inputs
    return model


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    old_name = DDP(warmed(rank), broadcast_buffers=False)
deprecation = str(caught[0].message).split(".")[0] if caught else None
deprecation_category = caught[0].category.__name__ if caught else None
new_name = DDP(warmed(rank), forward_sync_buffers=False)
at_construction = {"broadcast_buffers=False": compare_replicas(old_name).identical,
                   "forward_sync_buffers=False": compare_replicas(new_name).identical}
print(f"{deprecation}; buffers identical right after DDP(...): {at_construction}")
report(deprecation=deprecation, deprecation_category=deprecation_category,
       buffers_synced_at_construction=at_construction)

# BatchNorm statistics during training. Rank r's inputs are shifted by 2*r, so its statistics differ.
probe = x_all[:4]
bn = {}
for forward_sync_buffers in (True, False):
    ddp = DDP(build_model(seed=SEED, batchnorm=True), forward_sync_buffers=forward_sync_buffers)
    train(ddp, torch.optim.SGD(ddp.parameters(), lr=LR), shift=2.0)
    after_training = compare_replicas(ddp)
    own_mean = ddp.module.norm.running_mean.clone()
    rank0_mean = own_mean.clone()
    dist.broadcast(rank0_mean, src=0)
    ddp.eval()
    with torch.no_grad():
        prediction = ddp(probe)  # the first forward after training syncs the buffers (if forward_sync_buffers)
    after_eval_forward = compare_replicas(ddp)
    bn[forward_sync_buffers] = {
        "after_training": after_training.as_dict(), "after_eval_forward": after_eval_forward.as_dict(),
        "eval_stats_are_rank0s": bool(torch.equal(ddp.module.norm.running_mean, rank0_mean)),
        "predictions": gather([round(v, 4) for v in prediction.flatten().tolist()])}
    print(f"forward_sync_buffers={forward_sync_buffers}: after training {after_training}")
    print(f"forward_sync_buffers={forward_sync_buffers}: after an eval forward {after_eval_forward}")

# Which forwards broadcast the buffers: torch 2.13 broadcasts at the start of a forward when the wrapper's
# require_forward_param_sync flag is set: True from the constructor, then set at the end of each forward (True
# if it ran with gradients enabled and outside no_sync()). Eval mode throughout: the forwards change no statistics.
def drift():
    if rank == 1:
        with torch.no_grad():
            ddp.module.norm.running_mean.add_(1.0)  # rank 1's statistics drift


ddp = DDP(build_model(seed=SEED, batchnorm=True))  # default forward_sync_buffers=True
ddp.eval()
drift()
with torch.no_grad(), CollectiveLog() as first_forward_log:
    ddp(probe)  # the first forward after DDP(...): broadcast, even under no_grad
first_forward = compare_replicas(ddp).identical
drift()
with torch.no_grad():
    ddp(probe)  # follows a no_grad forward: no broadcast
second_no_grad_forward = compare_replicas(ddp).identical
ddp(probe)  # gradients enabled, follows a no_grad forward: no broadcast at its start; its end sets the flag
grad_forward_after_no_grad = compare_replicas(ddp).identical
with torch.no_grad():
    ddp(probe)  # follows a forward with gradients: broadcast
after_forward_with_grad = compare_replicas(ddp).identical
ddp(probe)  # with gradients: the next forward would broadcast...
with ddp.no_sync():
    ddp(probe)  # ...and does; but this one runs inside no_sync(), so its end clears the flag
drift()
with torch.no_grad():
    ddp(probe)  # follows a forward inside no_sync(): no broadcast
after_no_sync_forward = compare_replicas(ddp).identical
which_forwards = {"first forward after DDP(...), under no_grad": first_forward,
                  "no_grad forward after a no_grad forward": second_no_grad_forward,
                  "forward with gradients after a no_grad forward": grad_forward_after_no_grad,
                  "forward after a forward with gradients": after_forward_with_grad,
                  "forward after a forward inside no_sync()": after_no_sync_forward}
print(f"buffers identical after: {which_forwards}; the first forward launched {first_forward_log.names}")
report(which_forwards_sync=which_forwards, first_forward_collectives=first_forward_log.names)

# The CPU options. (1) keep rank 0's statistics (forward_sync_buffers=True, the default); (2) average them over ranks,
# with torch's own averaging utility (it takes any tensors, not only parameters):
ddp = DDP(build_model(seed=SEED, batchnorm=True), forward_sync_buffers=False)
train(ddp, torch.optim.SGD(ddp.parameters(), lr=LR), shift=2.0)
norm = ddp.module.norm
average_parameters(iter([norm.running_mean, norm.running_var]), dist.group.WORLD)
averaged = compare_replicas(ddp)
print(f"after average_parameters on the running statistics: {averaged}")
# (3) SyncBatchNorm, which computes the batch statistics over all ranks: it needs a GPU.
try:
    DDP(nn.SyncBatchNorm.convert_sync_batchnorm(build_model(seed=SEED, batchnorm=True)))
    sync_bn_error = None
except ValueError as error:  # raised on every rank alike, before any collective: safe to catch
    sync_bn_error = f"{type(error).__name__}: {error}"
print(f"SyncBatchNorm on CPU: {sync_bn_error}")
report(bn_broadcast=bn[True], bn_local=bn[False], bn_averaged=averaged.as_dict(), sync_bn_error=sync_bn_error)


# 6. A seeding policy: one seed for the weights, the same seed for the sampler, one stream per rank for the rest.
def seed_all(seed, rank=None):
    """Seed torch (and Python's `random`) with `seed`, or with a seed of this rank's own if `rank` is given.

    seed_all(SEED) before building the model: the same weights everywhere.
    seed_all(SEED, rank) afterwards: dropout masks and augmentation differ per rank, reproducibly.
    """
    import random
    own = seed if rank is None else seed + 1000 * (rank + 1)
    torch.manual_seed(own)
    random.seed(own)
    return own


seed_all(SEED)
model = DDP(TinyNet(dropout=0.5))
seed_all(SEED, rank)
policy_masks = gather((model.module.drop(ones) > 0).int().tolist())
policy_masks_equal = policy_masks[0] == policy_masks[1]
policy_shards = gather(list(DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=SEED)))
wrong_shards = gather(list(DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=SEED + rank)))
policy_weights = compare_replicas(model)
print(f"seeding policy: {policy_weights}; dropout masks equal on every rank: {policy_masks_equal}")
# The price of per-rank streams: a layer built later (as notebook 03 adds one) draws from them and starts
# different on every rank, unless the build is seeded alike again (or a new DDP(...) broadcasts it).
layer_after_rank_seed = compare_replicas(nn.Linear(16, 16))
seed_all(SEED + 1)  # a shared seed for this build only...
layer_after_shared_seed = compare_replicas(nn.Linear(16, 16))
seed_all(SEED + 1, rank)  # ...then back to this rank's stream for dropout
print(f"a layer built after seed_all(SEED, rank): {layer_after_rank_seed}")
print(f"a layer built after seed_all(SEED + 1): {layer_after_shared_seed}")
report(policy_weights=policy_weights.as_dict(), policy_masks_equal=policy_masks_equal, policy_shards=policy_shards,
       wrong_shards=wrong_shards, layer_after_rank_seed=layer_after_rank_seed.as_dict(),
       layer_after_shared_seed=layer_after_shared_seed.as_dict())
if __name__ == "__main__":  # run alone; 02_all_demos.py runs it among other demos and ends the group itself
    del ddp, wrapped, old_name, new_name, model
    gc.collect()  # free every DDP object (they hold the process group) before the group itself goes
    dist.destroy_process_group()
