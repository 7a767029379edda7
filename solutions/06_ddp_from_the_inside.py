"""Lab 06: BucketedDDP, your own DistributedDataParallel with buckets that overlap the backward pass.

torch's DDP does not wait for backward() to end: a hook on every parameter fires when its gradient is
ready; parameters are grouped into buckets (in the order their gradients become ready: the reverse of
registration order), and as soon as a bucket's last gradient arrives, the bucket is flattened into one
tensor and all-reduced asynchronously while the backward goes on. Before the optimizer's step, the wait
copies the averaged gradients back. This class does the same in about sixty lines.

Your tasks (notebooks/06_ddp_from_the_inside.ipynb builds the two simpler versions first):
  TODO 1  _grad_ready: a bucket's communication starts as soon as its last gradient is ready
  TODO 2  _launch_bucket: start one bucket's communication; the backward must not wait for it
  TODO 3  finish_gradient_synchronization: before the step, each .grad holds its mean over ranks

The script below the class trains the same models with your BucketedDDP and with torch's DDP on the same
data (a model with a frozen layer, a weight shared by two layers and BatchNorm buffers; one bucket and
several), logs when gradients are ready and when all-reduces start and finish, and reports everything
to the check.

Run it:    python -m ddpcourse run labs/06_ddp_from_the_inside.py --nproc 2
Check it:  python -m ddpcourse check labs/06_ddp_from_the_inside.py
"""
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

FIRST_BUCKET_MB = 1.0  # torch's DDP: dist._DEFAULT_FIRST_BUCKET_BYTES


