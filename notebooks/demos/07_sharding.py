"""Notebook 07's experiments, in one launch on 3 ranks: process groups of 1, 2 and 3 ranks stand for
world sizes 1, 2 and 3 (ranks outside a group wait at the next barrier).

- memory: the bytes of parameters, gradients and optimizer state each rank really holds after one step,
  for DDP, ZeRO-1 (torch's ZeroRedundancyOptimizer), ZeRO-2 (written here: each gradient reduced to its
  owner with dist.reduce, each updated parameter broadcast from it) and ZeRO-3 (torch's fully_shard), with
  SGD + momentum and with Adam;
- the lab's ShardedOptimizer with Adam against one process, element by element, and against Adam whose
  moments see one rank's gradients only;
- traffic: bytes the ranks send per collective and per training step (DDP, ZeRO-1, the ZeRO-2 written here,
  fully_shard, the lab's FSDP), from each process's own count of written bytes (Linux: /proc/self/io), so
  what gloo really sends is counted, not assumed; and the collectives each step launches (CollectiveLog);
- torch's FSDP tools: fully_shard with MixedPrecisionPolicy against one process, gradient accumulation with
  set_requires_gradient_sync(False), clip_grad_norm_ over shards against clipping each shard on its own,
  and a sharded checkpoint (torch.distributed.checkpoint) saved here on 2 ranks (notebook 07's next cell
  loads it on 3: --load).

    python -m ddpcourse run notebooks/demos/07_sharding.py --nproc 3 -- --checkpoint DIR
    python -m ddpcourse run notebooks/demos/07_sharding.py --nproc 3 -- --checkpoint DIR --load
"""
import argparse
import hashlib
import importlib.util
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse import init_distributed, report
from ddpcourse.harness import lab07 as harness  # the lab's model, data and cases
from ddpcourse.lab import CollectiveLog

# The lab's solution, loaded explicitly by path: a demo never runs the learner's unfinished lab.
_spec = importlib.util.spec_from_file_location(
    "lab07_solution", Path(__file__).resolve().parents[2] / "solutions" / "07_sharded_data_parallel.py")
solution = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(solution)

WIDTH, LAYERS = 512, 6  # 6 x Linear(512, 512): 1.58 M parameters, 6.3 MB in fp32
BATCH = 16  # per rank
LR = 0.05
OPTIMIZERS = {"SGD + momentum": (torch.optim.SGD, {"lr": LR, "momentum": 0.9}),
              "Adam": (torch.optim.Adam, {"lr": 1e-3})}


def build(seed=0, width=WIDTH, layers=LAYERS):
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])


def batch(step, rank, width=WIDTH, size=BATCH):
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(size, width, generator=generator), torch.randn(size, width, generator=generator)


def whole_batch(step, ranks, width=WIDTH, size=BATCH):
    parts = [batch(step, r, width, size) for r in ranks]
    return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])


def local(tensor):
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def nbytes(tensors):
    """Bytes of the storages behind `tensors`, each storage once (a view adds nothing)."""
    seen = {}
    for tensor in tensors:
        if tensor is None:
            continue
        storage = local(tensor).untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def state_tensors(optimizer):
    return [value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)]


# ----------------------------------------------------------------------------- 1. where the memory goes
def one_step_held(model, optimizer, state_of=None):
    """One step; then the bytes of parameters, gradients and optimizer state this rank holds."""
    x, y = batch(0, dist.get_rank())
    F.mse_loss(model(x), y).backward()
    optimizer.step()
    params = list(model.parameters())
    return {"parameters": nbytes(params), "gradients": nbytes(p.grad for p in params),
            "optimizer state": nbytes(state_tensors(state_of or optimizer))}


# DDP copies each gradient into a flat bucket buffer for its all-reduce. With gradient_as_bucket_view=True
# the .grad tensors are views of those buffers, so counting the storages behind .grad counts the buckets
# once; with the default (False) the buffers are a second copy that no .grad points at (see default_ddp_extra).
def step_ddp(group, ranks, optimizer_cls, kwargs):
    model = DDP(build(), process_group=group, gradient_as_bucket_view=True)
    return one_step_held(model, optimizer_cls(model.parameters(), **kwargs))


