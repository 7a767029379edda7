# =====================================================================================================
# Lab 07, learner copy: replace each TODO's raise line with your code, then check your work with
#     python -m ddpcourse check labs/07_sharded_data_parallel.py
# Stuck on a TODO? `python -m ddpcourse hint 07` shows the next hint, one level at a time.
# Generated from solutions/07_sharded_data_parallel.py by `python -m ddpcourse make-labs`; course authors edit that file.
# =====================================================================================================
"""Lab 07: when replicas don't fit. ShardedOptimizer (ZeRO-1) and FSDP (ZeRO-3), built by hand.

Data parallelism keeps a whole replica on every rank: parameters, gradients and optimizer state. Sharding
keeps about 1/N of them per rank and moves the rest through collectives when they are needed:

- ShardedOptimizer (ZeRO stage 1): every rank still computes every gradient (DDP averages them), but each
  parameter has one owner rank; only the owner keeps its optimizer state and steps it, then sends the new
  values to the others. A rank keeps Adam's two state tensors for the parameters it owns only: about 1/N of
  them, as whole parameters allow (the harness's model gives one rank 48.6 % of the state on 3 ranks).
- FSDP (ZeRO stage 3): each direct child of the model (a "unit") keeps its parameters as one flat fp32
  tensor, of which a rank stores only its shard. Right before the unit's forward the ranks all-gather the
  full flat tensor, the unit computes, and the full copy is freed at once; the backward gathers it again,
  and the unit's gradient is reduce-scattered so that each rank receives the mean gradient of its shard.
  The optimizer steps the shards: they are the wrapper's only parameters.

Decisions, so that every model of the harness works:
- a parameter tied between two layers must sit in one unit (put both layers in one child); FSDP raises
  ValueError otherwise. Inside a unit a tied parameter is stored once and both layers see the same view.
- a unit's parameters are all trainable or all frozen (raise otherwise). A frozen unit is sharded and
  gathered like any other (its weights are needed to pass gradients through) but never reduce-scattered;
  its shard has requires_grad=False, so the optimizer skips it.
- the units are gathered ahead (prefetched) in registration order during the forward, and in the reverse
  of the order the forward ran them during the backward.

Your tasks:
  TODO 1  ShardedOptimizer.__init__: which parameters this rank owns, kept in their own param groups
  TODO 2  ShardedOptimizer.step: step only this rank's share
  TODO 3  ShardedOptimizer.step: every rank receives every updated parameter
  TODO 4  FSDP._gather: a unit's full parameters before its forward and before its backward
  TODO 5  FSDP._free: the full copy's memory released after the forward and after the backward
  TODO 6  FSDP._post_backward: the unit's gradient reduce-scattered: each rank gets the mean of its shard

ddpcourse/harness/lab07.py runs your classes: it trains a model with a frozen layer and a tied weight
against one process on the whole batch and against torch's ZeroRedundancyOptimizer and fully_shard (FSDP2)
on the same data, and reports what it observed: final weights, which parameters each rank's optimizer held
and changed, the bytes of live tensors after each unit's forward, and the collectives of one step.

Run it:    python -m ddpcourse run labs/07_sharded_data_parallel.py --nproc 2
Check it:  python -m ddpcourse check labs/07_sharded_data_parallel.py
"""
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.graph import register_multi_grad_hook
from torch.utils._pytree import tree_leaves, tree_map_only


def partition(sizes, world_size):
    """The owner rank of each parameter, given their sizes (numel): the largest first, each to the rank
    with the least so far (ties to the lower rank). Ranks may own nothing when parameters are few."""
    load = [0] * world_size
    owners = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):  # sorted() is stable: equal sizes keep order
        rank = min(range(world_size), key=load.__getitem__)       # min() returns the first: the lower rank
        owners[i] = rank
        load[rank] += sizes[i]
    return owners


