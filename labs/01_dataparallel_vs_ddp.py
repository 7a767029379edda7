# =====================================================================================================
# Lab 01, learner copy: replace each TODO's raise line with your code, then check your work with
#     python -m ddpcourse check labs/01_dataparallel_vs_ddp.py
# Stuck on a TODO? `python -m ddpcourse hint 01` shows the next hint, one level at a time.
# Generated from solutions/01_dataparallel_vs_ddp.py by `python -m ddpcourse make-labs`; course authors edit that file.
# =====================================================================================================
"""Lab 01: data-parallel training by hand, then the same training with DistributedDataParallel.

Every rank holds a full copy of the model. At each step each rank trains on its own block of the global
batch, the ranks average their gradients, and every rank takes the same optimizer step, so the copies
stay identical and the result equals one process training on the whole global batch.

Your tasks (clean/01_dataparallel_vs_ddp.ipynb shows each step running):
  TODO 1  shard_indices:     this rank's block of the global batch
  TODO 2  average_gradients: every rank ends with each gradient's mean over all ranks
  TODO 3  train_with_ddp:    the same training, with DistributedDataParallel doing TODO 2 for you

Run it:    python labs/01_dataparallel_vs_ddp.py                  (one process: world size 1)
           python -m ddpcourse run labs/01_dataparallel_vs_ddp.py --nproc 3
Check it:  python -m ddpcourse check labs/01_dataparallel_vs_ddp.py
"""
import gc

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from ddpcourse import init_distributed, report
from ddpcourse.lab import compare_replicas
from ddpcourse.toy import build_model, make_dataset

# ----------------------------------------------------------------------------- config
SEED = 0             # the same seed on every rank: every replica starts from the same weights
PER_RANK_BATCH = 4   # B: samples per rank per step; one step's global batch is world_size * B samples
STEPS = 3            # k: optimizer steps
LR = 0.1


def shard_indices(step, rank, world_size, per_rank_batch):
    """The indices of the samples `rank` trains on at `step`: its block of that step's global batch.

    The global batch of step s is samples s*W*B ... (s+1)*W*B - 1 (W = world_size, B = per_rank_batch);
    rank r takes the r-th block of B samples of it.
    """
    # TODO 1: count the samples all ranks used in the earlier steps, then the blocks of the ranks
    #         before this one in this step: this rank's block comes next
    raise NotImplementedError("TODO 1: count the samples all ranks used in the earlier steps, then the blocks of the ranks before this one in this step: this rank's block comes next")


def average_gradients(model, world_size):
    """Replace every parameter's .grad by its mean over all ranks: what DDP does during backward()."""
    # TODO 2: each rank's gradients come from its own shard; every rank must end with their average
    #         over all ranks, where the optimizer reads them
    raise NotImplementedError("TODO 2: each rank's gradients come from its own shard; every rank must end with their average over all ranks, where the optimizer reads them")


def train_by_hand(rank, world_size, x_all, y_all):
    model = build_model(SEED)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        indices = shard_indices(step, rank, world_size, PER_RANK_BATCH)
        optimizer.zero_grad()
        F.mse_loss(model(x_all[indices]), y_all[indices]).backward()  # this rank's gradient only
        average_gradients(model, world_size)                           # now the global batch's gradient
        if step == 0:  # the check compares the first step's gradients with its own
            first_shard = indices
            first_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        optimizer.step()  # every rank, the same gradient: the same update
    return model, first_shard, first_grads


def train_with_ddp(rank, world_size, x_all, y_all):
    model = build_model(SEED)
    # TODO 3: let torch do what average_gradients does by hand: wrap the model so that the backward
    #         pass averages the gradients over the ranks
    raise NotImplementedError('TODO 3: let torch do what average_gradients does by hand: wrap the model so that the backward pass averages the gradients over the ranks')
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=LR)
    for step in range(STEPS):
        indices = shard_indices(step, rank, world_size, PER_RANK_BATCH)
        optimizer.zero_grad()
        F.mse_loss(ddp_model(x_all[indices]), y_all[indices]).backward()  # no average_gradients: DDP did it
        optimizer.step()
    return ddp_model


def main():
    rank, world_size, device = init_distributed()  # the toy model is tiny: it stays on the CPU
    x_all, y_all = make_dataset(samples=96, seed=SEED).tensors

    by_hand, first_shard, first_grads = train_by_hand(rank, world_size, x_all, y_all)
    hand_replicas = compare_replicas(by_hand)
    with_ddp = train_with_ddp(rank, world_size, x_all, y_all)
    ddp_replicas = compare_replicas(with_ddp)

    hand_weights = {name: p.detach() for name, p in by_hand.named_parameters()}
    ddp_weights = {name: p.detach() for name, p in with_ddp.module.named_parameters()}
    gap = max(float((hand_weights[n] - ddp_weights[n]).abs().max()) for n in hand_weights)
    print(f"step 0 trained on samples {first_shard}; by hand: {hand_replicas}; "
          f"with DDP: {ddp_replicas}; max |by hand - DDP| = {gap:.1e}")
    report(config={"seed": SEED, "per_rank_batch": PER_RANK_BATCH, "steps": STEPS, "lr": LR},
           first_shard=first_shard, first_grads=first_grads, hand_weights=hand_weights,
           ddp_weights=ddp_weights, hand_replicas=hand_replicas.as_dict(),
           ddp_replicas=ddp_replicas.as_dict())
    del with_ddp
    gc.collect()  # free the DDP wrapper (it holds the process group) before the group goes: a clean exit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