def ddp_bucket_copies(group):
    """The bytes of DDP's bucket buffers that no .grad shares, for DDP as built by default and with
    gradient_as_bucket_view=True: a comm hook sees each bucket's flat buffer (then all-reduces it as DDP's
    default hook does); a buffer whose storage is behind no .grad is a second copy of those gradients."""
    found = {}
    for label, as_view in (("default", False), ("gradient_as_bucket_view=True", True)):
        model = DDP(build(), process_group=group, gradient_as_bucket_view=as_view)
        buffers = []

        def recording_allreduce(seen, bucket):
            seen.append(bucket.buffer())
            return default_hooks.allreduce_hook(group, bucket)

        model.register_comm_hook(buffers, recording_allreduce)
        x, y = batch(0, dist.get_rank())
        F.mse_loss(model(x), y).backward()
        behind_grads = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
        found[label] = sum(b.untyped_storage().nbytes() for b in buffers
                           if b.untyped_storage().data_ptr() not in behind_grads)
    return found


def step_zero1(group, ranks, optimizer_cls, kwargs):
    model = DDP(build(), process_group=group, gradient_as_bucket_view=True)
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optimizer_cls, process_group=group,
                                        **kwargs)
    return one_step_held(model, optimizer, state_of=optimizer.optim)  # .optim: this rank's own optimizer


class ZeRO2:
    """ZeRO-2, written here to count what a rank holds (lab 07 builds ZeRO-1 and ZeRO-3): each parameter has
    one owner (lab 07's partition, as in ZeRO-1). As soon as the backward has accumulated a parameter's
    gradient, a hook reduces it to its owner and every other rank drops it, so no rank ever holds more than
    its own gradients plus the one being reduced. The owner steps its parameters, then sends them to all.
    (ZeRO's paper does the same per bucket of parameters; here each parameter is its own bucket.)"""

    def __init__(self, model, group, optimizer_cls, kwargs):
        self.group, self.params = group, list(model.parameters())
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.owner = solution.partition([p.numel() for p in self.params], self.world)
        mine = [p for p, owner in zip(self.params, self.owner) if owner == self.rank]
        self.optimizer = optimizer_cls(mine, **kwargs) if mine else None
        self.peak_gradient_bytes = 0  # the most bytes of .grad this rank held at once during the backward
        for p, owner in zip(self.params, self.owner):
            p.register_post_accumulate_grad_hook(lambda p, owner=owner: self._reduce(p, owner))

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def _reduce(self, p, owner):
        held = nbytes(q.grad for q in self.params)  # this gradient and the ones kept so far
        self.peak_gradient_bytes = max(self.peak_gradient_bytes, held)
        dist.reduce(p.grad, dst=dist.get_global_rank(self.group, owner), group=self.group)
        if owner == self.rank:
            p.grad /= self.world  # the sum of every rank's gradient, now the mean
        else:
            p.grad = None  # not this rank's to step: dropped at once

    @torch.no_grad()
    def step(self):
        if self.optimizer is not None:
            self.optimizer.step()
        for p, owner in zip(self.params, self.owner):  # each owner's updated parameters to every rank
            dist.broadcast(p, group_src=owner, group=self.group)


def step_zero2(group, ranks, optimizer_cls, kwargs):
    model = build()
    zero = ZeRO2(model, group, optimizer_cls, kwargs)
    held = one_step_held(model, zero, state_of=zero.optimizer)
    return held, zero.peak_gradient_bytes


def sharded(group, mp_policy=None, seed=0):
    mesh = DeviceMesh.from_group(group, "cpu")
    model = build(seed)
    for layer in model:
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy or MixedPrecisionPolicy())
    fully_shard(model, mesh=mesh, mp_policy=mp_policy or MixedPrecisionPolicy())
    return model


def step_zero3(group, ranks, optimizer_cls, kwargs):
    model = sharded(group)
    return one_step_held(model, optimizer_cls(model.parameters(), **kwargs))


