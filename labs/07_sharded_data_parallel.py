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

The script below the classes trains a model with a frozen layer and a tied weight against one process on
the whole batch and against torch's ZeroRedundancyOptimizer and fully_shard (FSDP2) on the same data, and
reports what it observed: final weights, which parameters each rank's optimizer held and changed, the
bytes of live tensors after each unit's forward, and the collectives of one step.

Run it:    python -m ddpcourse run labs/07_sharded_data_parallel.py --nproc 2
Check it:  python -m ddpcourse check labs/07_sharded_data_parallel.py
"""
import gc
import hashlib
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


# ===================================================================== the check's harness: keep as is
STEPS = 3
BATCH_SIZE = 16
WIDTH = 512        # four 512 x 512 layers: about 3 MiB of fp32 parameters, a step in a few milliseconds
IN_FEATURES, OUT_FEATURES = 32, 2
LEARNING_RATE = 0.05
MOMENTUM = 0.9
ADAM_LR = 1e-3
SEED = 7
MEMORY_STEP, COLLECTIVES_STEP = 1, 2  # the steps observed (not the first: nothing is left over from it)
PARTITION_CASES = [([5], 3), ([4, 4, 4, 4], 3), ([10, 1, 1, 1, 7], 2), ([3, 9, 3, 9, 1], 4)]


class ShardNet(nn.Module):
    """Five units: a frozen one, and one whose two layers share a weight (tied inside one unit)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(IN_FEATURES, WIDTH)
        self.frozen = nn.Linear(WIDTH, WIDTH).requires_grad_(False)
        self.tied = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
        self.tied[2].weight = self.tied[0].weight
        self.hidden = nn.Linear(WIDTH, WIDTH)
        self.out = nn.Linear(WIDTH, OUT_FEATURES)

    def forward(self, x):
        x = torch.relu(self.frozen(torch.relu(self.inp(x))))
        return self.out(torch.relu(self.hidden(torch.relu(self.tied(x)))))


def build():
    torch.manual_seed(SEED)  # every rank and every reference starts from the same weights
    return ShardNet()


def batch(step, rank):
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randn(BATCH_SIZE, IN_FEATURES, generator=generator),
            torch.randn(BATCH_SIZE, OUT_FEATURES, generator=generator))


def whole_batch(step, world_size):
    xs, ys = zip(*[batch(step, r) for r in range(world_size)])
    return torch.cat(xs), torch.cat(ys)


def units_of(model):
    """The units as the model's structure defines them (not as FSDP stored them): name, numel, trainable."""
    units = []
    for name, child in model.named_children():
        params = list(child.parameters())  # unique: a tied weight once
        if params:
            units.append({"name": name, "numel": sum(p.numel() for p in params),
                          "trainable": params[0].requires_grad})
    return units


def max_diffs(ours, theirs):
    """{name: max |ours - theirs|} over two {name: tensor} dicts."""
    return {name: (ours[name].double() - theirs[name].double()).abs().max().item() for name in theirs}


def digest(tensor):
    return hashlib.sha1(tensor.detach().contiguous().numpy().tobytes()).hexdigest()[:16]


def optimizer_groups(model, lr):
    """Two param groups with their own settings: the weight matrices, and the biases (and the frozen layer)."""
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    return [{"params": weights, "lr": lr}, {"params": rest, "lr": lr / 2}]


def recording(optimizer_cls, names, log):
    """optimizer_cls, noting which parameters it was given, which its step() changed, and its state's bytes."""
    class Recording(optimizer_cls):
        def __init__(self, params, **kwargs):
            super().__init__(params, **kwargs)
            log["held"] = sorted(names[id(p)] for g in self.param_groups for p in g["params"])
            log["stepped"], log["state_bytes"] = [], 0

        def step(self, closure=None):
            before = [(p, p.detach().clone()) for g in self.param_groups for p in g["params"]]
            loss = super().step(closure)
            changed = {names[id(p)] for p, old in before if not torch.equal(p, old)}
            log["stepped"] = sorted(changed | set(log["stepped"]))
            log["state_bytes"] = sum(t.nbytes for s in self.state.values() for t in s.values() if torch.is_tensor(t))
            return loss
    return Recording


def train_replicated(group, rank, make_optimizer, world_size=None):
    """STEPS steps of a model under torch's DDP (world_size None) or of one process on the whole batch."""
    model = build()
    net = model if world_size else nn.parallel.DistributedDataParallel(model, process_group=group)
    optimizer = make_optimizer(model)
    for step in range(STEPS):
        x, y = whole_batch(step, world_size) if world_size else batch(step, rank)
        optimizer.zero_grad()
        F.mse_loss(net(x), y).backward()
        optimizer.step()
    return model


