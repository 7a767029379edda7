"""Demo for notebook 06: torch's DDP seen from the inside, three hand-built versions proved equal to it,
and what each one costs. One launch on 3 ranks does everything:

1. torch's DDP on 2 ranks: its buckets step by step (one at first, rebuilt after step 1), the order in
   which it launches them, an all-reduce in flight while the backward goes on, and a profiled step;
   on 3 ranks, how torch's averaging rounds (the scale, then the sum in the bucket's layout);
2. NaiveDDP, OverlappedDDP (demos/06_handwritten_ddp.py) and BucketedDDP (the lab's SOLUTION, loaded
   from solutions/, never your lab) against torch's DDP, 3 steps, on process groups of 1, 2 and 3 ranks;
3. step time, all-reduce calls and bytes of the four on two models, on 2 ranks (rank 2 waits);
4. BucketedDDP's step time over bucket sizes;
5. all_reduce latency and bandwidth, the compute time of a step, and the one-process baselines, from
   which the notebook predicts each step time before comparing with the measured one.

python -m ddpcourse run notebooks/demos/06_inside_ddp.py --nproc 3
"""
import importlib.util
import datetime
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.profiler import ProfilerActivity, profile

from ddpcourse import init_distributed, report
from ddpcourse.harness import lab06 as harness  # the model and the data the lab's check trains on
from ddpcourse.launch.cores import usable_cores

HERE = Path(__file__).resolve().parent


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


handwritten = load(HERE / "06_handwritten_ddp.py", "handwritten_ddp")
# The lab's solution, loaded explicitly by path: a demo never runs the learner's unfinished lab.
solution = load(HERE.parent.parent / "solutions" / "06_ddp_from_the_inside.py", "lab06_solution")

# -------------------------------------------------------------------------------------------- config
BATCH = 64                     # per rank
TIMED_STEPS = 7                # per variant and model, after 2 warm-up steps; an odd count: the median is one of them
SWEEP_CAPS_MB = [1 / 1024, 32 / 1024, 128 / 1024, 0.5, None]  # 1 KiB ... None (the default: 25 MiB)
FIT_SIZES = [4, 1024, 16 * 2**10, 256 * 2**10, 2**20, 4 * 2**20, 16 * 2**20]  # bytes
LAST_BUCKET_CAP = "DDP_SET_LAST_BUCKET_CAP"  # an environment variable torch's Reducer reads at the rebuild
# -----------------------------------------------------------------------------------------------------


def wrap(variant, model, group, bucket_cap_mb=None):
    if variant == "naive":
        return handwritten.NaiveDDP(model, process_group=group)
    if variant == "overlapped":
        return handwritten.OverlappedDDP(model, process_group=group)
    if variant == "bucketed":
        return solution.BucketedDDP(model, bucket_cap_mb=bucket_cap_mb, process_group=group)
    return nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=bucket_cap_mb)


VARIANTS = ["naive", "overlapped", "bucketed", "torch"]


def small_layers():
    """Many small layers: 40 Linear(64, 64), 80 tensors, 0.63 MiB: latency-bound."""
    torch.manual_seed(0)
    return nn.Sequential(*[layer for _ in range(40) for layer in (nn.Linear(64, 64), nn.ReLU())])


def large_layers():
    """Few large layers: 3 Linear(1024, 1024), 6 tensors, 12 MiB: bandwidth-bound."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))


MODELS = {"small layers": (small_layers, 64), "large layers": (large_layers, 1024)}


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step(wrapped, optimizer, x, y):
    optimizer.zero_grad()
    F.mse_loss(wrapped(x), y).backward()
    if hasattr(wrapped, "finish_gradient_synchronization"):  # ours; torch's DDP waits inside backward()
        wrapped.finish_gradient_synchronization()
    optimizer.step()


def data(width, rank, device, batch=BATCH, seed=0):
    generator = torch.Generator().manual_seed(seed * 100 + rank)
    return (torch.randn(batch, width, generator=generator).to(device),
            torch.randn(batch, width, generator=generator).to(device))


def timed(fn, steps, device, group=None, samples=None):
    """Median seconds of fn() over `steps` calls (ranks of `group` start each call together); every
    call's seconds are appended to `samples` when given."""
    times = [] if samples is None else samples
    for _ in range(steps):
        if group is not None:
            dist.barrier(group)
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def profiled(fn, device):
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        synchronize(device)
    return prof.events()