SCHEMES = {"DDP": step_ddp, "ZeRO-1": step_zero1, "ZeRO-2": step_zero2, "ZeRO-3 (FSDP)": step_zero3}


# ----------------------------------------------------------------------------- 2. Adam, element by element
def adam_off_one_process(group, rank, world_size):
    """The share of the lab model's trainable weights more than lr/10 from one process's after the lab's
    Adam steps: for the lab's ShardedOptimizer under DDP, and for Adam stepping on this rank's batch only, whose
    moments never see the other ranks' gradients (what a ZeRO-1 built that way would compute)."""
    lr = harness.ADAM_LR

    def adam(model):
        return torch.optim.Adam(harness.optimizer_groups(model, lr))

    one = dict(harness.train_replicated(group, rank, adam, world_size).named_parameters())
    sharded = harness.train_replicated(group, rank, lambda model: solution.ShardedOptimizer(
        harness.optimizer_groups(model, lr), torch.optim.Adam, process_group=group))
    alone = harness.build()
    optimizer = adam(alone)
    for step in range(harness.STEPS):
        x, y = harness.batch(step, rank)
        optimizer.zero_grad()
        F.mse_loss(alone(x), y).backward()
        optimizer.step()

    def share_off(model):
        off = torch.cat([(p.detach() - one[name]).abs().flatten()
                         for name, p in model.named_parameters() if p.requires_grad])
        return (off > lr / 10).double().mean().item()

    return {"ShardedOptimizer": share_off(sharded), "Adam on this rank's batch only": share_off(alone)}


# ----------------------------------------------------------------------------- 3. what gloo sends
def written_bytes():
    """Bytes this process has written so far, sockets included (Linux: /proc/self/io's wchar): what gloo sent
    from this rank, counted by the kernel for this process alone, whatever else the machine is doing."""
    with open("/proc/self/io") as counters:
        for line in counters:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    return None


def sent_per_call(operation, group, calls=4):
    """Bytes the group's ranks sent together per call of `operation` (after one warm-up call)."""
    operation()
    dist.barrier(group=group)
    before = written_bytes()
    for _ in range(calls):
        operation()
    sent = torch.tensor([(written_bytes() - before) / calls], dtype=torch.float64)
    dist.all_reduce(sent, group=group)  # every rank's sends, added up
    return sent.item()


def collective_traffic(group):
    world = dist.get_world_size(group)
    full = torch.ones(6 * 2**19)  # 12 MiB: divisible by 1, 2 and 3 ranks
    shard = torch.ones(full.numel() // world)
    return {"size": full.numel() * 4,
            "all_gather_single": sent_per_call(lambda: dist.all_gather_single(full, shard, group=group), group),
            "reduce_scatter_single": sent_per_call(lambda: dist.reduce_scatter_single(shard, full, group=group),
                                                   group),
            "all_reduce": sent_per_call(lambda: dist.all_reduce(full, group=group), group)}


def collective_calls(operation):
    """The collectives `operation` launches, as ddpcourse.lab.CollectiveLog sees them at the dispatcher:
    [{"name", "async_op", "dtype"}, ...]."""
    with CollectiveLog() as log:
        operation()
    return log.launches


def operators_dispatched(operation):
    """How many ATen operators one call of `operation` dispatches, and how many of them are copies
    (aten::copy_), from torch.profiler's record."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        operation()
    events = profile.key_averages()
    return {"operators": sum(event.count for event in events if event.key.startswith("aten::")),
            "copies": sum(event.count for event in events if event.key == "aten::copy_")}


def step_traffic_and_time(group, steps=6):
    """Bytes sent, collectives launched and median time of one training step: DDP, DDP + ZeRO-1, the ZeRO-2
    written here, fully_shard and the lab's FSDP (6 units each)."""
    rank = dist.get_rank()
    found = {}
    for name in ("DDP", "DDP + ZeroRedundancyOptimizer", "ZeRO-2 (the demo's)", "fully_shard", "FSDP by hand"):
        if name == "ZeRO-2 (the demo's)":
            model = build()
            optimizer = ZeRO2(model, group, torch.optim.SGD, {"lr": LR})
        elif name == "fully_shard":
            model = sharded(group)
        elif name == "FSDP by hand":
            model = solution.FSDP(build(), process_group=group)
        else:
            model = DDP(build(), process_group=group)
        if name == "DDP + ZeroRedundancyOptimizer":
            optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD,
                                                process_group=group, lr=LR)
        elif name != "ZeRO-2 (the demo's)":
            optimizer = torch.optim.SGD(model.parameters(), lr=LR)

        def train_step(step=[0]):
            x, y = batch(step[0], rank)
            step[0] += 1
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            if name == "FSDP by hand":
                model.finish_gradient_synchronization()
            optimizer.step()

        sent = sent_per_call(train_step, group)
        calls = collective_calls(train_step)
        operators = operators_dispatched(train_step)
        times = []
        for _ in range(steps):
            dist.barrier(group=group)
            began = time.perf_counter()
            train_step()
            dist.barrier(group=group)
            times.append(time.perf_counter() - began)
        found[name] = {"bytes": sent, "seconds": statistics.median(times), **operators,
                       "collectives": len(calls), "async collectives": sum(call["async_op"] for call in calls),
                       "collective names": sorted({call["name"] for call in calls})}
    return found


