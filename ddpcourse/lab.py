"""Helpers that lab scripts import (this module imports torch; the notebook side never does).

- ``init_distributed()`` joins the process group whether the script runs under torchrun or as a plain
  ``python lab.py`` (then a one-process group), so one script runs both ways. Introduced in
  notebooks/00_start_here.ipynb.
- ``compare_replicas(model)`` tells whether the model replicas on all ranks are identical and, if not,
  which parameters and buffers differ, on which ranks, by how much. Introduced in notebook 01 and used
  by every later lab.
"""
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

BACKEND_ENV = "DDPCOURSE_BACKEND"


def init_distributed(backend=None):
    """Join (or create) the default process group. Returns ``(rank, world_size, device)``.

    backend: "gloo" or "nccl"; default: $DDPCOURSE_BACKEND, else nccl when this machine has a CUDA GPU
    for every local rank, else gloo (CPU). "nccl" means nccl for CUDA tensors and gloo for CPU tensors.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    backend = backend or os.environ.get(BACKEND_ENV)
    if backend is None:
        enough_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= local_world
        backend = "nccl" if enough_gpus else "gloo"
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)  # before any collective: one GPU per rank
        # CUDA tensors go through nccl; CPU tensors (some labs keep their tiny model on the CPU) through gloo
        backend = "cpu:gloo,cuda:nccl"
    if not dist.is_initialized():
        if "RANK" in os.environ:  # started by torchrun: it set RANK, WORLD_SIZE, MASTER_ADDR/PORT
            dist.init_process_group(backend)
        else:  # plain `python lab.py`: a group of one, no network needed
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size(), device


@dataclass
class TensorDifference:
    kind: str            # "parameter" or "buffer"
    name: str
    groups: list         # lists of ranks holding the same values, e.g. [[0], [1, 2]]
    max_abs_diff: float  # largest elementwise difference between any two ranks

    def __str__(self):
        versions = " vs ".join("ranks " + ",".join(map(str, g)) for g in self.groups)
        return f"{self.kind} {self.name}: {len(self.groups)} versions ({versions}), max |diff| {self.max_abs_diff:.3g}"


@dataclass
class ReplicaReport:
    world_size: int
    parameters: int = 0
    buffers: int = 0
    differences: list = field(default_factory=list)  # TensorDifference
    structure: list = field(default_factory=list)    # messages when names or shapes differ

    @property
    def identical(self):
        return not self.differences and not self.structure

    def __str__(self):
        checked = f"{self.parameters} parameters and {self.buffers} buffers on {self.world_size} ranks"
        if self.identical:
            return f"replicas identical: {checked}"
        lines = [f"replicas DIFFER ({checked}):"]
        lines += [f"  {msg}" for msg in self.structure]
        lines += [f"  {diff}" for diff in self.differences]
        return "\n".join(lines)

    def as_dict(self):
        """Plain data for ``report(...)``; each difference carries its text, so a check that reads the
        report words it as this module does (one formatting of a replica difference)."""
        return {"identical": self.identical, "world_size": self.world_size, "structure": self.structure,
                "differences": [{"kind": d.kind, "name": d.name, "groups": d.groups,
                                 "max_abs_diff": d.max_abs_diff, "text": str(d)} for d in self.differences]}


def _tensors(model):
    model = getattr(model, "module", model)  # a DDP wrapper: compare what it wraps, names without "module."
    return ([("parameter", n, p) for n, p in model.named_parameters()]
            + [("buffer", n, b) for n, b in model.named_buffers()])


def compare_replicas(model, atol=0.0):
    """Compare ``model``'s parameters and buffers across all ranks. Every rank must call it.

    Returns the same ReplicaReport on every rank. ``atol``: differences up to this are "identical".
    """
    world = dist.get_world_size()
    items = _tensors(model)
    report = ReplicaReport(world, sum(k == "parameter" for k, _, _ in items),
                           sum(k == "buffer" for k, _, _ in items))
    layout = [(kind, name, list(t.shape)) for kind, name, t in items]
    layouts = [None] * world
    dist.all_gather_object(layouts, layout)
    for rank in range(1, world):
        if layouts[rank] != layouts[0]:
            mine, theirs = {n: (k, s) for k, n, s in layouts[0]}, {n: (k, s) for k, n, s in layouts[rank]}
            for name in sorted(set(mine) | set(theirs)):
                if mine.get(name) != theirs.get(name):
                    report.structure.append(f"{name}: rank 0 has {mine.get(name)}, rank {rank} has {theirs.get(name)}")
    if report.structure or not items:
        return report
    on = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    # One all_gather of everything flattened: one message instead of one per tensor.
    flat = torch.cat([t.detach().reshape(-1).to(on, torch.float64) for _, _, t in items])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    gathered = [g.cpu() for g in gathered]
    offset = 0
    for kind, name, tensor in items:
        size = tensor.numel()
        views = [g[offset:offset + size] for g in gathered]
        offset += size
        groups = []  # ranks grouped by equal values, in rank order
        for rank, values in enumerate(views):
            for group in groups:
                if torch.allclose(values, views[group[0]], rtol=0.0, atol=atol, equal_nan=True):
                    group.append(rank)
                    break
            else:
                groups.append([rank])
        if len(groups) > 1:
            reps = [views[g[0]] for g in groups]
            spread = max(float((a - b).abs().max()) for i, a in enumerate(reps) for b in reps[i + 1:])
            report.differences.append(TensorDifference(kind, name, groups, spread))
    return report


class CollectiveLog(TorchDispatchMode):
    """The c10d collectives this rank launches while active, DDP's and FSDP's own C++ calls included: every
    collective goes through the dispatcher, whoever calls it. ``calls``: [name, bytes of its largest tensor]
    (the full flat tensor of an all-gather or a reduce-scatter); ``names``: the names ("broadcast_", ...);
    ``launches``: each call's name, whether it was started with async_op=True, and its largest tensor's dtype."""

    def __init__(self):
        super().__init__()
        self.calls = []
        self.launches = []

    @property
    def names(self):
        return [name for name, _ in self.calls]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket._qualified_op_name
        if name.startswith("c10d::"):
            tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            largest = max(tensors, key=lambda t: t.nbytes, default=None)
            self.calls.append([name[len("c10d::"):], largest.nbytes if largest is not None else 0])
            schema = func._schema.arguments  # the op's own defaults, then what this call passed
            given = {a.name: a.default_value for a in schema if a.has_default_value()}
            given.update(zip((a.name for a in schema), args), **(kwargs or {}))
            self.launches.append({"name": name[len("c10d::"):], "async_op": bool(given.get("async_op")),
                                  "dtype": str(largest.dtype) if largest is not None else None})
        return func(*args, **(kwargs or {}))
