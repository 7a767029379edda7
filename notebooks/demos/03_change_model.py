"""Demo for notebook 03, sections 2 and 3 and Appendices B-D: adding a layer, freezing and unfreezing, after
DDP wrapped the model.

Every scenario trains a fresh DDP(TinyNet) for a few steps, changes the model, trains again and reports
what compare_replicas says. Most of them raise no error: that is the point. Where one does (a layer
missing on one rank, a static graph that changed, two forwards under find_unused_parameters=True), the demo
catches it and reports it. Also: a re-wrap with init_sync=False, what find_unused_parameters=True
costs, two forwards before one backward, and one backward per forward.

python -m ddpcourse run notebooks/demos/03_change_model.py --nproc 2
"""
import contextlib
import inspect
import sys
from collections import OrderedDict

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile

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


def counting_allreduce(calls):
    """A communication hook: torch's default all-reduce of a bucket (DDP's own averaging), each call counted."""
    def hook(state, bucket):
        calls.append(bucket.index())
        return allreduce_hook(state, bucket)
    return hook


def grow_on_rank0_only():
    """Example 2 of the article that section 5 tests: rank 0 alone adds and initialises a layer, the ranks
    then send it.

    Each rank first looks the new layer up, and the ranks agree (one all_reduce) before broadcasting."""
    model = DDP(build_model(SEED).to(device))
    if rank == 0:
        insert_hidden_layer(model.module, seed=1)
    try:
        to_send, lookup = list(model.module.fc2.new.parameters()), "ok"
    except AttributeError as error:
        to_send, lookup = [], f"{type(error).__name__}: {error}"
    everyone_has_it = torch.tensor([float(lookup == "ok")], device=device)
    dist.all_reduce(everyone_has_it, op=dist.ReduceOp.MIN)  # 0 if any rank lacks the layer
    if everyone_has_it.item() == 1.0:
        for tensor in to_send:
            dist.broadcast(tensor.detach(), src=0)
    return {"lookup": lookup, "broadcast": everyone_has_it.item() == 1.0}


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


def rewrap_without_init_sync():
    """The same growth, re-wrapped with init_sync=False: the constructor neither checks nor broadcasts."""
    model = DDP(build_model(SEED).to(device))
    train(model, sgd(model.parameters()))
    insert_hidden_layer(model.module, seed=10 + rank)  # different on every rank, as in grow_and_rewrap
    model = DDP(model.module, init_sync=False)
    after_rewrap = differing(model)
    train(model, sgd(model.parameters()))
    init_source = inspect.getsource(DDP.__init__)
    gated = init_source.split("if init_sync:", 1)[1].split("\n\n", 1)[0]  # the block the flag guards
    return {"after_rewrap": after_rewrap, "after_training": differing(model),
            "init_sync_guards": [name for name in ("_verify_param_shape_across_processes", "_sync_module_states")
                                 if name in gated]}


def grow_keep_optimizer_state():
    """After growing and re-wrapping: add_param_group keeps the old parameters' state, a new optimizer drops it."""
    kinds = {"SGD momentum 0.9": lambda params: torch.optim.SGD(params, lr=LEARNING_RATE, momentum=0.9),
             "Adam": lambda params: torch.optim.Adam(params, lr=0.01)}
    results = {}
    for kind, make in kinds.items():
        for how in ("add_param_group", "new optimizer"):
            model = DDP(build_model(SEED).to(device))
            optimizer = make(model.parameters())
            train(model, optimizer)
            old_parameters = list(model.module.parameters())
            insert_hidden_layer(model.module, seed=1)
            model = DDP(model.module)  # wraps the same module: the same Parameter objects, no copies
            same_objects = all(any(p is q for q in model.parameters()) for p in old_parameters)
            if how == "add_param_group":
                optimizer.add_param_group({"params": list(model.module.fc2.new.parameters())})
            else:
                optimizer = make(model.parameters())
            fc1_state = optimizer.state[model.module.fc1.weight]  # state is keyed by the Parameter object
            state_at_rewrap = sorted(fc1_state)
            train(model, optimizer, steps=1)
            results[f"{kind}, {how}"] = {
                "same_objects": same_objects, "state_at_rewrap": state_at_rewrap,
                "adam_step_after": int(fc1_state["step"]) if "step" in fc1_state else None,
                "identical": differing(model)["identical"]}
    return results


def static_graph_then_freeze():
    """static_graph=True promises that the set of used parameters never changes: freeze fc1 at step 3 and see."""
    net = build_model(SEED).to(device)
    model = DDP(net, static_graph=True)
    optimizer = sgd(model.parameters())
    steps, message = [], ""
    for number in range(1, 5):
        if number == 3:
            net.fc1.requires_grad_(False)
        try:
            train(model, optimizer, steps=1)
            steps.append("ok")
        except RuntimeError as error:
            message = str(error)
            steps.append(message.split(". ")[0] + ".")
    return {"steps": steps, "differing": differing(model)["names"],
            "blames_static_graph": "not compatible with static_graph set to True" in message,
            "names_find_unused_parameters": "find_unused_parameters" in message}


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