class ShardedOptimizer:
    """ZeRO-1: ``ShardedOptimizer(params, torch.optim.Adam, lr=1e-3)``; each rank steps only the parameters
    it owns and keeps only their state. params: tensors, or param-group dicts with their own settings.
    The gradients must already be averaged over ranks (wrap the model in DDP)."""

    def __init__(self, params, optimizer_cls, process_group=None, **kwargs):
        self.process_group = process_group
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        params = list(params)
        groups = params if params and isinstance(params[0], dict) else [{"params": params}]
        self.param_groups = [{**group, "params": list(group["params"])} for group in groups]
        self.params = [p for group in self.param_groups for p in group["params"]]
        # TODO 1: every rank computes the same partition of all parameters (all groups together);
        #         keep, in each group, only the parameters this rank owns, with the group's own
        #         settings
        raise NotImplementedError("TODO 1: every rank computes the same partition of all parameters (all groups together); keep, in each group, only the parameters this rank owns, with the group's own settings")
        # a rank that owns nothing (more ranks than parameters) builds no optimizer: torch's refuse no parameters
        self.local_optimizer = optimizer_cls(own_groups, **kwargs) if own_groups else None

    def zero_grad(self, set_to_none=True):
        for p in self.params:  # every rank computed every gradient, owned or not
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:  # every rank runs it: its forward and backward are collective
            with torch.enable_grad():
                loss = closure()
        # TODO 2: the local optimizer holds only this rank's parameters, and may not exist at all
        raise NotImplementedError("TODO 2: the local optimizer holds only this rank's parameters, and may not exist at all")
        # TODO 3: a parameter's new value exists on its owner only; the others still hold the old
        #         one. Start every transfer before waiting for any
        raise NotImplementedError("TODO 3: a parameter's new value exists on its owner only; the others still hold the old one. Start every transfer before waiting for any")
        return loss


class _Unit:
    """One child of the wrapped module: its parameters as one flat tensor, padded and sharded."""

    def __init__(self, index, name, module):
        self.index, self.name, self.module = index, name, module
        self.params, self.slots = [], []  # unique parameters; (submodule, attribute, index into params)
        self.state = "free"               # "free", "gathering" (all-gather in flight) or "full"
        self.work = self.source = None    # the in-flight all-gather and the tensor it reads