class BucketedDDP(nn.Module):
    """Data parallelism with gradient buckets all-reduced during the backward pass.

    After ``loss.backward()`` call ``finish_gradient_synchronization()``, then ``optimizer.step()``.
    """

    def __init__(self, module, bucket_cap_mb=25.0, process_group=None):
        super().__init__()
        self.module = module
        self.process_group = process_group  # None: all ranks (as torch's DDP; the notebook uses subgroups)
        self.world_size = dist.get_world_size(process_group)
        self.require_sync = True  # False inside no_sync()
        with torch.no_grad():  # every rank starts from rank 0's weights and buffers
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor, group=process_group, group_src=0)
        # parameters() lists a weight shared by two layers once; frozen parameters get no gradient.
        params = [p for p in module.parameters() if p.requires_grad]
        # Gradients become ready roughly in reverse registration order: fill buckets in that order. A bucket
        # closes once it holds bucket_cap_mb, the first one at 1 MiB already (torch's DDP does both, the
        # second with its default cap), so that the first all-reduce starts early in the backward.
        caps = [min(FIRST_BUCKET_MB, bucket_cap_mb) * 2**20, bucket_cap_mb * 2**20]
        self.buckets, size = [[]], 0
        for param in reversed(params):
            self.buckets[-1].append(param)
            size += param.numel() * param.element_size()
            if size >= caps[len(self.buckets) > 1]:
                self.buckets.append([])
                size = 0
        self.buckets = [bucket for bucket in self.buckets if bucket]
        self.bucket_of = {param: i for i, bucket in enumerate(self.buckets) for param in bucket}
        self.sizes = [[param.numel() for param in bucket] for bucket in self.buckets]
        self.synced_buffers = list(module.buffers())
        self._reset()
        for param in params:
            param.register_post_accumulate_grad_hook(self._grad_ready)

    def _reset(self):
        self.pending = [len(bucket) for bucket in self.buckets]  # one counter per bucket
        self.flat = [None] * len(self.buckets)                   # one tensor per bucket
        self.works = [None] * len(self.buckets)                  # one work handle per bucket

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled() and self.require_sync:  # as torch's DDP: rank 0's buffers every step
            with torch.no_grad():
                for buffer in self.synced_buffers:
                    dist.broadcast(buffer, group=self.process_group, group_src=0)
        return self.module(*args, **kwargs)

    def _grad_ready(self, param):
        """Runs during backward, right after `param.grad` has been accumulated."""
        if not self.require_sync:
            return  # no_sync(): the gradient stays local and accumulates
        ### BEGIN SOLUTION
        ### HINT 1: each bucket knows how many of its gradients have not arrived yet; the last one starts it
        ### HINT 2: self.bucket_of, self.pending, self._launch_bucket
        i = self.bucket_of[param]
        self.pending[i] -= 1
        if self.pending[i] == 0:
            self._launch_bucket(i)
        ### END SOLUTION

    def _launch_bucket(self, i):
        """Start the all-reduce of bucket i and return at once: the backward goes on meanwhile."""
        ### BEGIN SOLUTION
        ### HINT 1: one communication per bucket, not per parameter, and it must not block: keep what lets
        ### HINT 1: you wait for it later
        ### HINT 2: torch.cat, Tensor.reshape, dist.all_reduce with group= and async_op=, self.flat, self.works
        self.flat[i] = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
        self.works[i] = dist.all_reduce(self.flat[i], group=self.process_group, async_op=True)
        ### END SOLUTION

    def finish_gradient_synchronization(self):
        """Wait for every bucket and write the mean over ranks back into each parameter's .grad."""
        if not self.require_sync:
            return
        ### BEGIN SOLUTION
        ### HINT 1: an all-reduce sums; the optimizer reads a mean, and it reads it from each parameter's
        ### HINT 1: own .grad, not from the bucket's tensor
        ### HINT 2: Work.wait, self.world_size, Tensor.split with self.sizes, Tensor.view_as, Tensor.copy_
        for i, bucket in enumerate(self.buckets):
            self.works[i].wait()
            self.flat[i] /= self.world_size
            for param, piece in zip(bucket, self.flat[i].split(self.sizes[i])):
                param.grad.copy_(piece.view_as(param))
        ### END SOLUTION
        self._reset()

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally; the next one outside averages the total."""
        self.require_sync = False
        try:
            yield
        finally:
            self.require_sync = True


# ===================================================================== the check's harness: keep as is
STEPS = 3
BATCH_SIZE = 8
LEARNING_RATE = 0.05
ONE_BUCKET_MB = 25.0            # the whole model in one bucket (torch's default cap)
MANY_BUCKETS_MB = 256 / 2**20  # 256-byte buckets: the course model needs several
MICRO_BATCHES = 3               # gradient accumulation with no_sync()


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


class CollectiveLog:
    """Records, in order, when a gradient is ready and when each all_reduce starts, is waited for, ends."""

    def __init__(self):
        self.events, self.recording = [], False
        self._all_reduce = dist.all_reduce
        dist.all_reduce = self._logged_all_reduce  # the lab calls dist.all_reduce: it calls this

    def _logged_all_reduce(self, tensor, *args, **kwargs):
        if not self.recording:
            return self._all_reduce(tensor, *args, **kwargs)
        call = sum(e[0] == "launch" for e in self.events)
        self.events.append(("launch", call, tensor.numel()))
        work = self._all_reduce(tensor, *args, **kwargs)
        if work is None:  # async_op=False: it returned finished
            self.events.append(("done", call, 0))
            return None
        log = self

        class LoggedWork:
            def wait(self, *a, **k):
                result = work.wait(*a, **k)
                log.events.append(("done", call, 0))
                return result

            def __getattr__(self, name):
                return getattr(work, name)

        return LoggedWork()

    def watch(self, model):
        """Log each gradient as it is ready: hooks registered before the wrapper's, so they run first."""
        for name, param in model.named_parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(
                    lambda p, name=name: self.recording and self.events.append(("grad", name, 0)))

    def take(self):
        events, self.events = self.events, []
        return events


def layout(model):
    return {"trainable": [(n, p.numel(), p.element_size()) for n, p in model.named_parameters() if p.requires_grad],
            "frozen": [n for n, p in model.named_parameters() if not p.requires_grad],
            "state": [(n, t.numel()) for n, t in [*model.named_parameters(), *model.named_buffers()]],
            "tied": tied_names(model)}


