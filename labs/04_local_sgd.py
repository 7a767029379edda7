# =====================================================================================================
# Lab 04, learner copy: replace each TODO's raise line with your code, then check your work with
#     python -m ddpcourse check labs/04_local_sgd.py
# Stuck on a TODO? `python -m ddpcourse hint 04` shows the next hint, one level at a time.
# Generated from solutions/04_local_sgd.py by `python -m ddpcourse make-labs`; course authors edit that file.
# =====================================================================================================
"""Lab 04: local SGD. Train k steps on your own data, then average the replicas.

DistributedDataParallel averages *gradients* at every step. Local SGD (model averaging) lets every rank
take k optimizer steps on its own data with no communication at all, then averages the *weights*
(parameters and buffers) across ranks: one synchronization per k steps instead of one per step. Between
averagings the replicas drift apart; right after an averaging they are identical again.

Your tasks (clean/04_sync_without_backward.ipynb explains both):
  TODO 1  maybe_average: average only after every k-th optimizer step (steps k, 2k, ...; counted from 1)
  TODO 2  average_model: replace every parameter AND buffer by its mean over ranks

The script also trains a twin model with torch's own PeriodicModelAverager on the same data, so the check
can compare your weights with the library's.

Run it:    python labs/04_local_sgd.py                  (one process: world size 1)
           python -m ddpcourse run labs/04_local_sgd.py --nproc 3
Check it:  python -m ddpcourse check labs/04_local_sgd.py
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.utils.data import DataLoader, DistributedSampler

from ddpcourse import init_distributed, report
from ddpcourse.lab import compare_replicas
from ddpcourse.toy import build_model, make_dataset

# -------------------------------------------------------------------------------------------- config
STEPS = 12           # optimizer steps in total
AVERAGE_EVERY = 4    # k: local steps between two averagings (averaging after steps 4, 8, 12)
BATCH_SIZE = 8       # per rank
LEARNING_RATE = 0.05
SAMPLES = 192        # the shared toy regression data set; DistributedSampler gives each rank its own part
# -----------------------------------------------------------------------------------------------------


def maybe_average(model, step, every, world_size):
    """Average the replicas after every `every`-th optimizer step (step counts from 1). True if it did."""
    # TODO 1: average only on the steps of the schedule (every `every` steps) and tell the caller
    #         whether this step did
    raise NotImplementedError('TODO 1: average only on the steps of the schedule (every `every` steps) and tell the caller whether this step did')


def average_model(model, world_size):
    """Replace every parameter and every buffer of `model` by its mean over all ranks, in place."""
    # TODO 2: replace every rank's parameters and buffers by their mean over the ranks, in place and
    #         without autograd; integer buffers need an integer division
    raise NotImplementedError("TODO 2: replace every rank's parameters and buffers by their mean over the ranks, in place and without autograd; integer buffers need an integer division")


def batches(rank, world_size):
    """This rank's mini-batches, epoch after epoch: each rank sees different samples."""
    sampler = DistributedSampler(make_dataset(SAMPLES), num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(sampler.dataset, batch_size=BATCH_SIZE, sampler=sampler, drop_last=True)
    epoch = 0
    while True:
        sampler.set_epoch(epoch)  # a new order each epoch, the same on every run
        yield from loader
        epoch += 1


def train_step(model, optimizer, x, y):
    optimizer.zero_grad()
    F.mse_loss(model(x), y).backward()
    optimizer.step()


def snapshot(model):
    """Every parameter, then every buffer, flattened into one list (what the check compares)."""
    tensors = [*model.parameters(), *model.buffers()]
    return torch.cat([t.detach().reshape(-1).double() for t in tensors]).tolist()


def main():
    rank, world_size, device = init_distributed()
    # Same seed on every rank: the replicas start identical (notebook 02), BatchNorm gives them buffers.
    model = build_model(seed=0, batchnorm=True).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    # The library's local SGD on a twin: PeriodicModelAverager averages on its first call unless told to
    # wait, so warmup_steps = k - 1 puts its averagings after steps k, 2k, ... like ours.
    twin = build_model(seed=0, batchnorm=True).to(device)
    twin_optimizer = torch.optim.SGD(twin.parameters(), lr=LEARNING_RATE)
    averager = PeriodicModelAverager(period=AVERAGE_EVERY, warmup_steps=AVERAGE_EVERY - 1)

    layout = [(kind, name, t.numel()) for kind, named in (("parameter", model.named_parameters()),
                                                           ("buffer", model.named_buffers()))
              for name, t in named]
    before, after, twin_after, averaged_at, returned = [], [], [], [], []
    data = batches(rank, world_size)
    for step in range(1, STEPS + 1):
        x, y = (t.to(device) for t in next(data))
        train_step(model, optimizer, x, y)
        before.append(snapshot(model))
        returned.append(maybe_average(model, step, AVERAGE_EVERY, world_size))
        if returned[-1]:
            averaged_at.append(step)
        after.append(snapshot(model))

        train_step(twin, twin_optimizer, x, y)
        averager.average_parameters(twin.parameters())
        twin_after.append(torch.cat([p.detach().reshape(-1).double() for p in twin.parameters()]).tolist())

        replicas = compare_replicas(model)  # a collective: every rank calls it at every step
        if rank == 0:
            spread = max((d.max_abs_diff for d in replicas.differences), default=0.0)
            state = "identical" if replicas.identical else f"differ (max |diff| {spread:.2g})"
            print(f"step {step:2d}: {'averaged, ' if step in averaged_at else ''}replicas {state}")

    print(f"averaged after steps {averaged_at}")
    report(layout=layout, before=before, after=after, twin_after=twin_after, averaged_at=averaged_at,
           returned=returned, config={"steps": STEPS, "every": AVERAGE_EVERY})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