def find_unused_costs():
    """What find_unused_parameters=True costs, on TinyNet with nothing frozen (DDP warns it found nothing unused).
    In the third step: all-reduces (every one, counted by the profiler) and buckets reduced (counted by a comm
    hook); whether DDP rebuilt its buckets (the default does so in the second step's forward); and the size
    limits torch 2.13's constructor gave its first buckets."""
    results = {}
    for name, options in (("default settings", {}), ("find_unused_parameters=True", {"find_unused_parameters": True})):
        model = DDP(build_model(SEED).to(device), **options)
        limits, _ = model._bucket_config.compute_bucket_size_limits(model.static_graph, model.find_unused_parameters)
        buckets_reduced = []
        model.register_comm_hook(None, counting_allreduce(buckets_reduced))
        optimizer = sgd(model.parameters())
        train(model, optimizer, steps=2)
        buckets_reduced.clear()
        with profile(activities=[ProfilerActivity.CPU]) as third_step:
            train(model, optimizer, steps=1)
        results[name] = {"all_reduces": sum(event.name == "c10d::allreduce_" for event in third_step.events()),
                         "buckets_reduced": len(buckets_reduced),
                         "buckets_rebuilt": bool(model._get_ddp_logging_data()["has_rebuilt_buckets"]),
                         "constructor_limits": ["sys.maxsize" if limit == sys.maxsize else limit for limit in limits]}
    return results


def static_graph_with_unused_layer():
    """A layer that is never used (an auxiliary head for a later phase): static_graph=True handles it."""
    net = build_model(SEED).to(device)
    net.aux_head = nn.Linear(net.fc2.in_features, 1).to(device)  # not used in forward
    model = DDP(net, static_graph=True)
    train(model, sgd(model.parameters()))
    return differing(model)


