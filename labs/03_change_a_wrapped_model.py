# =====================================================================================================
# Lab 03, learner copy: replace each TODO's raise line with your code, then check your work with
#     python -m ddpcourse check labs/03_change_a_wrapped_model.py
# Stuck on a TODO? `python -m ddpcourse hint 03` shows the next hint, one level at a time.
# Generated from solutions/03_change_a_wrapped_model.py by `python -m ddpcourse make-labs`; course authors edit that file.
# =====================================================================================================
"""Lab 03: change a model that DDP already wraps, and keep every replica the same.

A training run is under way on every rank. Two changes arrive mid-run:
  1. the network gets deeper: a new hidden layer goes in before the output layer;
  2. rank 0 alone calibrates the output bias on a held-out set that only rank 0 reads.
Both must end up identical on every rank, and the new layer must train.

Your tasks (clean/03_change_a_wrapped_model.ipynb shows each mistake and its fix):
  TODO 1  grow:      the deeper network exists on every rank, and its new layer trains
  TODO 2  calibrate: rank 0 shifts the output bias, then every rank receives rank 0's bias

Run it:    python labs/03_change_a_wrapped_model.py                  (one process: world size 1)
           python -m ddpcourse run labs/03_change_a_wrapped_model.py --nproc 3
Check it:  python -m ddpcourse check labs/03_change_a_wrapped_model.py
"""
from collections import OrderedDict

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse import init_distributed, report
from ddpcourse.lab import compare_replicas
from ddpcourse.toy import build_model, make_dataset

# -----------------------------------------------------------------------------
SEED = 0               # every rank builds the same starting model
LEARNING_RATE = 0.05
STEPS = 4              # training steps before the growth, after it, and after the calibration
VALIDATION_SEED = 1    # the held-out set rank 0 calibrates on (a different draw of the same problem)
VALIDATION_SAMPLES = 32
# -----------------------------------------------------------------------------


def insert_hidden_layer(net):
    """TinyNet's output layer fc2 becomes fc2.new (a new Linear + ReLU) followed by fc2.out (the old fc2).

    Changes `net` in place on the rank that calls it. The new layer's starting values come from this
    rank's random number generator.
    """
    hidden = net.fc2.in_features
    device = net.fc2.weight.device
    net.fc2 = nn.Sequential(OrderedDict(new=nn.Linear(hidden, hidden), relu=nn.ReLU(), out=net.fc2)).to(device)


def train(model, optimizer, x, y, steps=STEPS):
    for _ in range(steps):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()  # DDP averages the gradients of the parameters it registered
        optimizer.step()


def grow(model, optimizer):
    """Add the hidden layer to the DDP-wrapped `model`. Returns (model, optimizer) that train ALL its layers,
    identically on every rank."""
    # TODO 1: change the network inside the wrapper on every rank; the old wrapper and the old
    #         optimizer know only the old parameters, so replace both
    raise NotImplementedError('TODO 1: change the network inside the wrapper on every rank; the old wrapper and the old optimizer know only the old parameters, so replace both')
    return model, optimizer


def calibrate(model, rank, x_validation, y_validation):
    """Rank 0 adds its mean validation error, (y_validation - prediction).mean(), to the output bias, so that
    the mean prediction moves onto the targets; afterwards every rank holds rank 0's bias."""
    bias = model.module.fc2.out.bias
    # TODO 2: one rank computes the correction (the mean error on the validation set) and applies
    #         it; then its result must reach every replica. No gradients are involved
    raise NotImplementedError('TODO 2: one rank computes the correction (the mean error on the validation set) and applies it; then its result must reach every replica. No gradients are involved')


def main():
    rank, world_size, device = init_distributed()
    x, y = make_dataset(seed=SEED).tensors
    x_local, y_local = x[rank::world_size].to(device), y[rank::world_size].to(device)  # this rank's shard

    model = DDP(build_model(SEED).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    train(model, optimizer, x_local, y_local)

    # Change 1: a deeper network, mid-run.
    model, optimizer = grow(model, optimizer)
    new_layer = model.module.fc2.new
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    report(new_layer_at_growth=[p.detach().clone() for p in new_layer.parameters()],
           optimizer_tensors=len(optimized),
           optimizer_holds_new_layer=all(id(p) in optimized for p in new_layer.parameters()),
           model_tensors=len(list(model.parameters())))
    train(model, optimizer, x_local, y_local)

    # Change 2: rank 0 calibrates on data only it reads (here every rank could make it; pretend it cannot).
    x_validation, y_validation = (t.to(device) for t in make_dataset(VALIDATION_SAMPLES, seed=VALIDATION_SEED).tensors)
    bias = model.module.fc2.out.bias
    with torch.no_grad():
        predictions = model.module(x_validation)
    bias_before = bias.item()
    calibrate(model, rank, x_validation, y_validation)
    report(validation_predictions=predictions.flatten(), bias_before=bias_before, bias_after=bias.item())
    train(model, optimizer, x_local, y_local)

    replicas = compare_replicas(model)
    print(f"after growth and calibration: {replicas}")
    report(new_layer_final=[p.detach().clone() for p in new_layer.parameters()], replicas=replicas.as_dict())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