def sharded_optimizer_cases(group, rank, world_size):
    """ShardedOptimizer vs one process on the whole batch vs torch's ZeroRedundancyOptimizer (SGD, Adam)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    cases = {}
    for label, cls, lr, kwargs in [("sgd", torch.optim.SGD, LEARNING_RATE, {"momentum": MOMENTUM}),
                                   ("adam", torch.optim.Adam, ADAM_LR, {})]:
        log = {}

        def ours(model):
            names = {id(p): n for n, p in model.named_parameters()}
            return ShardedOptimizer(optimizer_groups(model, lr), recording(cls, names, log), process_group=group,
                                    **kwargs)

        start = dict(build().named_parameters())
        model = train_replicated(group, rank, ours)
        zero = train_replicated(group, rank, lambda m: ZeroRedundancyOptimizer(
            optimizer_groups(m, lr), optimizer_class=cls, process_group=group, **kwargs))
        one = train_replicated(group, rank, lambda m: cls(optimizer_groups(m, lr), **kwargs), world_size)
        final = dict(model.named_parameters())
        cases[label] = {"vs_one_process": max_diffs(final, dict(one.named_parameters())),
                        "vs_zero": max_diffs(final, dict(zero.named_parameters())),
                        "digests": {n: digest(p) for n, p in final.items()},
                        "changed": sorted(n for n, p in final.items() if not torch.equal(p, start[n])),
                        "held": log["held"], "stepped": log["stepped"], "state_bytes": log["state_bytes"]}
    model = build()
    names = {id(p): n for n, p in model.named_parameters()}
    sizes = [[names[id(p)], p.numel()] for group_ in optimizer_groups(model, 1.0) for p in group_["params"]]
    return cases, sizes


PLAIN_TENSORS = (torch.Tensor, nn.Parameter)


def live_tensor_bytes(extra=()):
    """Bytes of every live tensor storage this process can reach: the tensors the garbage collector tracks and
    ``extra`` (those autograd saved for the backward), each storage counted once."""
    seen, total = set(), 0
    # type(), not isinstance(): fast over some 10^5 objects, and subclasses (DTensor) own no storage of their own
    for obj in [obj for obj in gc.get_objects() if type(obj) in PLAIN_TENSORS] + list(extra):
        storage = obj.untyped_storage()
        if storage.nbytes() and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def launched(group):
    return [group._get_sequence_number_for_group(), dist.group.WORLD._get_sequence_number_for_group()]


def train_fsdp(group, rank, compute_dtype):
    """STEPS steps of FSDP; the memory and the collectives of one step each observed from outside."""
    from ddpcourse.lab import CollectiveLog

    model = build()
    fsdp = FSDP(model, compute_dtype=compute_dtype, process_group=group)
    optimizer = torch.optim.SGD(fsdp.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    frozen_start = build().frozen.weight.detach()
    memory, collectives, first_grads = {}, {}, None
    after_unit = []
    for name, child in model.named_children():  # registered after FSDP's hooks: they run after its free
        child.register_forward_hook(
            lambda module, args, out, name=name: after_unit.append([name, live_tensor_bytes(saved)])
            if observing else None)
    saved, observing = [], False
    for step in range(STEPS):
        x, y = batch(step, rank)
        optimizer.zero_grad()
        if step == MEMORY_STEP:
            gc.collect()
            memory["before_forward"] = live_tensor_bytes()
            observing = True
            with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
                loss = F.mse_loss(fsdp(x), y)
            observing = False
            memory["after_forward"] = live_tensor_bytes(saved)
            memory["after_unit"] = after_unit
            saved.clear()
            loss.backward()
            fsdp.finish_gradient_synchronization()
        elif step == COLLECTIVES_STEP:
            start = launched(group)
            with CollectiveLog() as log:
                F.mse_loss(fsdp(x), y).backward()
                fsdp.finish_gradient_synchronization()
            collectives = {"calls": log.calls,
                           "on_group": launched(group)[0] - start[0], "on_default": launched(group)[1] - start[1]}
        else:
            F.mse_loss(fsdp(x), y).backward()
            fsdp.finish_gradient_synchronization()
        if step == 0:
            first_grads = fsdp.gather_full_params(grads=True)
        optimizer.step()
    memory["shard_bytes"] = sum(p.nbytes for p in fsdp.parameters())
    final = fsdp.gather_full_params()
    return fsdp, final, first_grads, memory, collectives, (final["frozen.weight"] - frozen_start).abs().max().item()


def train_fully_shard(rank, world_size, compute_dtype):
    """The same units and data under torch's FSDP2 (fully_shard), on a 1-D CPU mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype)
    model = build()
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    for step in range(STEPS):
        x, y = batch(step, rank)
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    return {n: p.full_tensor().detach() for n, p in model.named_parameters()}