class CountedAllReduce:
    """Counts the all_reduce calls (and bytes) of the hand-written versions: they call dist.all_reduce."""

    def __init__(self):
        self.calls, self.bytes = 0, 0
        self._all_reduce = dist.all_reduce

    def __call__(self, tensor, *args, **kwargs):
        self.calls += 1
        self.bytes += tensor.numel() * tensor.element_size()
        return self._all_reduce(tensor, *args, **kwargs)

    def __enter__(self):
        dist.all_reduce = self
        return self

    def __exit__(self, *exc):
        dist.all_reduce = self._all_reduce


def traffic(variant, build, group, device, x, y):
    """(all_reduce calls, bytes) of one step, the third (torch's DDP has rebuilt its buckets by then).

    torch's DDP reduces from C++: a communication hook that counts each bucket, then all-reduces it as
    the default does, tells its calls. The hand-written versions call dist.all_reduce: counted there.
    """
    wrapped = wrap(variant, build().to(device), group)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.01)
    counted = CountedAllReduce()
    if variant == "torch":
        def counting_hook(state, bucket):
            counted.calls += 1
            counted.bytes += bucket.buffer().numel() * bucket.buffer().element_size()
            return allreduce_hook(group, bucket)
        wrapped.register_comm_hook(None, counting_hook)
    for _ in range(2):
        step(wrapped, optimizer, x, y)
    counted.calls, counted.bytes = 0, 0
    if variant == "torch":
        step(wrapped, optimizer, x, y)
    else:
        with counted:
            step(wrapped, optimizer, x, y)
    return counted.calls, counted.bytes


# ----------------------------------------------------------------------------- 1. a timeline of DDP
def ddp_timeline(device, group):
    """One profiled step of torch's DDP: backward ops, all-reduce launches and the reductions."""
    model = large_layers().to(device)
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=4.0)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = data(1024, dist.get_rank(), device)
    for _ in range(2):  # DDP rebuilds its buckets in gradient-ready order after the first step
        step(ddp, optimizer, x, y)
    dist.barrier(group)
    events = profiled(lambda: step(ddp, optimizer, x, y), device)
    keep = []
    for e in events:
        if (e.name.endswith("Backward0") and not e.name.startswith("autograd::")) or e.name in ("c10d::allreduce_", "gloo:all_reduce", "nccl:all_reduce",
                                                       "DistributedDataParallel.forward", "Optimizer.step#SGD.step"):
            keep.append([e.name, e.time_range.start / 1000, e.time_range.end / 1000, e.thread])
    zero = min(start for _, start, _, _ in keep)
    main_thread = next(t for name, _, _, t in keep if name == "DistributedDataParallel.forward")
    timeline = [[name, start - zero, end - zero, "main" if thread == main_thread else "other"]
                for name, start, end, thread in keep]
    logging = ddp._get_ddp_logging_data()
    buckets = [int(s) for s in str(logging["rebuilt_bucket_sizes"]).split(",")]
    order = [[int(i) for i in part.split()] for part in str(logging["rebuilt_per_bucket_param_indices"]).split(",")]
    return {"timeline": sorted(timeline, key=lambda row: row[1]), "bucket_bytes": buckets, "bucket_params": order,
            "parameter_names": [n for n, _ in model.named_parameters()]}


class BucketLog:
    """A communication hook that notes each bucket as DDP launches it (its index and parameters), then
    all-reduces it as DDP's default does; post-accumulate-grad hooks note each gradient as it is ready."""

    def __init__(self, ddp, group, names):
        self.events, self.futures, self.group, self.names = [], [], group, names
        ddp.register_comm_hook(None, self.launch)
        for param in ddp.module.parameters():
            param.register_post_accumulate_grad_hook(lambda p: self.events.append(["grad", self.names[p]]))

    def launch(self, state, bucket):
        self.events.append(["launch", bucket.index(), [self.names[p] for p in bucket.parameters()],
                            bucket.buffer().numel() * bucket.buffer().element_size()])
        future = allreduce_hook(self.group, bucket)
        self.futures.append(future)
        return future

    def take(self):
        events, self.events, self.futures = self.events, [], []
        return events


def names_of(model):
    return {p: n for n, p in model.named_parameters()}


