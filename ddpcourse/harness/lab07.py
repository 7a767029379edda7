"""Lab 07's harness: what the lab runs around the learner's classes, and the evidence its check judges.

solutions/07_sharded_data_parallel.py (and its learner copy in labs/) holds only what the learner writes:
partition, ShardedOptimizer and FSDP. Its ``__main__`` hands them to ``main`` here, which trains a model with
a frozen unit and a tied weight with them, against one process on the whole batch and against torch's
ZeroRedundancyOptimizer and fully_shard (FSDP2) on the same data, and reports what it observed: final
weights, which parameters each rank's optimizer held and changed, the bytes of live tensors after each unit's
forward, and the collectives of one step. ddpcourse/checks/lab07.py judges that report. Kept out of the lab
file so the learner opens it on their own code; notebooks/demos/07_sharding.py and
benchmarks/fsdp_step_time.py reuse the model and the cases.
"""
import gc
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ddpcourse.lab import CollectiveLog, init_distributed
from ddpcourse.reporting import report

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


def sharded_optimizer_cases(group, rank, world_size, sharded_optimizer):
    """ShardedOptimizer vs one process on the whole batch vs torch's ZeroRedundancyOptimizer (SGD, Adam)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    cases = {}
    for label, cls, lr, kwargs in [("sgd", torch.optim.SGD, LEARNING_RATE, {"momentum": MOMENTUM}),
                                   ("adam", torch.optim.Adam, ADAM_LR, {})]:
        log = {}

        def ours(model):
            names = {id(p): n for n, p in model.named_parameters()}
            return sharded_optimizer(optimizer_groups(model, lr), recording(cls, names, log), process_group=group,
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


def train_fsdp(group, rank, compute_dtype, fsdp_class):
    """STEPS steps of FSDP; the memory and the collectives of one step each observed from outside."""
    model = build()
    fsdp = fsdp_class(model, compute_dtype=compute_dtype, process_group=group)
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


def fsdp_cases(group, rank, world_size, fsdp_class):
    reference, reference_grads = one_process_sgd(world_size)
    cases = {}
    for label, dtype in [("fp32", None), ("bf16", torch.bfloat16)]:
        fsdp, final, first_grads, memory, collectives, frozen_moved = train_fsdp(group, rank, dtype, fsdp_class)
        theirs = train_fully_shard(rank, world_size, dtype)
        cases[label] = {"vs_one_process": max_diffs(final, reference), "vs_fully_shard": max_diffs(final, theirs),
                        "grad_ratios": grad_ratios(first_grads, reference_grads),
                        "shard_dtypes": sorted({str(p.dtype) for p in fsdp.parameters()}),
                        "parameters": [[p.numel(), p.requires_grad] for p in fsdp.parameters()],
                        "bf16_exact_fraction": bf16_exact_fraction(final, reference_grads),
                        "frozen_moved": frozen_moved, "memory": memory, "collectives": collectives}
    return cases


def tied_across_units_refused(group, fsdp_class):
    """A weight tied between two units must be refused with a reason (the decision documented above)."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1].weight = model[0].weight
    try:
        fsdp_class(model, process_group=group)
    except ValueError as error:
        return str(error)
    return ""


def main(partition, sharded_optimizer, fsdp):
    """The lab's run: the learner's partition, ShardedOptimizer (ZeRO-1) and FSDP (ZeRO-3) class, judged."""
    rank, world_size, _ = init_distributed(backend="gloo")
    # a group of every rank, not the default one: the classes must use the process_group they are given
    group = dist.new_group(list(range(world_size)))
    optimizer_results, sizes = sharded_optimizer_cases(group, rank, world_size, sharded_optimizer)
    fsdp_results = fsdp_cases(group, rank, world_size, fsdp)
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
           tied_refused=tied_across_units_refused(group, fsdp),
           config={"steps": STEPS, "batch_size": BATCH_SIZE, "width": WIDTH, "seed": SEED,
                   "memory_step": MEMORY_STEP, "collectives_step": COLLECTIVES_STEP})
    dist.destroy_process_group()

