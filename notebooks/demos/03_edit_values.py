"""Demo for notebook 03, section 1 and Appendix A: editing parameter values of a model already wrapped in DDP.

Each scenario starts from a fresh DDP(TinyNet), edits the output bias after wrapping, trains a few steps
and reports what compare_replicas says. Then BatchNorm buffers: an edit in eval mode (section 1); which
forwards copy them, and train mode (Appendix A).

python -m ddpcourse run notebooks/demos/03_edit_values.py --nproc 2
"""
import contextlib
import inspect
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.model_averaging.utils import average_parameters
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse import init_distributed, report
from ddpcourse.lab import compare_replicas
from ddpcourse.toy import build_model, make_dataset

# -----------------------------------------------------------------------------
SEED = 0            # every rank builds the same starting model
LEARNING_RATE = 0.05
STEPS = 5           # training steps after each edit
EDIT = 0.5          # what "the edit" adds to the output bias
# -----------------------------------------------------------------------------

rank, world_size, device = init_distributed()
x, y = make_dataset().tensors
x_local, y_local = x[rank::world_size].to(device), y[rank::world_size].to(device)  # this rank's shard


def fresh(**model_options):
    model = DDP(build_model(SEED, **model_options).to(device))  # DDP broadcasts rank 0's weights here
    return model, torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)


def train(model, optimizer, steps=STEPS):
    for _ in range(steps):
        optimizer.zero_grad()
        F.mse_loss(model(x_local), y_local).backward()  # DDP averages the gradients here
        optimizer.step()


def summary(model):
    """compare_replicas as plain data, plus the largest difference, for the notebook to assert on."""
    found = compare_replicas(model)
    return {**found.as_dict(), "max_diff": max([d.max_abs_diff for d in found.differences], default=0.0),
            "text": str(found)}


def scenario_rank0_only():
    """The mistake: only rank 0 edits. Nothing complains; the replicas stay different while training."""
    model, optimizer = fresh()
    if rank == 0:
        with torch.no_grad():
            model.module.fc2.bias += EDIT
    after_edit = summary(model)
    train(model, optimizer)
    after_training = summary(model)
    with torch.no_grad():  # the same input, a different prediction on each rank
        prediction = model.module(x[:1].to(device)).item()
    print(f"edit on rank 0 only -> after {STEPS} steps: {after_training['text']}")
    return {"after_edit": after_edit, "after_training": after_training, "prediction": round(prediction, 4)}


def scenario_same_edit_everywhere():
    """Fix 1: every rank makes the same deterministic edit."""
    model, optimizer = fresh()
    with torch.no_grad():
        model.module.fc2.bias += EDIT
    train(model, optimizer)
    return summary(model)


def scenario_broadcast_from_rank0():
    """Fix 2: rank 0 decides (here: a random value only rank 0 draws), then broadcasts to every rank.

    Sent three ways: the Parameter with gradients enabled, the Parameter under no_grad, and its .data."""
    results = {}
    for sent in ("the parameter", "the parameter under no_grad", "its .data"):
        model, optimizer = fresh()
        bias = model.module.fc2.bias
        memory = bias.data_ptr()
        if rank == 0:
            with torch.no_grad():
                bias += torch.rand(bias.shape, generator=torch.Generator().manual_seed(1)).to(device)
        with torch.set_grad_enabled(sent == "the parameter"):
            dist.broadcast(bias.data if sent == "its .data" else bias, src=0)  # every rank calls it
        same_object = model.module.fc2.bias is bias  # the model still holds this Parameter
        same_memory = bias.data_ptr() == memory       # and its values are where they were
        with warnings.catch_warnings(record=True) as caught:  # what the next backward passes say
            warnings.simplefilter("always")
            train(model, optimizer)
        autograd_warnings = sorted({str(w.message).split(": ")[0] for w in caught
                                    if "autograd kernel was not registered" in str(w.message)})
        results[sent] = {**summary(model), "same_object": same_object, "same_memory": same_memory,
                         "autograd_warnings": autograd_warnings}
    return results


def scenario_average_local_edits():
    """Fix 3: each rank edits by its own amount, then all ranks average: by hand, and with torch's helper."""
    results = {}
    for how in ("by hand", "average_parameters"):
        model, optimizer = fresh()
        bias = model.module.fc2.bias
        start = bias.detach().clone()
        memory = bias.data_ptr()
        local_edit = torch.full_like(bias, 0.1 * (rank + 1))  # rank r adds 0.1 * (r + 1)
        with torch.no_grad():
            bias += local_edit
            if how == "by hand":
                dist.all_reduce(bias, op=dist.ReduceOp.SUM)
                bias /= world_size
            else:
                # torch's version: divide by the world size first, one flat all_reduce, then p.data is
                # rebound to a slice of that flat buffer (new memory, the same Parameter object)
                average_parameters(iter([bias]), None)
        moved = (model.module.fc2.bias - start).item()  # the mean of the ranks' edits
        same_object = model.module.fc2.bias is bias
        same_memory = bias.data_ptr() == memory
        train(model, optimizer)
        results[how] = {**summary(model), "moved": round(moved, 6), "same_object": same_object,
                        "same_memory": same_memory}
    return results


