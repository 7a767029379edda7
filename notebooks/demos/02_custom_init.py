"""Demo for notebook 02, section 5: broadcasting a custom initialization, right and wrong, one tensor at a
time or coalesced; and Appendix B: the cost of starting from a pretrained checkpoint.

python -m ddpcourse run notebooks/demos/02_custom_init.py --nproc 2
No DDP here: these are the collectives DDP's constructor would otherwise do for you.
"""
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ddpcourse import init_distributed, report
from ddpcourse.lab import compare_replicas
from ddpcourse.toy import build_model

# -----------------------------------------------------------------------------
SEED = 0
PRETRAINED_WIDTH = 512    # the "pretrained" model: 4 Linear(512, 512) layers, about 1.05 M parameters
PRETRAINED_LAYERS = 4
REPEATS = 3               # each way of loading (or broadcasting) is timed REPEATS times; the fastest run counts
SMALL_LAYERS = 50         # the model broadcast one tensor at a time or coalesced: 50 Linear(8, 8), 100 tensors
BUCKET_BYTES = 250 * 1024 * 1024  # what DDP's constructor passes to dist._broadcast_coalesced
# -----------------------------------------------------------------------------

rank, world_size, device = init_distributed()


def custom_init_on_rank0(model):
    """A rank-0-only initialization (as in the source's Example 3): rank 0 writes 0, 1, 2, ... into a row."""
    if rank == 0:
        with torch.no_grad():
            model.fc1.weight[0, :] = torch.arange(8.0)
            model.norm.running_mean.fill_(0.5)  # and a buffer, say restored from a checkpoint


def broadcast_parameters_and_buffers_(module, src):
    """Write rank `src`'s values into every rank's tensors, one dist.broadcast per tensor, in place."""
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor, src=src)


# Wrong: broadcast_object_list on a list of the model's tensors.
model = build_model(seed=SEED + rank, batchnorm=True)  # seeded by rank on purpose: the broadcast must fix it
custom_init_on_rank0(model)
sent = [p.data for p in model.parameters()]
dist.broadcast_object_list(sent, src=0)  # pickles rank 0's tensors; the others get NEW tensors in the list
object_list = compare_replicas(model)
list_holds_model_tensors = all(a.data_ptr() == b.data_ptr() for a, b in zip(sent, model.parameters()))
list_holds_rank0_row = sent[0][0].tolist() == list(range(8))
print(f"broadcast_object_list: {object_list}")
print(f"  the list now holds the model's own tensors: {list_holds_model_tensors}; "
      f"it holds rank 0's values: {list_holds_rank0_row}")

# Half right: parameters only (the BatchNorm buffers keep each rank's values).
model = build_model(seed=SEED + rank, batchnorm=True)
custom_init_on_rank0(model)
with torch.no_grad():
    for parameter in model.parameters():
        dist.broadcast(parameter, src=0)
parameters_only = compare_replicas(model)
print(f"parameters only:       {parameters_only}")

# Right: every parameter and buffer, in place.
model = build_model(seed=SEED + rank, batchnorm=True)
custom_init_on_rank0(model)
before = [id(t) for t in list(model.parameters()) + list(model.buffers())]
broadcast_parameters_and_buffers_(model, src=0)
in_place = compare_replicas(model)
same_objects = before == [id(t) for t in list(model.parameters()) + list(model.buffers())]
row0 = model.fc1.weight[0].tolist()
print(f"parameters and buffers: {in_place}; same tensor objects: {same_objects}; fc1.weight[0] = {row0}")
report(broadcast_object_list=object_list.as_dict(), list_holds_model_tensors=list_holds_model_tensors,
       list_holds_rank0_row=list_holds_rank0_row, parameters_only=parameters_only.as_dict(),
       in_place=in_place.as_dict(), same_objects=same_objects, row0=row0)


# One collective per tensor, or one for many? The group counts every collective launched on it.
group = dist.group.WORLD


def collectives_launched(way, module):
    before = group._get_sequence_number_for_group()
    way(module, src=0)
    return group._get_sequence_number_for_group() - before


def module_tensors(module):
    return [t.detach() for t in list(module.parameters()) + list(module.buffers())]


def broadcast_coalesced_(module, src):
    """DDP's way: torch packs the tensors into buckets (of one dtype each) and broadcasts each bucket once."""
    dist._broadcast_coalesced(group, module_tensors(module), BUCKET_BYTES, src)


def broadcast_flattened_(module, src):
    """By hand: one flat tensor (all of one dtype), one broadcast, then each slice copied back into place."""
    tensors = module_tensors(module)
    flat = _flatten_dense_tensors(tensors)
    dist.broadcast(flat, src=src)
    for tensor, received in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
        tensor.copy_(received)


