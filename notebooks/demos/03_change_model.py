"""Demo for notebook 03, sections 2 and 3: adding a layer, freezing and unfreezing, after DDP wrapped the model.

Every scenario trains a fresh DDP(TinyNet) for a few steps, changes the model, trains again and reports
what compare_replicas says. None of them raises an error: that is the point.

python -m ddpcourse run notebooks/demos/03_change_model.py --nproc 2
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
SEED = 0
LEARNING_RATE = 0.05
STEPS = 5  # training steps before and after each change
# -----------------------------------------------------------------------------

rank, world_size, device = init_distributed()
x, y = make_dataset().tensors
x_local, y_local = x[rank::world_size].to(device), y[rank::world_size].to(device)


def train(model, optimizer, steps=STEPS):
    for _ in range(steps):
        optimizer.zero_grad()
        F.mse_loss(model(x_local), y_local).backward()
        optimizer.step()


def sgd(params):
    return torch.optim.SGD(params, lr=LEARNING_RATE)


def insert_hidden_layer(net, seed):
    """TinyNet's output layer fc2 becomes fc2.new (a new Linear + ReLU) followed by fc2.out (the old fc2)."""
    torch.manual_seed(seed)
    hidden = net.fc2.in_features
    net.fc2 = nn.Sequential(OrderedDict(new=nn.Linear(hidden, hidden), relu=nn.ReLU(), out=net.fc2)).to(device)


def differing(model):
    """Names of the parameters that differ between ranks, and the report's text."""
    found = compare_replicas(model)
    return {"names": [d.name for d in found.differences], "identical": found.identical, "text": str(found)}


def flat(module):
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def grow_without_rewrap():
    """A layer added on every rank (same initial values), a new optimizer, but the OLD DDP wrapper."""
    model = DDP(build_model(SEED).to(device))
    train(model, sgd(model.parameters()))
    insert_hidden_layer(model.module, seed=1)  # same seed on every rank: identical new layer
    at_growth = differing(model)
    optimizer = sgd(model.parameters())  # model.parameters() now includes the new layer
    train(model, optimizer)
    return {"at_growth": at_growth, "after_training": differing(model)}


def grow_and_rewrap():
    """The fix: change the module on every rank, wrap it in a NEW DDP, build a new optimizer."""
    model = DDP(build_model(SEED).to(device))
    old_optimizer = sgd(model.parameters())
    train(model, old_optimizer)
    insert_hidden_layer(model.module, seed=10 + rank)  # deliberately different on every rank
    before_rewrap = differing(model)
    model = DDP(model.module)  # the new wrapper broadcasts rank 0's parameters and buffers again
    after_rewrap = differing(model)
    new_layer = model.module.fc2.new
    in_old_optimizer = any(p is q for p in new_layer.parameters()
                           for group in old_optimizer.param_groups for q in group["params"])
    start = flat(new_layer)
    optimizer = sgd(model.parameters())
    history = []
    for _ in range(STEPS):
        train(model, optimizer, steps=1)
        history.append(differing(model)["identical"])
    return {"before_rewrap": before_rewrap, "after_rewrap": after_rewrap, "in_sync_each_step": history,
            "new_layer_moved": round((flat(new_layer) - start).abs().max().item(), 4),
            "new_layer_in_old_optimizer": in_old_optimizer}


def unfreeze_after_wrapping():
    """fc1 frozen when DDP was built, unfrozen later: DDP never registered it, so its gradients stay local."""
    net = build_model(SEED).to(device)
    net.fc1.requires_grad_(False)
    model = DDP(net)
    optimizer = sgd(net.parameters())  # holds fc1 too: SGD skips it while its .grad is None
    train(model, optimizer)
    net.fc1.requires_grad_(True)
    train(model, optimizer)
    return differing(model)


def freeze_the_right_way():
    """Change requires_grad, then wrap in a new DDP and build a new optimizer over the trainable parameters."""
    model = DDP(build_model(SEED).to(device))
    train(model, sgd(model.parameters()))
    net = model.module
    net.fc1.requires_grad_(False)
    frozen = flat(net.fc1)
    model = DDP(net)  # built now, it registers only the parameters that require gradients
    optimizer = sgd([p for p in model.parameters() if p.requires_grad])
    train(model, optimizer)
    after_freeze = differing(model)
    fc1_unchanged = torch.equal(flat(net.fc1), frozen)
    net.fc1.requires_grad_(True)  # unfreezing: the same procedure
    model = DDP(net)
    train(model, sgd(model.parameters()))
    return {"after_freeze": after_freeze, "frozen_layer_unchanged": fc1_unchanged,
            "after_unfreeze": differing(model), "fc1_trained_again": not torch.equal(flat(net.fc1), frozen)}


def freeze_with_find_unused():
    """The other fix: find_unused_parameters=True marks parameters without a gradient as ready every step."""
    net = build_model(SEED).to(device)
    model = DDP(net, find_unused_parameters=True)
    optimizer = sgd(model.parameters())
    net.fc1.requires_grad_(False)  # after wrapping (before the first step: with nothing unused, DDP warns)
    train(model, optimizer)
    return differing(model)


def static_graph_with_unused_layer():
    """A layer that is never used (an auxiliary head for a later phase): static_graph=True handles it."""
    net = build_model(SEED).to(device)
    net.aux_head = nn.Linear(net.fc2.in_features, 1).to(device)  # not used in forward
    model = DDP(net, static_graph=True)
    train(model, sgd(model.parameters()))
    return differing(model)


def documented(option):
    """The first sentence of DDP's own documentation of `option` (the docstring of this torch version)."""
    text = " ".join(DDP.__doc__.split(f"{option} (bool):", 1)[1].split())
    return text.split(". ")[0] + "."


report(grow_without_rewrap=grow_without_rewrap(), grow_and_rewrap=grow_and_rewrap(),
       unfreeze_after_wrapping=unfreeze_after_wrapping(), freeze_the_right_way=freeze_the_right_way(),
       freeze_with_find_unused=freeze_with_find_unused(),
       static_graph_with_unused_layer=static_graph_with_unused_layer(),
       documented={option: documented(option) for option in ("find_unused_parameters", "static_graph")})
dist.destroy_process_group()