def tied_names(model):
    """{first name: [other names]} of each parameter that several layers share."""
    first, tied = {}, {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            tied.setdefault(first[id(param)], []).append(name)
        first.setdefault(id(param), name)
    return tied


def train_against_torch(rank, world_size, log, bucket_cap_mb):
    """STEPS steps of BucketedDDP, then of torch's DDP, from the same start on the same data."""
    model = build(rank)
    log.watch(model)
    ours = BucketedDDP(model, bucket_cap_mb=bucket_cap_mb)
    after_wrap = flat_state(model)
    frozen_at_start = model.frozen.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    events, first_grads = [], {}
    for step in range(STEPS):
        x, y = batch(step, rank)
        optimizer.zero_grad()
        log.recording = True
        F.mse_loss(ours(x), y).backward()
        log.events.append(("backward returned", -1, 0))
        ours.finish_gradient_synchronization()
        log.recording = False
        events.append(log.take())
        first_grads.setdefault("ours", flat_grads(model))
        optimizer.step()

    theirs = nn.parallel.DistributedDataParallel(build(rank), bucket_cap_mb=bucket_cap_mb)
    optimizer = torch.optim.SGD(theirs.parameters(), lr=LEARNING_RATE)
    for step in range(STEPS):
        x, y = batch(step, rank)
        optimizer.zero_grad()
        F.mse_loss(theirs(x), y).backward()
        first_grads.setdefault("torch", flat_grads(theirs.module))
        optimizer.step()
    return {"after_wrap": after_wrap, "ours": flat_state(model), "torch": flat_state(theirs.module),
            "first_grads": first_grads, "events": events, "layout": layout(model), "cap_mb": bucket_cap_mb,
            "frozen_grad_is_none": model.frozen.weight.grad is None,
            "frozen_unchanged": bool(torch.equal(model.frozen.weight, frozen_at_start))}


def accumulate_against_large_batch(rank, world_size, log):
    """MICRO_BATCHES backward passes (all but the last in no_sync()), one step; vs one step on all the data."""
    model = build(rank, batchnorm=False)
    ours = BucketedDDP(model, bucket_cap_mb=MANY_BUCKETS_MB)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    calls_inside = 0
    for micro in range(MICRO_BATCHES):
        x, y = batch(0, rank, micro)
        log.recording = True
        context = ours.no_sync() if micro < MICRO_BATCHES - 1 else contextlib.nullcontext()
        with context:
            (F.mse_loss(ours(x), y) / MICRO_BATCHES).backward()
        if micro < MICRO_BATCHES - 1:
            calls_inside += sum(e[0] == "launch" for e in log.events)
        else:
            ours.finish_gradient_synchronization()
        log.recording = False
        log.take()
    optimizer.step()
    # The reference: rank 0's start, one process, one step on every rank's micro-batches at once.
    reference = build(0, batchnorm=False)
    xs, ys = zip(*[batch(0, r, m) for r in range(world_size) for m in range(MICRO_BATCHES)])
    F.mse_loss(reference(torch.cat(xs)), torch.cat(ys)).backward()
    torch.optim.SGD(reference.parameters(), lr=LEARNING_RATE).step()
    return {"ours": flat_state(model), "large_batch": flat_state(reference), "calls_inside_no_sync": calls_inside}


def main():
    from ddpcourse import init_distributed, report

    rank, world_size, _ = init_distributed()  # the models stay on the CPU (gloo), also on a GPU machine
    log = CollectiveLog()
    results = {"one_bucket": train_against_torch(rank, world_size, log, ONE_BUCKET_MB),
               "many_buckets": train_against_torch(rank, world_size, log, MANY_BUCKETS_MB)}
    accumulation = accumulate_against_large_batch(rank, world_size, log)
    for name, result in results.items():
        diff = max(abs(a - b) for a, b in zip(result["ours"], result["torch"]))
        calls = [sum(e[0] == "launch" for e in step) for step in result["events"]]
        print(f"{name}: all_reduce calls per step {calls}, max |ours - torch's DDP| after {STEPS} steps {diff:.2g}")
    report(scenarios=results, accumulation=accumulation,
           config={"steps": STEPS, "micro_batches": MICRO_BATCHES, "caps": [ONE_BUCKET_MB, MANY_BUCKETS_MB]})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
