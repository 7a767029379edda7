# =====================================================================================================
# Lab 05, learner copy: replace each TODO's raise line with your code, then check your work with
#     python -m ddpcourse check labs/05_resilient_trainer.py
# Stuck on a TODO? `python -m ddpcourse hint 05` shows the next hint, one level at a time.
# Generated from solutions/05_resilient_trainer.py by `python -m ddpcourse make-labs`; course authors edit that file.
# =====================================================================================================
"""Lab 05: a DDP trainer that survives a crash. Checkpoints, resume, and a fresh shuffle every epoch.

`torchrun --max-restarts 1` restarts *every* rank after one of them dies. It restarts processes, not
training: whatever the script did not save is gone. This trainer saves a checkpoint every few steps and,
when it starts, resumes from the last one, so that a crash costs a few steps and changes nothing else:
the final weights are exactly those of a run that never crashed.

Your tasks (clean/05_launching_and_scaling_out.ipynb explains each):
  TODO 1  load_checkpoint: if a checkpoint exists, restore model, optimizer and step on every rank
  TODO 2  epoch_order: give each epoch its own shuffle, the same on every rank
  TODO 3  save_checkpoint: rank 0 alone writes, atomically; every rank waits until it is written

Run:       python -m ddpcourse run labs/05_resilient_trainer.py --nproc 2 -- --checkpoint-dir /tmp/ckpt
Crash it:  python -m ddpcourse run labs/05_resilient_trainer.py --nproc 2 --max-restarts 1 \
               -- --checkpoint-dir /tmp/ckpt2 --fail-at-step 7
Check:     python -m ddpcourse check labs/05_resilient_trainer.py
Plain torchrun with --max-restarts: --standalone or --rdzv-backend c10d, and export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
first, or the restarted ranks can read the dead attempt's addresses from the store torchrun keeps and fail to
connect (notebook 05, section 8).
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from ddpcourse import init_distributed, report
from ddpcourse.toy import build_model, make_dataset

# ---- config -------------------------------------------------------------------------------------
EPOCHS = 3
SAMPLES = 48            # divisible by 1, 2 and 3 ranks: no padding, every sample exactly once per epoch
BATCH_PER_RANK = 4
LR = 0.05
MOMENTUM = 0.5          # momentum buffers are optimizer state: a resume that forgets them drifts
CHECKPOINT_EVERY = 3    # optimizer steps between checkpoints
SEED = 0
# DDP regroups its gradient buckets after the first iteration. With 3 or more ranks the grouping decides
# the order in which the ranks' gradients are added, so a resumed run, whose first step uses the initial
# grouping, would end a few float32 ulps away from an uninterrupted one. DDP skips the regrouping when
# find_unused_parameters=True, so every step adds in the same order and a resume is bit-exact.
BIT_EXACT_RESUME = True
# -------------------------------------------------------------------------------------------------


def load_checkpoint(path, model, optimizer):
    """Restore model and optimizer from `path` if it exists. Returns the step to continue from (0 if none)."""
    # TODO 1: a first start has no checkpoint: begin at step 0. Otherwise restore the wrapped model
    #         and the optimizer, and resume at the saved step; load data only, never code
    raise NotImplementedError('TODO 1: a first start has no checkpoint: begin at step 0. Otherwise restore the wrapped model and the optimizer, and resume at the saved step; load data only, never code')


def epoch_order(sampler, epoch):
    """The sample indices this rank trains on in `epoch`, in the order it trains on them."""
    # TODO 2: the sampler shuffles with a seed and an epoch number that it has to be told: the same
    #         epoch gives the same order on every rank, a new epoch a new order
    raise NotImplementedError('TODO 2: the sampler shuffles with a seed and an epoch number that it has to be told: the same epoch gives the same order on every rank, a new epoch a new order')


def save_checkpoint(path, model, optimizer, step, rank):
    """Write model, optimizer and step to `path`, from rank 0 alone; return once it is on disk."""
    # TODO 3: the replicas are identical, so one writer is enough; a crash mid-write must never
    #         leave a half-written file under the checkpoint's name; no rank goes on before the file
    #         exists
    raise NotImplementedError("TODO 3: the replicas are identical, so one writer is enough; a crash mid-write must never leave a half-written file under the checkpoint's name; no rank goes on before the file exists")


def file_digest(path):
    """The checkpoint this rank would load now, as a digest (None: no file)."""
    if not os.path.exists(path):
        return None
    with open(path, "rb") as file:
        return hashlib.sha1(file.read()).hexdigest()


def main():
    parser = argparse.ArgumentParser()
    # No default: a folder picked by each process would differ between ranks and between restarts.
    parser.add_argument("--checkpoint-dir", required=True, help="where the checkpoint lives (created if missing)")
    parser.add_argument("--fail-at-step", type=int, default=-1,
                        help="a crash to recover from: on the first attempt the last rank dies after this step")
    options = parser.parse_args()
    os.makedirs(options.checkpoint_dir, exist_ok=True)  # rank 0's first save needs it; exist_ok: every rank may try
    path = os.path.join(options.checkpoint_dir, "checkpoint.pt")

    rank, world_size, device = init_distributed()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dataset = make_dataset(samples=SAMPLES, seed=SEED)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=SEED)
    model = DDP(build_model(SEED).to(device), find_unused_parameters=BIT_EXACT_RESUME)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    steps_per_epoch = len(sampler) // BATCH_PER_RANK

    start_step = load_checkpoint(path, model, optimizer)
    print(f"attempt {attempt}: starting at step {start_step} of {EPOCHS * steps_per_epoch}")
    orders, seen, step, loss = [], [], start_step, torch.tensor(float("nan"))
    for epoch in range(start_step // steps_per_epoch, EPOCHS):
        order = epoch_order(sampler, epoch)
        orders.append(order)
        for batch in range(step % steps_per_epoch, steps_per_epoch):  # skip what the checkpoint already did
            if attempt == 0 and step == options.fail_at_step and rank == world_size - 1:
                print(f"simulated crash at step {step}", flush=True)
                os._exit(1)  # like a killed process: no cleanup, no exception
            indices = order[batch * BATCH_PER_RANK:(batch + 1) * BATCH_PER_RANK]
            x, y = dataset.tensors[0][indices].to(device), dataset.tensors[1][indices].to(device)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % CHECKPOINT_EVERY == 0:
                save_checkpoint(path, model, optimizer, step, rank)
                seen.append(file_digest(path))  # what this rank finds once save_checkpoint has returned
    print(f"attempt {attempt}: finished {step} steps, last loss {loss.item():.4f}")
    report(attempt=attempt, start_step=start_step, steps=step, steps_per_epoch=steps_per_epoch,
           checkpoint_every=CHECKPOINT_EVERY, samples=SAMPLES, orders=orders, first_epoch=start_step // steps_per_epoch,
           weights=model.module.state_dict(), checkpoints_seen=seen)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