# ----------------------------------------------------------------------------- 5. torch's own tools
def max_diff(model, reference):
    full = {name: (t.full_tensor() if isinstance(t, DTensor) else t).detach().float()
            for name, t in model.state_dict().items()}
    return max((full[name] - t).abs().max().item() for name, t in reference.state_dict().items())


def train_reference(ranks, steps, micro=1):
    reference = build()
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    for step in range(steps):
        optimizer.zero_grad()
        for m in range(micro):
            x, y = whole_batch(step * micro + m, ranks)
            (F.mse_loss(reference(x), y) / micro).backward()
        optimizer.step()
    return reference


def fsdp_equals_one_process(group, ranks, steps=3):
    """fully_shard in fp32 and with MixedPrecisionPolicy(param_dtype=bfloat16) against one process in fp32."""
    found = {}
    for label, policy in [("fp32", None), ("bf16 compute", MixedPrecisionPolicy(param_dtype=torch.bfloat16))]:
        model = sharded(group, policy)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        reduced = set()
        for step in range(steps):
            x, y = batch(step, dist.get_rank())
            optimizer.zero_grad()
            calls = collective_calls(F.mse_loss(model(x), y).backward)
            reduced |= {call["dtype"] for call in calls if "reduce_scatter" in call["name"]}
            optimizer.step()
        found[label] = {"max_diff": max_diff(model, train_reference(ranks, steps)),
                        "shard_dtype": str(local(next(model.parameters())).dtype),
                        "reduce_scatter_dtypes": sorted(reduced)}
    return found


def accumulation(group, ranks, micro=3):
    """micro-batches with set_requires_gradient_sync(False) but the last: one step, against one process; and
    the reduce-scatters each micro-batch's backward calls."""
    model = sharded(group)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scatters = []
    for m in range(micro):
        model.set_requires_gradient_sync(m == micro - 1)
        x, y = batch(m, dist.get_rank())
        calls = collective_calls((F.mse_loss(model(x), y) / micro).backward)
        scatters.append(sum("reduce_scatter" in call["name"] for call in calls))
    optimizer.step()
    return {"max_diff": max_diff(model, train_reference(ranks, 1, micro)), "reduce-scatters": scatters}


def clipping(group, ranks, max_norm=0.01):  # below every rank's shard norm: each rank clips
    """clip_grad_norm_ on DTensor shards computes the global norm; each rank clipping its own shard's norm
    scales each shard differently. Both against one process clipping the whole gradient."""
    reference = build()
    x, y = whole_batch(0, ranks)
    F.mse_loss(reference(x), y).backward()
    total = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm).item()
    torch.optim.SGD(reference.parameters(), lr=LR).step()
    found = {"one process norm": total}
    for label in ("clip_grad_norm_ on the sharded model", "each rank clips its own shard"):
        model = sharded(group)
        x, y = batch(0, dist.get_rank())
        F.mse_loss(model(x), y).backward()
        if label.startswith("clip_grad_norm_"):
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            found["sharded norm"] = (norm.full_tensor() if isinstance(norm, DTensor) else norm).item()
        else:  # the mistake: this rank's own norm, from its shards only
            own = torch.stack([local(p.grad).norm() for p in model.parameters()]).norm().item()
            for p in model.parameters():
                p.grad.mul_(min(1.0, max_norm / (own + 1e-6)))
        torch.optim.SGD(model.parameters(), lr=LR).step()
        found[label] = max_diff(model, reference)
    return found