class TwoTasks(nn.Module):
    """A shared layer and one head per task: a batch of task "a" uses head_a only, of task "b" head_b only.
    forward(x_a, x_b) runs both batches in one forward (the shared layer on the two batches at once)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(SEED)
        self.shared = nn.Linear(x.shape[1], 16)
        self.head_a, self.head_b = nn.Linear(16, 1), nn.Linear(16, 1)

    def forward(self, x_a, x_b=None, task="a"):
        if x_b is None:
            return (self.head_a if task == "a" else self.head_b)(torch.relu(self.shared(x_a)))
        hidden = torch.relu(self.shared(torch.cat([x_a, x_b])))
        return self.head_a(hidden[:len(x_a)]), self.head_b(hidden[len(x_a):])


def two_forwards_one_backward():
    """Two forwards (task a, then task b) before one backward of the summed loss, with several settings, and
    the fixes. Each variant trains 3 steps from the same start."""
    half = len(x_local) // 2
    (x_a, y_a), (x_b, y_b) = (x_local[:half], y_local[:half]), (x_local[half:], y_local[half:])

    def two_forwards(model):
        return F.mse_loss(model(x_a, task="a"), y_a) + F.mse_loss(model(x_b, task="b"), y_b)

    def one_forward(model):
        out_a, out_b = model(x_a, x_b)
        return F.mse_loss(out_a, y_a) + F.mse_loss(out_b, y_b)

    def no_sync_first(model):
        with model.no_sync():
            loss_a = F.mse_loss(model(x_a, task="a"), y_a)
        return loss_a + F.mse_loss(model(x_b, task="b"), y_b)

    variants = {"two forwards, find_unused_parameters=True": (two_forwards, {"find_unused_parameters": True}),
                "no_sync() around the first forward, find_unused_parameters=True":
                    (no_sync_first, {"find_unused_parameters": True}),
                "one forward for both batches, find_unused_parameters=True":
                    (one_forward, {"find_unused_parameters": True}),
                "two forwards, static_graph=True": (two_forwards, {"static_graph": True}),
                "two forwards, default settings": (two_forwards, {})}
    results, weights = {}, {}
    for name, (loss_of, options) in variants.items():
        model = DDP(TwoTasks().to(device), **options)
        optimizer = sgd(model.parameters())
        try:
            for _ in range(3):
                optimizer.zero_grad()
                loss_of(model).backward()
                optimizer.step()
            weights[name] = flat(model.module)
            results[name] = {"error": None, "identical": differing(model)["identical"]}
        except RuntimeError as error:
            results[name] = {"error": str(error).split(". ")[0] + ".",
                             "suggests_static_graph": "_set_static_graph()" in str(error)}
    reference = weights["one forward for both batches, find_unused_parameters=True"]
    for name in weights:
        results[name]["max_diff_to_one_forward"] = (weights[name] - reference).abs().max().item()
    # where the search for unused parameters happens: after each forward, from that forward's outputs
    results["post_forward_searches_its_outputs"] = (
        "self.reducer.prepare_for_backward(list(_find_tensors(output)))" in inspect.getsource(DDP._post_forward))
    return results


def one_backward_per_forward():
    """TinyNet, default settings, two half-batches a and b, one backward per loss. Varied one at a time: the
    order (each forward followed by its backward, or both forwards first) and no_sync() around the first pass.
    Each way's gradients are compared with a and b both averaged, and with a averaged plus this rank's own b;
    its all-reduces are counted with a comm hook."""
    half = len(x_local) // 2
    (x_a, y_a), (x_b, y_b) = (x_local[:half], y_local[:half]), (x_local[half:], y_local[half:])

    def own_gradients(x_part, y_part):  # this rank's gradients of one half-batch, without DDP
        net = build_model(SEED).to(device)
        return torch.autograd.grad(F.mse_loss(net(x_part), y_part), list(net.parameters()))

    def averaged(gradients):
        gradients = [g.clone() for g in gradients]
        for g in gradients:
            dist.all_reduce(g)
            g /= world_size
        return gradients

    own_a, own_b = own_gradients(x_a, y_a), own_gradients(x_b, y_b)
    expected = {"a and b averaged": [a + b for a, b in zip(averaged(own_a), averaged(own_b))],
                "a averaged, b this rank's own": [a + b for a, b in zip(averaged(own_a), own_b)]}
    results = {}
    for order in ("forward a, backward a, forward b, backward b", "forward a, forward b, backward a, backward b"):
        for first_in_no_sync in (False, True):
            net = build_model(SEED).to(device)
            model = DDP(net)
            all_reduces = []
            model.register_comm_hook(None, counting_allreduce(all_reduces))
            first = model.no_sync() if first_in_no_sync else contextlib.nullcontext()
            if order.startswith("forward a, backward a"):  # interleaved; no_sync() around forward a and backward a
                with first:
                    F.mse_loss(model(x_a), y_a).backward()
                F.mse_loss(model(x_b), y_b).backward()
            else:                                          # both forwards first; no_sync() around forward a
                with first:
                    loss_a = F.mse_loss(model(x_a), y_a)
                loss_b = F.mse_loss(model(x_b), y_b)
                loss_a.backward()
                loss_b.backward()
            gradients = [p.grad for p in net.parameters()]
            gaps = {name: max((g - e).abs().max().item() for g, e in zip(gradients, wanted))
                    for name, wanted in expected.items()}
            differ = []
            for name, p in net.named_parameters():
                gathered = [torch.zeros_like(p.grad) for _ in range(world_size)]
                dist.all_gather(gathered, p.grad)
                if not all(torch.equal(g, gathered[0]) for g in gathered):
                    differ.append(name)
            results[order + (", the first inside no_sync()" if first_in_no_sync else "")] = {
                "all_reduces": len(all_reduces), "gradients_differ_between_ranks": differ,
                "matches": [name for name, gap in gaps.items() if gap < 1e-6]}
    return results


def documented(option):
    """The first sentence of DDP's own documentation of `option` (the docstring of this torch version)."""
    return documentation(option).split(". ")[0] + "."


def documentation(option):
    return " ".join(DDP.__doc__.split(f"{option} (bool):", 1)[1].split())


report(grow_on_rank0_only=grow_on_rank0_only(),
       grow_without_rewrap=grow_without_rewrap(), grow_and_rewrap=grow_and_rewrap(),
       rewrap_without_init_sync=rewrap_without_init_sync(),
       grow_keep_optimizer_state=grow_keep_optimizer_state(),
       unfreeze_after_wrapping=unfreeze_after_wrapping(), freeze_the_right_way=freeze_the_right_way(),
       freeze_with_find_unused=freeze_with_find_unused(),
       static_graph_with_unused_layer=static_graph_with_unused_layer(),
       static_graph_then_freeze=static_graph_then_freeze(),
       find_unused_costs=find_unused_costs(),
       two_forwards_one_backward=two_forwards_one_backward(), one_backward_per_forward=one_backward_per_forward(),
       documented={option: documented(option) for option in ("find_unused_parameters", "static_graph")},
       static_graph_skips_search="will not search graph in each iteration" in documentation("static_graph"),
       init_sync_warns="the user is required to ensure themselves that the weights are the same on all ranks"
                       in documentation("init_sync"))
if __name__ == "__main__":  # run alone; 03_all_demos.py runs it among other demos and ends the group itself
    dist.destroy_process_group()