def bucket_steps(device, group):
    """The buckets torch's DDP all-reduces in each of 3 steps, with each setting, on the 3 x 4 MiB model."""
    settings = {"defaults": {}, "bucket_cap_mb=4": {"bucket_cap_mb": 4}, "bucket_cap_mb=25": {"bucket_cap_mb": 25},
                "static_graph=True": {"static_graph": True},
                "find_unused_parameters=True": {"find_unused_parameters": True},
                LAST_BUCKET_CAP + "=1": {}}
    x, y = data(1024, dist.get_rank(), device)
    found = {}
    # torch's Reducer reads DDP_SET_LAST_BUCKET_CAP each time it rebuilds its buckets (Reducer::rebuild_buckets):
    # set on the last setting only, and unset for the others whatever the environment of the launch held
    inherited = os.environ.pop(LAST_BUCKET_CAP, None)
    try:
        for label, options in settings.items():
            if label == LAST_BUCKET_CAP + "=1":
                os.environ[LAST_BUCKET_CAP] = "1"
            model = large_layers().to(device)
            ddp = nn.parallel.DistributedDataParallel(model, process_group=group, **options)
            log = BucketLog(ddp, group, names_of(model))
            optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
            steps = []
            for _ in range(3):
                step(ddp, optimizer, x, y)
                steps.append([[e[2], e[3]] for e in log.take() if e[0] == "launch"])
            found[label] = steps
    finally:
        os.environ.pop(LAST_BUCKET_CAP, None)
        if inherited is not None:
            os.environ[LAST_BUCKET_CAP] = inherited
    return found


class Backwards(nn.Module):
    """Three layers registered a, b, c but run c, b, a: gradients arrive a first, c last."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (nn.Linear(256, 256, bias=False) for _ in range(3))

    def forward(self, x):
        return self.a(torch.relu(self.b(torch.relu(self.c(x)))))


def launch_order(device, group):
    """Events of step 2 (the loop keeps the last step's) with find_unused_parameters=True (buckets from
    registration order, never rebuilt: as in step 1) and with the defaults (buckets rebuilt in arrival order),
    one 256 KiB weight per bucket."""
    found = {}
    x, y = data(256, dist.get_rank(), device)
    for label, options in (("registration order", {"find_unused_parameters": True}), ("rebuilt", {})):
        torch.manual_seed(0)
        model = Backwards().to(device)
        ddp = nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.25, **options)
        log = BucketLog(ddp, group, names_of(model))
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
        for _ in range(2):
            step(ddp, optimizer, x, y)
            events = [[e[0], e[1]] for e in log.take()]
        found[label] = events
    return found


def in_flight(device, group, store):
    """Is rank 0's first all-reduce still running while its backward computes later gradients? Rank 1 holds its
    backward back at its first gradient until rank 0 has its last one: rank 0's first all-reduce cannot finish
    before then, so if rank 0's backward waited for it, it would never get there (the hold gives up after 20 s)."""
    model = large_layers().to(device)
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=4)
    names = names_of(model)
    log = BucketLog(ddp, group, names)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = data(1024, dist.get_rank(), device)
    for _ in range(2):  # after the rebuild: one layer per bucket
        step(ddp, optimizer, x, y)
    log.take()
    rank, seen = dist.get_rank(), {}

    def note(param):
        seen["grads"] = seen.get("grads", 0) + 1
        if rank == 0 and seen["grads"] == 6:  # rank 0's last gradient
            seen["first_done_at_last_grad"] = log.futures[0].done() if log.futures else None
            seen["launched_before_last_grad"] = len(log.futures)
            store.set("in_flight", "rank 0 has every gradient")
        if rank == 1 and seen["grads"] == 1:
            start = time.perf_counter()
            store.wait(["in_flight"], datetime.timedelta(seconds=20))
            seen["held_seconds"] = time.perf_counter() - start

    for param in model.parameters():  # tensor hooks run before DDP's, which are on the gradient's node
        param.register_post_accumulate_grad_hook(note)
    step(ddp, optimizer, x, y)
    seen["first_done_after_backward"] = log.futures[0].done() if log.futures else None
    return seen