def save_checkpoint(group, path):
    """2 ranks train 2 steps with fully_shard and save the sharded state with torch.distributed.checkpoint."""
    model = sharded(group)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(2):
        x, y = batch(step, dist.get_rank())
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    dcp.save({"model": model.state_dict()}, checkpoint_id=path, process_group=group)
    return {"saved_by": dist.get_world_size(group), "files": sorted(os.listdir(path)),
            "local_rows": local(model[0].weight).shape[0], "digest": full_digest(model)}


def load_checkpoint(path):
    """Every rank of this launch (3) loads the 2-rank checkpoint into its own 3-way sharding."""
    group = dist.group.WORLD
    model = sharded(group, seed=1)  # other weights first: the load must replace them
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=path)
    model.load_state_dict(state["model"])
    return {"loaded_by": dist.get_world_size(), "local_rows": local(model[0].weight).shape[0],
            "digest": full_digest(model)}


def full_digest(model):
    """SHA-256 of every whole tensor of the model's state_dict, in order: equal digests, equal bits."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor  # a collective: every rank
        digest.update(name.encode() + whole.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True, help="the sharded checkpoint's folder (made if missing)")
    parser.add_argument("--load", action="store_true", help="load the checkpoint on every rank, train nothing")
    options = parser.parse_args()
    rank, world_size, _ = init_distributed(backend="gloo")
    if options.load:
        report(loaded=load_checkpoint(options.checkpoint))
        dist.destroy_process_group()
        return
    groups = {n: dist.new_group(list(range(n))) for n in range(1, world_size + 1)}
    memory, zero2_peak, ddp_extra, traffic, steps, equal, accumulated, clipped, saved = ({}, {}, {}, {}, {}, {},
                                                                                        {}, {}, None)
    for n, group in groups.items():
        ranks = list(range(n))
        if rank < n:
            for scheme, run in SCHEMES.items():
                for optimizer_name, (optimizer_cls, kwargs) in OPTIMIZERS.items():
                    held = run(group, ranks, optimizer_cls, kwargs)
                    if scheme == "ZeRO-2":
                        held, zero2_peak[f"{optimizer_name}|{n}"] = held
                    memory[f"{scheme}|{optimizer_name}|{n}"] = held
            ddp_extra[n] = ddp_bucket_copies(group)
            if n > 1:
                traffic[n] = collective_traffic(group)
                steps[n] = step_traffic_and_time(group)
            equal[n] = fsdp_equals_one_process(group, ranks)
            accumulated[n] = accumulation(group, ranks)
            clipped[n] = clipping(group, ranks)
            if n == 2:
                saved = save_checkpoint(group, options.checkpoint)
        dist.barrier()
    # sections 2 and 4: the lab's ShardedOptimizer and FSDP, on all 3 ranks (its fully_shard reference uses
    # the whole world's mesh)
    handmade = {"optimizer": harness.sharded_optimizer_cases(groups[world_size], rank, world_size,
                                                           solution.ShardedOptimizer)[0],
                "adam_off": adam_off_one_process(groups[world_size], rank, world_size),
                "fsdp": harness.fsdp_cases(groups[world_size], rank, world_size, solution.FSDP)}
    params = sum(p.numel() for p in build().parameters())
    report(parameters=params, handmade=handmade, memory=memory, zero2_peak=zero2_peak, ddp_extra=ddp_extra,
           traffic=traffic, steps=steps, equal=equal, accumulated=accumulated, clipped=clipped, saved=saved)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