def buffers_follow_rank0():
    """Eval mode: DDP broadcasts rank 0's buffers before a forward, so an edit on rank 1 is overwritten.

    Whether a forward broadcasts is decided by model.require_forward_param_sync, read before each forward:
    the constructor sets it True; each forward sets it True with gradients enabled outside no_sync(),
    False otherwise."""
    model, _ = fresh(batchnorm=True)
    armed_by_constructor = model.require_forward_param_sync
    running_mean = model.module.norm.running_mean
    if rank == 1:
        with torch.no_grad():
            running_mean += EDIT  # an edit on rank 1 only
    before = summary(model)
    edited = running_mean.abs().max().item()  # this rank's own value: 0.5 on rank 1, 0 on rank 0
    model.eval()  # eval: the forward uses running stats and does not update them
    model(x_local)
    after = summary(model)
    cleared = running_mean.abs().max().item()
    # A forward under no_grad switches the sync off for the NEXT forward (torch's will_sync_module_buffers).
    synced, flags = [], []
    for _ in range(2):
        if rank == 1:
            with torch.no_grad():
                running_mean += EDIT
        flags.append(model.require_forward_param_sync)
        with torch.no_grad():
            model(x_local)
        synced.append(compare_replicas(model).identical)
    # Its twin: a forward inside no_sync() (gradient accumulation) does the same, because DDP's _post_forward
    # re-arms the sync only when gradients are enabled AND gradients will be synchronized.
    model, _ = fresh(batchnorm=True)
    model.eval()
    running_mean = model.module.norm.running_mean
    synced_no_sync, flags_no_sync = [], []
    for inside_no_sync in (True, True, False, False):
        if rank == 1:
            with torch.no_grad():
                running_mean += EDIT
        flags_no_sync.append(model.require_forward_param_sync)
        with model.no_sync() if inside_no_sync else contextlib.nullcontext():
            F.mse_loss(model(x_local), y_local).backward()
        synced_no_sync.append(compare_replicas(model).identical)
    return {"before_forward": before, "after_forward": after,
            "running_mean_max_before": edited, "running_mean_max": cleared,
            "armed_by_constructor": armed_by_constructor,
            "no_grad_forwards_synced": synced, "no_grad_flags_before": flags,
            "no_sync_forwards_synced": synced_no_sync, "no_sync_flags_before": flags_no_sync}


def buffer_sync_condition():
    """Where this torch's DDP sets and reads require_forward_param_sync: the line of _post_forward that sets it
    True (else False), whether the constructor sets it True, and whether will_sync_module_buffers reads it."""
    return {"post_forward": next(line.strip() for line in inspect.getsource(DDP._post_forward).splitlines()
                                 if line.strip().startswith("if ") and "require_backward_grad_sync" in line),
            "constructor_sets_true": "self.require_forward_param_sync = True" in inspect.getsource(DDP.__init__),
            "will_sync_reads_it": "self.require_forward_param_sync" in inspect.getsource(DDP.will_sync_module_buffers)}


def buffers_in_training():
    """Train mode: rank 0's buffers are broadcast BEFORE each forward, then BatchNorm updates them from
    this rank's own batch. They differ after every training forward and are reset before the next one."""
    model, optimizer = fresh(batchnorm=True)  # modules are in train mode
    norm = model.module.norm
    received = []  # running_mean as BatchNorm receives it, i.e. after DDP's broadcast
    hook = norm.register_forward_pre_hook(lambda module, inputs: received.append(module.running_mean.clone()))
    after_forward, differing_after_forward = [], []
    for _ in range(STEPS):
        optimizer.zero_grad()
        F.mse_loss(model(x_local), y_local).backward()
        optimizer.step()
        after_forward.append(norm.running_mean.clone())
        differing_after_forward.append([d.name for d in compare_replicas(model).differences])
    hook.remove()
    return {"received_in_second": received[1].tolist(), "after_first": after_forward[0].tolist(),
            "differing_after_forward": differing_after_forward, "at_the_end": summary(model)}


def buffer_option_names():
    """torch 2.13 renamed broadcast_buffers to forward_sync_buffers; the old name still works, with a warning.

    Each name set to False, on a model whose running_mean rank 1 edited BEFORE wrapping: is the forward's
    broadcast off, and did the constructor send rank 0's buffers?"""
    default = DDP(build_model(SEED, batchnorm=True).to(device))
    results = {"default_forward_sync_buffers": default.forward_sync_buffers}
    for option in ("broadcast_buffers", "forward_sync_buffers"):
        net = build_model(SEED, batchnorm=True).to(device)
        if rank == 1:
            with torch.no_grad():
                net.norm.running_mean += EDIT
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = DDP(net, **{option: False})
        results[f"{option}=False"] = {
            "warns": [w.category.__name__ for w in caught if "is deprecated" in str(w.message)],
            "forward_sync_buffers": model.forward_sync_buffers,
            "constructor_synced_buffers": compare_replicas(model).identical}
    return results


results = {
    "rank0_only": scenario_rank0_only(),
    "same_edit_everywhere": scenario_same_edit_everywhere(),
    "broadcast_from_rank0": scenario_broadcast_from_rank0(),
    "average_local_edits": scenario_average_local_edits(),
    "buffers": buffers_follow_rank0() if world_size > 1 else None,
    "buffer_sync_condition": buffer_sync_condition(),
    "buffers_training": buffers_in_training(),
    "buffer_option_names": buffer_option_names(),
}
report(**results)
if __name__ == "__main__":  # run alone; 03_all_demos.py runs it among other demos and ends the group itself
    dist.destroy_process_group()