class FSDP(nn.Module):
    """ZeRO-3: ``FSDP(module, compute_dtype=None, process_group=None)``. Each direct child of ``module``
    with parameters is a unit, sharded over the ranks; ``parameters()`` yields only this rank's fp32 shards.
    After ``loss.backward()`` call ``finish_gradient_synchronization()``, then ``optimizer.step()``.
    Every rank must build ``module`` identically (same seed), as for torch's fully_shard."""

    def __init__(self, module, compute_dtype=None, process_group=None):
        super().__init__()
        self.module = module
        self.process_group = process_group
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        self.compute_dtype = compute_dtype or torch.float32
        self.names = [name for name, _ in module.named_parameters()]  # gather_full_params() keeps these
        self.units, self.shards = [], nn.ParameterList()
        self.name_of = {}  # (unit index, param index) -> the original name
        owner = {}         # id(param) -> the child that holds it
        for child_name, child in module.named_children():
            unit = _Unit(len(self.units), child_name, child)
            index = {}
            for full_name, p in child.named_parameters(remove_duplicate=False):
                if owner.setdefault(id(p), child_name) != child_name:
                    raise ValueError(f"{child_name}.{full_name} is tied to a parameter of {owner[id(p)]}: a tied "
                                     f"parameter must sit in one unit (put both layers in one child module)")
                if id(p) not in index:
                    index[id(p)] = len(unit.params)
                    unit.params.append(p)
                    self.name_of[unit.index, index[id(p)]] = f"{child_name}.{full_name}"
                path, _, attr = full_name.rpartition(".")
                unit.slots.append((child.get_submodule(path), attr, index[id(p)]))
            if not unit.params:
                continue
            if len({p.requires_grad for p in unit.params}) > 1:
                raise ValueError(f"unit {child_name} mixes frozen and trainable parameters: one flat tensor has "
                                 f"one requires_grad; put the frozen layers in a child of their own")
            self._shard(unit)
            self.units.append(unit)
        outside = [name for name, p in module.named_parameters() if id(p) not in owner]
        if outside:
            raise ValueError(f"parameters outside every child: {outside}: FSDP shards the children's parameters")
        self._pending = []         # (unit, reduced shard gradient, full gradient, work) per reduce-scatter
        self._backward_order = []  # the units whose forward the next backward passes through, in forward order

    def _shard(self, unit):
        """Keep this rank's shard of the unit's flat parameter; the unit's layers read views of a full copy."""
        unit.shapes = [p.shape for p in unit.params]
        unit.numels = [p.numel() for p in unit.params]
        unit.total = sum(unit.numels)
        unit.padded = math.ceil(unit.total / self.world_size) * self.world_size  # equal shards on every rank
        unit.shard_numel = unit.padded // self.world_size
        unit.trainable = unit.params[0].requires_grad
        flat = torch.cat([p.detach().reshape(-1) for p in unit.params]).to(torch.float32)  # the masters: fp32
        flat = F.pad(flat, (0, unit.padded - unit.total))
        start = self.rank * unit.shard_numel
        unit.shard = nn.Parameter(flat[start:start + unit.shard_numel].clone(), requires_grad=unit.trainable)
        self.shards.append(unit.shard)
        # The full copy: a leaf whose gradient is the unit's flat gradient. Its storage is resized to 0 when
        # freed, so that autograd's saved views of it (same storage) hold no memory between forward and backward.
        unit.full = torch.empty(unit.padded, dtype=self.compute_dtype, requires_grad=unit.trainable)
        unit.storage = unit.full.untyped_storage()
        # Collectives write through an alias with a version counter of its own: autograd would refuse a saved
        # view whose base had been written in place since the forward.
        unit.buffer = torch.empty(0, dtype=self.compute_dtype).set_(unit.storage, 0, (unit.padded,))
        unit.storage.resize_(0)
        for submodule, attr, _ in unit.slots:
            del submodule._parameters[attr]  # the layers read plain tensors now, set before each forward
        if unit.trainable:
            unit.full.register_post_accumulate_grad_hook(lambda full, unit=unit: self._post_backward(unit))
        unit.module.register_forward_pre_hook(lambda module, args, unit=unit: self._pre_forward(unit))
        unit.module.register_forward_hook(lambda module, args, out, unit=unit: self._post_forward(unit, args, out))

    # ------------------------------------------------------------------ gather and free
    def _gather(self, unit):
        """Start the all-gather of the unit's full flat parameter (nothing if it is gathered or in flight)."""
        if unit.state != "free":
            return
        # TODO 4: give the full copy its memory back, then gather every rank's shard into it, in the
        #         compute dtype, without waiting (_wait finishes it). Write through unit.buffer,
        #         never unit.full
        raise NotImplementedError("TODO 4: give the full copy its memory back, then gather every rank's shard into it, in the compute dtype, without waiting (_wait finishes it). Write through unit.buffer, never unit.full")

    def _wait(self, unit):
        if unit.state == "gathering":
            unit.work.wait()
            unit.work = unit.source = None
            unit.state = "full"

    def _free(self, unit):
        """Release the unit's full copy: every view of it, autograd's saved ones too, then holds 0 bytes."""
        self._wait(unit)  # never free memory a collective is still writing
        # TODO 5: deleting your references frees nothing while autograd keeps the views it saved for
        #         the backward; shrink the memory they all share instead
        raise NotImplementedError('TODO 5: deleting your references frees nothing while autograd keeps the views it saved for the backward; shrink the memory they all share instead')

    def _set_views(self, unit):
        """Point the unit's layers at views of the full copy (a tied parameter: both at the same view)."""
        views = unit.full.split(unit.numels + [unit.padded - unit.total])
        views = [view.view(shape) for view, shape in zip(views, unit.shapes)]
        for submodule, attr, i in unit.slots:
            setattr(submodule, attr, views[i])

    # ------------------------------------------------------------------ the hooks
    def forward(self, *args, **kwargs):
        self._backward_order = []
        if self.compute_dtype != torch.float32:  # as fully_shard's MixedPrecisionPolicy: inputs in compute dtype
            args, kwargs = tree_map_only(
                torch.Tensor, lambda t: t.to(self.compute_dtype) if t.is_floating_point() else t, (args, kwargs))
        return self.module(*args, **kwargs)

    def _pre_forward(self, unit):
        self._gather(unit)
        self._wait(unit)
        self._set_views(unit)
        if unit.index + 1 < len(self.units):  # prefetch: the next unit's all-gather runs during this forward
            self._gather(self.units[unit.index + 1])

    def _post_forward(self, unit, args, output):
        self._free(unit)
        if not torch.is_grad_enabled():
            return
        outputs = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
        if outputs:  # the backward will pass through this unit: gather before its gradients are computed
            self._backward_order.append(unit)
            register_multi_grad_hook(outputs, lambda grads, unit=unit: self._pre_backward(unit), mode="any")
        inputs = [t for t in tree_leaves(args) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not unit.trainable and inputs:  # no gradient of its own: done once its input's gradient exists
            register_multi_grad_hook(inputs, lambda grads, unit=unit: self._free(unit))

    def _pre_backward(self, unit):
        self._gather(unit)
        self._wait(unit)
        k = self._backward_order.index(unit)
        if k > 0:  # prefetch the unit the backward reaches next
            self._gather(self._backward_order[k - 1])

    def _post_backward(self, unit):
        """Runs once the unit's flat gradient (unit.full.grad) is complete."""
        # TODO 6: each rank needs only its shard's slice of the gradient, as the mean over ranks;
        #         start the communication without waiting, keep what finish_gradient_synchronization
        #         needs, and take the gradient off the full copy
        raise NotImplementedError("TODO 6: each rank needs only its shard's slice of the gradient, as the mean over ranks; start the communication without waiting, keep what finish_gradient_synchronization needs, and take the gradient off the full copy")
        self._free(unit)

    def finish_gradient_synchronization(self):
        """Wait for the reduce-scatters; each shard's .grad (fp32) then holds its mean over ranks."""
        for unit, reduced, _, work in self._pending:
            work.wait()
            grad = reduced.to(unit.shard.dtype)  # bf16 gradients become fp32 on the fp32 master shard
            if unit.shard.grad is None:
                unit.shard.grad = grad
            else:  # several backward passes before a step accumulate
                unit.shard.grad += grad
        self._pending = []
        for unit in self.units:  # a unit the backward did not reach is still gathered
            self._free(unit)

    @torch.no_grad()
    def gather_full_params(self, grads=False):
        """{original name: full fp32 tensor} on every rank (the shards' gradients with grads=True)."""
        found = {}
        for unit in self.units:
            shard = unit.shard.grad if grads else unit.shard
            if shard is None:
                continue
            full = torch.empty(unit.padded, dtype=torch.float32)
            dist.all_gather_single(full, shard.detach().float(), group=self.process_group)
            for i, piece in enumerate(full[:unit.total].split(unit.numels)):
                found[self.name_of[unit.index, i]] = piece.view(unit.shapes[i]).clone()
        return {name: found[name] for name in self.names if name in found}


if __name__ == "__main__":
    # What runs your classes and reports to the check (the model, the data, torch's references) is
    # ddpcourse/harness/lab07.py: this file holds only what you write.
    from ddpcourse.harness import lab07

    lab07.main(partition=partition, sharded_optimizer=ShardedOptimizer, fsdp=FSDP)
