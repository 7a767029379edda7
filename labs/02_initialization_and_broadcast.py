# =====================================================================================================
# Lab 02, learner copy: replace each TODO's raise line with your code, then check your work with
#     python -m ddpcourse check labs/02_initialization_and_broadcast.py
# Stuck on a TODO? `python -m ddpcourse hint 02` shows the next hint, one level at a time.
# Generated from solutions/02_initialization_and_broadcast.py by `python -m ddpcourse make-labs`; course authors edit that file.
# =====================================================================================================
"""Lab 02: initialization and weight broadcast. Make every rank start from the same weights.

Every rank builds its own copy of the model. If the copies start different (a seed per rank, a custom
init or a checkpoint loaded on rank 0 only), data-parallel training averages gradients of different
models. DDP's constructor fixes that by broadcasting rank 0's parameters and buffers; here you write
that broadcast yourself, for any source rank, then train on sharded data with DDP(model, init_sync=False),
which skips the constructor's broadcast: the replicas start equal only if yours worked.

Your tasks (clean/02_initialization_and_broadcast.ipynb explains both):
  TODO 1  broadcast_module_: src's parameters AND buffers into every rank's tensors, in place
  TODO 2  make_loader: each rank reads its own shard of the dataset

Run it:    python labs/02_initialization_and_broadcast.py                  (one process: world size 1)
           python -m ddpcourse run labs/02_initialization_and_broadcast.py --nproc 3
Check it:  python -m ddpcourse check labs/02_initialization_and_broadcast.py
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddpcourse import init_distributed, report
from ddpcourse.lab import compare_replicas
from ddpcourse.toy import build_model, make_dataset

# -----------------------------------------------------------------------------
SEED = 0           # shared: the dataset, the sampler's shuffle
BATCH_SIZE = 8     # per rank
LR = 0.1
WARMUP_ROWS = 8    # rows per BatchNorm warm-up batch: gives each rank its own running statistics
# -----------------------------------------------------------------------------


def broadcast_module_(module, src):
    """Copy rank `src`'s parameters and buffers into `module` on every rank, in place.

    The tensors stay the same objects (an optimizer built before keeps pointing at them), and autograd does
    not record the copy: it is no step of the model, and a later backward must not go through it.
    """
    # TODO 1: every rank must end with src's values in the tensors it already holds (the module
    #         keeps pointing at them): the learned values and the running statistics
    raise NotImplementedError("TODO 1: every rank must end with src's values in the tensors it already holds (the module keeps pointing at them): the learned values and the running statistics")


def make_loader(dataset, rank, world_size):
    """A DataLoader over this rank's shard only: the shards of all ranks are disjoint and cover the data."""
    # TODO 2: each rank reads its own part of the dataset; the parts together cover it once,
    #         shuffled the same way on every rank
    raise NotImplementedError('TODO 2: each rank reads its own part of the dataset; the parts together cover it once, shuffled the same way on every rank')


def differently_started(rank):
    """A BatchNorm model that starts different on every rank: seeded by rank, statistics warmed on rank+1
    batches of its own. The check rebuilds it for any rank, to know what every rank started with."""
    model = build_model(seed=100 + rank, batchnorm=True)
    generator = torch.Generator().manual_seed(200 + rank)
    for _ in range(rank + 1):
        model(torch.randn(WARMUP_ROWS, 8, generator=generator) + rank)
    return model


def state_of(module):
    """Every parameter and buffer, by name, as plain numbers (for report)."""
    return {name: t.detach().double().flatten().tolist() for name, t in module.state_dict().items()}


def main():
    rank, world_size, device = init_distributed()

    # Part 1: broadcast from every source rank in turn; the replicas must become rank src's model.
    for src in range(world_size):
        model = differently_started(rank).to(device)
        tensors = list(model.parameters()) + list(model.buffers())
        pointers = [t.data_ptr() for t in tensors]
        broadcast_module_(model, src)
        replicas = compare_replicas(model)
        now = list(model.parameters()) + list(model.buffers())
        same_objects = (len(now) == len(tensors) and all(a is b for a, b in zip(now, tensors))
                        and pointers == [t.data_ptr() for t in now])
        print(f"broadcast_module_(model, src={src}): {replicas}; same tensors as before: {same_objects}")
        report(**{f"src{src}": {"state": state_of(model), "replicas": replicas.as_dict(),
                                "same_objects": same_objects}})

    # Part 2: start identical replicas without DDP (seeds differ on purpose), then train with DDP.
    model = build_model(seed=SEED + rank).to(device)
    broadcast_module_(model, src=0)
    before_ddp = compare_replicas(model)
    print(f"after broadcast_module_, before DDP: {before_ddp}")
    ddp = DDP(model, init_sync=False)  # no check, no broadcast: training starts from what broadcast_module_ left
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    data = make_dataset(seed=SEED)
    dataset = TensorDataset(torch.arange(len(data)), *data.tensors)  # each sample carries its index
    batches = []
    for indices, x, y in make_loader(dataset, rank, world_size):
        loss = nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        batches.append(indices.tolist())
    after_training = compare_replicas(ddp)
    print(f"after {len(batches)} DDP steps on {sum(map(len, batches))} samples of this rank: {after_training}")
    report(before_ddp=before_ddp.as_dict(), after_training=after_training.as_dict(), batches=batches,
           trained=state_of(ddp.module))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