def averaging_bits(device, group):
    """Step 1 of torch's DDP on `group` (3 ranks: 1/3 is not exact), next to three hand-made averages of the
    same local gradients: does DDP = (gradient x float32(1/N), then gloo's sum of the bucket laid out in
    registration order)? And does the layout alone, or summing first, change the last bits?"""
    model, reference = small_layers().to(device), small_layers().to(device)  # the same weights on every rank
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group)   # step 1: one bucket, registration order
    x, y = data(64, dist.get_rank(), device)
    F.mse_loss(ddp(x), y).backward()
    F.mse_loss(reference(x), y).backward()
    local = [p.grad for p in reference.parameters()]
    size = dist.get_world_size(group)

    def summed(tensor):
        dist.all_reduce(tensor, group=group)
        return tensor

    flat = torch.cat([g.reshape(-1) for g in local])
    torch_like = summed(flat * (1 / size))           # what reducer.cpp does: mul_out by 1/div_factor, then sum
    per_tensor = torch.cat([summed(g.reshape(-1) * (1 / size)) for g in local])  # the same scale, other layout
    sum_first = summed(flat.clone()) / size          # the hand-written versions: sum, then divide
    from_ddp = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return {"world_size": size, "elements": flat.numel(),
            "ddp_equals_scale_then_sum": bool(torch.equal(from_ddp, torch_like)),
            "differ_other_layout": int((per_tensor != from_ddp).sum()),
            "differ_sum_then_divide": int((sum_first != from_ddp).sum())}


def concurrent_all_reduces(device, group):
    """One profiled step of OverlappedDDP on the 40 small layers: on how many threads do gloo's all-reduces run,
    and how many run at the same time? (gloo gives each process group 2 worker threads by default.)"""
    wrapped = handwritten.OverlappedDDP(small_layers().to(device), process_group=group)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.01)
    x, y = data(64, dist.get_rank(), device)
    for _ in range(2):
        step(wrapped, optimizer, x, y)
    dist.barrier(group)
    runs = [(e.time_range.start, e.time_range.end, e.thread) for e in profiled(lambda: step(wrapped, optimizer, x, y), device)
            if e.name == "gloo:all_reduce"]
    # the most reductions running at one instant: +1 at each start, -1 at each end (ends first at a tie)
    edges = sorted([(start, 1) for start, _, _ in runs] + [(end, -1) for _, end, _ in runs])
    running, most = 0, 0
    for _, change in edges:
        running += change
        most = max(most, running)
    return {"reductions": len(runs), "threads": len({thread for _, _, thread in runs}), "most_at_once": most,
            # the group's own options: torch's constructor gives it 2 threads per gloo device
            "gloo_threads_option": group._get_backend(device).options._threads,
            "gloo_devices": len(group._get_backend(device).options._devices)}


# ----------------------------------------------------------------------------- 2. equal to torch's DDP
def equality(groups, rank, device):
    """max |ours - torch's DDP| over the weights after 3 steps, per variant and group size."""
    found = {}
    for size, group in groups.items():
        if rank >= size:
            continue
        for variant in VARIANTS[:3]:
            for cap in ([harness.ONE_BUCKET_MB, harness.MANY_BUCKETS_MB] if variant == "bucketed" else [None]):
                model, reference = harness.build(rank).to(device), harness.build(rank).to(device)
                ours, theirs = wrap(variant, model, group, cap), wrap("torch", reference, group, cap)
                optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, reference)]
                for i in range(3):
                    x, y = (t.to(device) for t in harness.batch(i, rank))
                    step(ours, optimizers[0], x, y)
                    step(theirs, optimizers[1], x, y)
                mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
                torch_ = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
                label = variant if variant != "bucketed" else f"bucketed {'one bucket' if cap is None else '256-byte buckets'}"
                found[f"{label} @ {size}"] = float((mine - torch_).abs().max())
    return found


def tied_hook_calls(device):
    """How often a weight used by two layers fires its post-accumulate-grad hook in one backward."""
    model = harness.build(0).to(device)
    calls = []
    model.hidden_a.weight.register_post_accumulate_grad_hook(lambda param: calls.append(param.grad.clone()))
    x, y = (t.to(device) for t in harness.batch(0, 0))
    F.mse_loss(model(x), y).backward()
    return {"calls": len(calls), "is_hidden_b": model.hidden_b.weight is model.hidden_a.weight,
            "hook_saw_final_grad": bool(torch.equal(calls[-1], model.hidden_a.weight.grad))}