small = nn.Sequential(*[nn.Linear(8, 8) for _ in range(SMALL_LAYERS)])
ways = {"one broadcast per tensor": broadcast_parameters_and_buffers_,
        "dist._broadcast_coalesced": broadcast_coalesced_,
        "flatten, broadcast once": broadcast_flattened_}
coalescing = {"tensors": len(module_tensors(small)), "collectives": {}, "identical": {}}
coalescing_seconds = {}
for name, way in ways.items():
    best = float("inf")
    for _ in range(REPEATS):
        torch.manual_seed(SEED + rank)
        with torch.no_grad():
            for p in small.parameters():
                p.normal_()  # different values on every rank again
        dist.barrier()
        start = time.perf_counter()
        coalescing["collectives"][name] = collectives_launched(way, small)
        best = min(best, time.perf_counter() - start)
    slowest = torch.tensor(best)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    coalescing_seconds[name] = slowest.item()
    coalescing["identical"][name] = compare_replicas(small).identical
    print(f"{name:26s} {coalescing['collectives'][name]:3d} collectives, {slowest.item() * 1000:6.2f} ms, "
          f"replicas identical: {coalescing['identical'][name]}")
# A BatchNorm model holds float32 tensors and an int64 one (num_batches_tracked): one bucket per dtype.
with_buffers = build_model(seed=SEED + rank, batchnorm=True)
coalescing["batchnorm_dtypes"] = sorted({str(t.dtype) for t in module_tensors(with_buffers)})
coalescing["batchnorm_coalesced"] = collectives_launched(broadcast_coalesced_, with_buffers)
coalescing["batchnorm_identical"] = compare_replicas(with_buffers).identical
report(coalescing=coalescing, coalescing_seconds=coalescing_seconds)


# Pretrained weights: load on every rank, or load on rank 0 and broadcast?
def pretrained_shape():
    return nn.Sequential(*[nn.Linear(PRETRAINED_WIDTH, PRETRAINED_WIDTH) for _ in range(PRETRAINED_LAYERS)])


folder = [tempfile.mkdtemp(prefix="ddpcourse-02-") if rank == 0 else None]
dist.broadcast_object_list(folder, src=0)  # a small Python object: what broadcast_object_list is for
checkpoint = os.path.join(folder[0], "pretrained.pt")
if rank == 0:
    torch.manual_seed(SEED)
    torch.save(pretrained_shape().state_dict(), checkpoint)
dist.barrier()
file_bytes = os.path.getsize(checkpoint)
model = pretrained_shape()  # every rank builds the architecture (random weights, to be replaced)
n_parameters = sum(p.numel() for p in model.parameters())


loads = {}  # torch.load calls per way of loading, on this rank: each call reads the whole file


def load_checkpoint(way):
    loads[way] = loads.get(way, 0) + 1
    return torch.load(checkpoint, weights_only=True)


def load_on_every_rank():
    model.load_state_dict(load_checkpoint("every rank loads"))


def load_on_rank0_and_broadcast():
    if rank == 0:
        model.load_state_dict(load_checkpoint("rank 0 loads, broadcast"))
    broadcast_parameters_and_buffers_(model, src=0)


timings, identical = {}, {}
for name, load in [("every rank loads", load_on_every_rank), ("rank 0 loads, broadcast", load_on_rank0_and_broadcast)]:
    best = float("inf")
    for _ in range(REPEATS):
        with torch.no_grad():
            for p in model.parameters():
                p.normal_()  # forget the previous load: different values on every rank again
        dist.barrier()
        start = time.perf_counter()
        load()
        dist.barrier()  # the slowest rank decides when training can start
        best = min(best, time.perf_counter() - start)
    worst = torch.tensor(best)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    timings[name] = worst.item()
    identical[name] = compare_replicas(model).identical
    print(f"{name:24s} {worst.item() * 1000:7.1f} ms  replicas identical: {identical[name]}")
# Per way: how many ranks called torch.load once per timed run (counted above).
loads_on_every_rank = [None] * world_size
dist.all_gather_object(loads_on_every_rank, loads)
loading_ranks = {way: sum(calls.get(way, 0) // REPEATS for calls in loads_on_every_rank) for way in timings}
report(n_parameters=n_parameters, file_bytes=file_bytes, timings=timings, identical_after_load=identical,
       loads_per_rank=loads_on_every_rank, loading_ranks=loading_ranks)
dist.barrier()
if rank == 0:
    os.remove(checkpoint)
    os.rmdir(folder[0])
if __name__ == "__main__":  # run alone; 02_all_demos.py runs it among other demos and ends the group itself
    dist.destroy_process_group()
