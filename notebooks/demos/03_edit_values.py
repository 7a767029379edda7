"""Demo for notebook 03, section 1: editing parameter values of a model already wrapped in DDP.

Each scenario starts from a fresh DDP(TinyNet), edits the output bias after wrapping, trains a few steps
and reports what compare_replicas says. The source's examples 1 and 3 run here as a learner copies them.

python -m ddpcourse run notebooks/demos/03_edit_values.py --nproc 2
"""
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
    """Fix 2: rank 0 decides (here: a random value only rank 0 draws), then broadcasts to every rank."""
    model, optimizer = fresh()
    bias = model.module.fc2.bias
    with torch.no_grad():
        if rank == 0:
            bias += torch.rand(bias.shape, generator=torch.Generator().manual_seed(1)).to(device)
        dist.broadcast(bias, src=0)  # every rank calls it; rank 0's values land in place
    train(model, optimizer)
    return summary(model)


def scenario_average_local_edits():
    """Fix 3: each rank edits by its own amount, then all ranks average: by hand, and with torch's helper."""
    results = {}
    for how in ("by hand", "average_parameters"):
        model, optimizer = fresh()
        bias = model.module.fc2.bias
        start = bias.detach().clone()
        local_edit = torch.full_like(bias, 0.1 * (rank + 1))  # rank r adds 0.1 * (r + 1)
        with torch.no_grad():
            bias += local_edit
            if how == "by hand":
                dist.all_reduce(bias, op=dist.ReduceOp.SUM)
                bias /= world_size
            else:
                average_parameters(iter([bias]), None)  # torch's version: one flat all_reduce, then divide
        moved = (model.module.fc2.bias - start).item()  # the mean of the ranks' edits
        train(model, optimizer)
        results[how] = {**summary(model), "moved": round(moved, 6)}
    return results


def source_example_1():
    """The source's example 1, as a learner copies it (its linear1 is our fc1)."""
    model = DDP(build_model(SEED).to(device))
    ddp_model = model
    start = ddp_model.module.fc1.bias.detach().clone()
    if dist.get_rank() == 0:
        for param in ddp_model.module.fc1.bias:  # loops over the bias' 16 numbers, not over parameters
            param.data += 0.1
    dist.broadcast(ddp_model.module.fc1.bias.data, src=0)
    moved = (ddp_model.module.fc1.bias - start).abs().max().item()
    as_copied = summary(ddp_model)

    # Its claim "broadcast .data, not the parameter": broadcast the parameter itself and see.
    model = DDP(build_model(SEED).to(device))
    if rank == 0:
        with torch.no_grad():
            model.module.fc1.bias += 0.1
    dist.broadcast(model.module.fc1.bias, src=0)  # no .data
    return {"as_copied": as_copied, "moved": round(moved, 6), "parameter_itself": summary(model)}


def source_example_3():
    """The source's example 3, as a learner copies it: a random local adjustment, then SUM / world size."""
    ddp_model = DDP(build_model(SEED).to(device))
    torch.manual_seed(100 + rank)  # each rank draws its own adjustment, as on a real job
    local_adjustment = torch.randn_like(ddp_model.module.fc1.bias)
    ddp_model.module.fc1.bias.data += local_adjustment
    dist.all_reduce(ddp_model.module.fc1.bias.data, op=dist.ReduceOp.SUM)
    ddp_model.module.fc1.bias.data /= dist.get_world_size()
    return summary(ddp_model)


def buffers_follow_rank0():
    """Buffers are different: DDP broadcasts rank 0's buffers at every forward (broadcast_buffers=True)."""
    model, _ = fresh(batchnorm=True)
    if rank == 1:
        with torch.no_grad():
            model.module.norm.running_mean += EDIT  # an edit on rank 1 only
    before = summary(model)
    model.eval()  # eval: the forward uses running stats and does not update them
    model(x_local)
    after = summary(model)
    running_mean = model.module.norm.running_mean.abs().max().item()
    return {"before_forward": before, "after_forward": after, "running_mean_max": running_mean}


results = {
    "rank0_only": scenario_rank0_only(),
    "same_edit_everywhere": scenario_same_edit_everywhere(),
    "broadcast_from_rank0": scenario_broadcast_from_rank0(),
    "average_local_edits": scenario_average_local_edits(),
    "source_example_1": source_example_1(),
    "source_example_3": source_example_3(),
    "buffers": buffers_follow_rank0() if world_size > 1 else None,
}
report(**results)
dist.destroy_process_group()