# ----------------------------------------------------------------------------- 3-5. measurements on 2 ranks
def measure(rank, device, group):
    results = {"table": {}, "sweep": [], "compute": {}}
    for model_name, (build, width) in MODELS.items():
        x, y = data(width, rank, device)
        # compute alone: both ranks at once (they share the cores as in training), no communication
        model = build().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        step(model, optimizer, x, y)
        compute = timed(lambda: step(model, optimizer, x, y), TIMED_STEPS, device, group)
        forward = timed(lambda: model(x), TIMED_STEPS, device, group)
        update = timed(optimizer.step, TIMED_STEPS, device, group)
        results["compute"][model_name] = {"step": compute, "forward": forward, "optimizer": update,
                                          "tensors": len(list(model.parameters())),
                                          "bytes": sum(4 * p.numel() for p in model.parameters())}
        for variant in VARIANTS:
            wrapped = wrap(variant, build().to(device), group)
            optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.01)
            for _ in range(2):
                step(wrapped, optimizer, x, y)
            seconds = timed(lambda: step(wrapped, optimizer, x, y), TIMED_STEPS, device, group)
            calls, nbytes = traffic(variant, build, group, device, x, y)
            results["table"][f"{variant} | {model_name}"] = {"seconds": seconds, "calls": calls, "bytes": nbytes}
    x, y = data(64, rank, device)
    for cap in SWEEP_CAPS_MB:
        wrapped = wrap("bucketed", small_layers().to(device), group, cap)
        optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.01)
        for _ in range(2):
            step(wrapped, optimizer, x, y)
        samples = []
        seconds = timed(lambda: step(wrapped, optimizer, x, y), TIMED_STEPS, device, group, samples)
        results["sweep"].append({"cap_mb": cap, "buckets": len(wrapped.buckets), "seconds": seconds,
                                 "samples": samples})
    results["fit"] = allreduce_times(device, group)
    return results


def allreduce_times(device, group):
    """Median seconds of one all_reduce of each FIT_SIZES message on `group` (its ranks only)."""
    seconds = []
    for size in FIT_SIZES:
        tensor = torch.ones(size // 4, device=device)
        dist.all_reduce(tensor, group=group)
        repeats = 20 if size <= 2**20 else 5
        seconds.append(timed(lambda: dist.all_reduce(tensor, group=group), repeats, device, group))
    return {"sizes": FIT_SIZES, "seconds": seconds, "world_size": dist.get_world_size(group)}


def baselines(device):
    """One process on the whole batch (2 x BATCH): with the threads each rank has, then with the launcher's
    usable cores (this process's CPU affinity, capped by a container's CPU quota: no oversubscription there)."""
    found, threads = {}, torch.get_num_threads()
    cores = usable_cores()
    for model_name, (build, width) in MODELS.items():
        model = build().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = data(width, 0, device, batch=2 * BATCH)
        for label, count in (("same threads", threads), ("all cores", cores)):
            torch.set_num_threads(count)
            step(model, optimizer, x, y)
            found[f"{label} | {model_name}"] = timed(lambda: step(model, optimizer, x, y), TIMED_STEPS, device)
        torch.set_num_threads(threads)
    # what the launcher asked for (OMP_NUM_THREADS) and what torch uses: MKL lowers a request above the cores
    return found, {"threads_per_rank": threads, "threads_asked": os.environ.get("OMP_NUM_THREADS"), "cores": cores}


def main():
    # gloo on the CPU on every machine, a GPU box included: every assertion of notebook 06 is about gloo
    rank, world_size, device = init_distributed(backend="gloo")
    assert world_size == 3, "run it on 3 ranks: groups of 1, 2 and 3 are made from them"
    groups = {size: dist.new_group(list(range(size))) for size in (1, 2, 3)}
    pair = groups[2]

    # Every rank reports every name (None where it took no part): the notebook reads them per rank.
    store = dist.PrefixStore("demo06", dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                                     is_master=False))  # torchrun's store, for the hold
    report(buckets=bucket_steps(device, pair) if rank < 2 else None,
           order=launch_order(device, pair) if rank < 2 else None,
           in_flight=in_flight(device, pair, store) if rank < 2 else None)
    report(ddp=ddp_timeline(device, pair) if rank < 2 else None)
    report(equal=equality(groups, rank, device), tied_hook_calls=tied_hook_calls(device),
           averaging_bits=averaging_bits(device, groups[3]))
    dist.barrier()
    report(measured=measure(rank, device, pair) if rank < 2 else None)
    report(concurrent=concurrent_all_reduces(device, pair) if rank < 2 else None)
    report(fit_three=allreduce_times(device, groups[3]))  # the same sizes on 3 ranks: the model's N
    dist.barrier()  # ranks 1 and 2 wait here while rank 0 runs the one-process baselines
    found, threads = baselines(device) if rank == 0 else (None, None)
    report(baselines=found, threads=threads)
    dist.barrier()
    report(backend=dist.get_backend(), device=device.type)
    print(f"rank {rank}: done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