def one_process_sgd(world_size):
    """The reference: one process, the whole batch of every rank, fp32."""
    model = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    grads = None
    for step in range(STEPS):
        x, y = whole_batch(step, world_size)
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        grads = grads or {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
    return {n: p.detach() for n, p in model.named_parameters()}, grads


def grad_ratios(ours, reference):
    """{name: <ours, ref> / <ref, ref>}: world_size where ours is the sum over ranks, 1 for the mean."""
    return {n: (ours[n].double() * r.double()).sum().item() / max((r.double() ** 2).sum().item(), 1e-300)
            for n, r in reference.items() if n in ours}


def bf16_exact_fraction(final, trained):
    """The share of trained weights that are exact bf16 values: about 0 for fp32 masters, 1 for bf16 ones."""
    exact = sum((final[n] == final[n].bfloat16().float()).sum().item() for n in trained)
    return exact / sum(final[n].numel() for n in trained)


def fsdp_cases(group, rank, world_size):
    reference, reference_grads = one_process_sgd(world_size)
    cases = {}
    for label, dtype in [("fp32", None), ("bf16", torch.bfloat16)]:
        fsdp, final, first_grads, memory, collectives, frozen_moved = train_fsdp(group, rank, dtype)
        theirs = train_fully_shard(rank, world_size, dtype)
        cases[label] = {"vs_one_process": max_diffs(final, reference), "vs_fully_shard": max_diffs(final, theirs),
                        "grad_ratios": grad_ratios(first_grads, reference_grads),
                        "shard_dtypes": sorted({str(p.dtype) for p in fsdp.parameters()}),
                        "parameters": [[p.numel(), p.requires_grad] for p in fsdp.parameters()],
                        "bf16_exact_fraction": bf16_exact_fraction(final, reference_grads),
                        "frozen_moved": frozen_moved, "memory": memory, "collectives": collectives}
    return cases


def tied_across_units_refused(group):
    """A weight tied between two units must be refused with a reason (the decision documented above)."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1].weight = model[0].weight
    try:
        FSDP(model, process_group=group)
    except ValueError as error:
        return str(error)
    return ""


def main():
    from ddpcourse import init_distributed, report

    rank, world_size, _ = init_distributed(backend="gloo")
    # a group of every rank, not the default one: the classes must use the process_group they are given
    group = dist.new_group(list(range(world_size)))
    optimizer_results, sizes = sharded_optimizer_cases(group, rank, world_size)
    fsdp_results = fsdp_cases(group, rank, world_size)
    for label, case in optimizer_results.items():
        print(f"ShardedOptimizer ({label}): max |ours - one process| {max(case['vs_one_process'].values()):.3g}, "
              f"max |ours - ZeroRedundancyOptimizer| {max(case['vs_zero'].values()):.3g}, "
              f"optimizer state {case['state_bytes']} bytes on rank {rank}")
    for label, case in fsdp_results.items():
        memory = case["memory"]
        print(f"FSDP ({label}): max |ours - one process| {max(case['vs_one_process'].values()):.3g}, "
              f"max |ours - fully_shard| {max(case['vs_fully_shard'].values()):.3g}; rank {rank}: shards "
              f"{memory['shard_bytes']} bytes, live tensors +{memory['after_forward'] - memory['before_forward']} "
              f"bytes after the forward; collectives in one step {len(case['collectives']['calls'])}")
    trainable = [name for name, p in build().named_parameters() if p.requires_grad]
    report(optimizer=optimizer_results, sizes=sizes, trainable=trainable, fsdp=fsdp_results, units=units_of(build()),
           partitions=[[sizes_, world, partition(sizes_, world)] for sizes_, world in PARTITION_CASES],
           tied_refused=tied_across_units_refused(group),
           config={"steps": STEPS, "batch_size": BATCH_SIZE, "width": WIDTH, "seed": SEED,
                   "memory_step": MEMORY_STEP, "collectives_step": COLLECTIVES_STEP})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
