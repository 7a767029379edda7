"""Lab 06's harness: what the lab runs around the learner's BucketedDDP, and the evidence its check judges.

solutions/06_ddp_from_the_inside.py (and its learner copy in labs/) holds only what the learner writes and
the code it stands on. Its ``__main__`` hands BucketedDDP to ``main`` here, which trains the same models
with it and with torch's DDP on the same data (a frozen layer, a weight shared by two layers and BatchNorm
buffers; one bucket and several), notes how many collectives its process group had launched as each
gradient became ready, holds the other ranks back until rank 0 has all its gradients (an all-reduce in
flight then cannot have finished), and reports everything; ddpcourse/checks/lab06.py judges the report. Kept
out of the lab file so the learner opens it on their own code; notebooks/demos/06_inside_ddp.py reuses the
model and the data.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ddpcourse.lab import init_distributed
from ddpcourse.reporting import report

STEPS = 3
BATCH_SIZE = 8
LEARNING_RATE = 0.05
ONE_BUCKET_MB = None            # torch's default cap: the whole course model fits in one bucket
MANY_BUCKETS_MB = 256 / 2**20   # 256-byte buckets (the first one too): the course model needs several
LAYOUT_CAPS_MB = [None, 2.5]    # bucket layouts of a 3 MiB model: the first bucket's cap depends on these
MICRO_BATCHES = 3               # gradient accumulation with no_sync()
HOLD_SECONDS = 5.0              # how long the other ranks hold back their backward for rank 0 (see below)


class CourseNet(nn.Module):
    """A frozen layer, a weight shared by two layers, BatchNorm buffers: every case a DDP must handle."""

    def __init__(self, batchnorm=True):
        super().__init__()
        self.inp = nn.Linear(8, 32)
        self.norm = nn.BatchNorm1d(32) if batchnorm else nn.Identity()
        self.frozen = nn.Linear(32, 32).requires_grad_(False)
        self.hidden_a = nn.Linear(32, 32)
        self.hidden_b = nn.Linear(32, 32)
        self.hidden_b.weight = self.hidden_a.weight  # tied: one tensor, used twice per forward
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        x = torch.relu(self.frozen(torch.relu(self.norm(self.inp(x)))))
        return self.out(torch.relu(self.hidden_b(torch.relu(self.hidden_a(x)))))


def build(rank, batchnorm=True):
    torch.manual_seed(100 + rank)  # a different start on every rank: the constructor's broadcast matters
    return CourseNet(batchnorm)


def batch(step, rank, micro=0):
    generator = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    return torch.randn(BATCH_SIZE, 8, generator=generator), torch.randn(BATCH_SIZE, 1, generator=generator)


def flat_state(model):
    return torch.cat([t.detach().reshape(-1).double() for t in [*model.parameters(), *model.buffers()]]).tolist()


def flat_grads(model):
    return torch.cat([p.grad.reshape(-1).double() for p in model.parameters() if p.requires_grad]).tolist()


class LaunchLog:
    """What the process groups themselves saw: each group counts the collectives launched on it, whatever
    function launched them. A hook registered before the wrapper's notes that count as each gradient is
    ready, so the log tells how many collectives had been launched by then, on the given group and on the
    default one."""

    def __init__(self, group):
        self.group, self.default = group, dist.group.WORLD
        self.step = None      # the step being recorded (start() .. take())
        self.hold = None      # set by hold_back(): this rank's wait at its first gradient
        self.outcomes = []    # hold_back's result per held step: "released" or "timed out"

    def launched(self):
        return [self.group._get_sequence_number_for_group(), self.default._get_sequence_number_for_group()]

    def watch(self, model):
        """Note the counts as each gradient is ready (hooks registered before the wrapper's run first)."""
        for name, param in model.named_parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(lambda p, name=name: self._grad(name))

    def start(self, trainable):
        self.step = {"grads": [], "start": self.launched(), "trainable": trainable}

    def note(self, moment):
        self.step[moment] = self.launched()

    def take(self):
        step, self.step = self.step, None
        return step

    def _grad(self, name):
        if self.step is None:
            return
        self.step["grads"].append([name, *self.launched()])
        if self.hold is not None:
            self.hold(len(self.step["grads"]), self.step["trainable"])


def hold_back(log, store, scenario, world_size):
    """A collective that can only finish after rank 0's last gradient exists. Every other rank waits, at its
    first gradient of each step (before its wrapper's hook runs, so before it launches anything), until rank 0
    has produced its last gradient. Rank 0's first all-reduce cannot finish before the others join it: if rank
    0 waits for it anywhere inside the backward, whatever the route, its last gradient never comes and the
    wait times out. Recorded per step: "released" or "timed out"."""
    rank, steps = dist.get_rank(), [0]

    def hold(count, trainable):
        key = f"{scenario}/{steps[0]}"
        if rank == 0 and count == trainable:  # rank 0's last gradient of this step
            store.set(key, "rank 0 has all its gradients")
            steps[0] += 1
        elif rank > 0 and count == 1:
            if not log.outcomes or log.outcomes[-1] == "released":
                try:
                    store.wait([key], datetime.timedelta(seconds=HOLD_SECONDS))
                    log.outcomes.append("released")
                except dist.DistStoreError:
                    log.outcomes.append("timed out")  # hold no further steps: the evidence is in
            steps[0] += 1

    log.hold = hold if world_size > 1 else None


def layout(model, buckets=None):
    names = {id(p): n for n, p in model.named_parameters()}
    return {"trainable": [(n, p.numel(), p.element_size()) for n, p in model.named_parameters() if p.requires_grad],
            "frozen": [n for n, p in model.named_parameters() if not p.requires_grad],
            "state": [(n, t.numel()) for n, t in [*model.named_parameters(), *model.named_buffers()]],
            "tied": tied_names(model),
            "buckets": [[names[id(p)] for p in bucket] for bucket in buckets or []]}


def tied_names(model):
    """{first name: [other names]} of each parameter that several layers share."""
    first, tied = {}, {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            tied.setdefault(first[id(param)], []).append(name)
        first.setdefault(id(param), name)
    return tied


def train_against_torch(rank, world_size, log, group, bucket_cap_mb, wrapper):
    """STEPS steps of BucketedDDP, then of torch's DDP, from the same start on the same data."""
    model = build(rank)
    log.watch(model)
    ours = wrapper(model, bucket_cap_mb=bucket_cap_mb, process_group=group)
    after_wrap = flat_state(model)
    frozen_at_start = model.frozen.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    trainable = sum(p.requires_grad for p in model.parameters())
    events, first_grads = [], {}
    for step in range(STEPS):
        x, y = batch(step, rank)
        optimizer.zero_grad()
        loss = F.mse_loss(ours(x), y)
        log.start(trainable)
        loss.backward()
        log.note("backward returned")
        ours.finish_gradient_synchronization()
        log.note("finished")
        events.append(log.take())
        first_grads.setdefault("ours", flat_grads(model))
        optimizer.step()

    theirs = nn.parallel.DistributedDataParallel(build(rank), bucket_cap_mb=bucket_cap_mb, process_group=group)
    optimizer = torch.optim.SGD(theirs.parameters(), lr=LEARNING_RATE)
    for step in range(STEPS):
        x, y = batch(step, rank)
        optimizer.zero_grad()
        F.mse_loss(theirs(x), y).backward()
        first_grads.setdefault("torch", flat_grads(theirs.module))
        optimizer.step()
    trainable_names = [n for n, p in theirs.module.named_parameters() if p.requires_grad]
    rebuilt = str(theirs._get_ddp_logging_data().get("rebuilt_per_bucket_param_indices", ""))
    torch_buckets = [[trainable_names[int(i)] for i in part.split()] for part in rebuilt.split(",") if part.strip()]
    return {"torch_buckets": torch_buckets,"after_wrap": after_wrap, "ours": flat_state(model), "torch": flat_state(theirs.module),
            "first_grads": first_grads, "events": events, "layout": layout(model, ours.buckets),
            "cap_mb": bucket_cap_mb, "frozen_grad_is_none": model.frozen.weight.grad is None,
            "frozen_unchanged": bool(torch.equal(model.frozen.weight, frozen_at_start))}


def bucket_layouts(group, wrapper):
    """The buckets BucketedDDP builds for a 3 MiB model (three Linear(512, 512)) with each cap of LAYOUT_CAPS_MB."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 512), nn.Linear(512, 512))
    return [layout(model, wrapper(model, bucket_cap_mb=cap, process_group=group).buckets) | {"cap_mb": cap}
            for cap in LAYOUT_CAPS_MB]


def accumulate_against_large_batch(rank, world_size, log, group, wrapper):
    """MICRO_BATCHES forward and backward passes (all but the last in no_sync()), one step; vs one step on all
    the data."""
    model = build(rank, batchnorm=False)
    ours = wrapper(model, bucket_cap_mb=MANY_BUCKETS_MB, process_group=group)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    before = log.launched()
    for micro in range(MICRO_BATCHES):
        x, y = batch(0, rank, micro)
        if micro < MICRO_BATCHES - 1:
            with ours.no_sync():
                (F.mse_loss(ours(x), y) / MICRO_BATCHES).backward()
            inside = [now - then for now, then in zip(log.launched(), before)]
        else:
            (F.mse_loss(ours(x), y) / MICRO_BATCHES).backward()
            ours.finish_gradient_synchronization()
    optimizer.step()
    # The reference: rank 0's start, one process, one step on every rank's micro-batches at once.
    reference = build(0, batchnorm=False)
    xs, ys = zip(*[batch(0, r, m) for r in range(world_size) for m in range(MICRO_BATCHES)])
    F.mse_loss(reference(torch.cat(xs)), torch.cat(ys)).backward()
    torch.optim.SGD(reference.parameters(), lr=LEARNING_RATE).step()
    return {"ours": flat_state(model), "large_batch": flat_state(reference), "calls_inside_no_sync": sum(inside)}


def main(wrapper):
    """The lab's run: the learner's BucketedDDP class (``wrapper``) against torch's DDP, judged."""
    # gloo on the CPU on every machine: the models are CPU models, and the groups' counters must be gloo's
    rank, world_size, _ = init_distributed(backend="gloo")
    # A group of every rank, not the default one: the wrapper must reduce over the process_group it is given.
    group = dist.new_group(list(range(world_size)))
    log = LaunchLog(group)
    results = {"one_bucket": train_against_torch(rank, world_size, log, group, ONE_BUCKET_MB, wrapper)}
    if world_size > 1:  # torchrun's store, which every rank reaches
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        hold_back(log, dist.PrefixStore("lab06-hold", store), "many_buckets", world_size)
    results["many_buckets"] = train_against_torch(rank, world_size, log, group, MANY_BUCKETS_MB,
                                                   wrapper)
    holds = log.outcomes
    log.hold = None
    accumulation = accumulate_against_large_batch(rank, world_size, log, group, wrapper)
    for name, result in results.items():
        diff = max(abs(a - b) for a, b in zip(result["ours"], result["torch"]))
        calls = [step["finished"][0] - step["start"][0] for step in result["events"]]
        print(f"{name}: collectives per step {calls}, max |ours - torch's DDP| after {STEPS} steps {diff:.2g}")
    report(scenarios=results, accumulation=accumulation, holds=holds, layouts=bucket_layouts(group, wrapper),
           config={"steps": STEPS, "micro_batches": MICRO_BATCHES, "caps": [ONE_BUCKET_MB, MANY_BUCKETS_MB],
                   "layout_caps": LAYOUT_CAPS_MB, "hold_seconds": HOLD_SECONDS})
    dist.destroy_process_group()

