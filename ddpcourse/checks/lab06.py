"""Checks for lab 06 (BucketedDDP): equal to torch's DDP, replicas identical, frozen parameters untouched,
one all-reduce per bucket per step, communication overlapping the backward, no_sync() accumulation.

One launch per world size: the lab's harness trains the course model (frozen layer, tied weight, BatchNorm)
with one bucket and with several, against torch's DDP on the same data, and logs in order when each
gradient is ready and when each all-reduce starts and ends. The expected buckets are computed here from
the reported parameter sizes and the cap, independently of the lab.
"""
import math

from ddpcourse.checks import ROUNDING, Check, agree
from ddpcourse.diagnosis import EXCEPTION_KIND

NPROCS = (1, 2, 3)
CONFIG = {"steps": 3, "micro_batches": 3, "caps": [25.0, 256 / 2**20]}
LABELS = {"one_bucket": "one bucket", "many_buckets": "256-byte buckets"}


def expected_buckets(layout, cap_mb, first_cap_mb=1.0):
    """Trainable parameters in reverse registration order, a bucket closed once it holds its cap (the
    first one's is at most 1 MiB), as torch's DDP assigns them."""
    caps = [min(first_cap_mb, cap_mb) * 2**20, cap_mb * 2**20]
    buckets, size = [[]], 0
    for name, numel, element_size in reversed(layout["trainable"]):
        buckets[-1].append(name)
        size += numel * element_size
        if size >= caps[len(buckets) > 1]:
            buckets.append([])
            size = 0
    return [bucket for bucket in buckets if bucket]


def _shared_with(layout):
    """'hidden_a.weight (shared with hidden_b.weight)': the tied weight, for messages."""
    return ", ".join(f"{name} (shared with {', '.join(others)})" for name, others in layout["tied"].items())


def _slices(pairs):
    out, offset = {}, 0
    for name, size in pairs:
        out[name] = (offset, offset + size)
        offset += size
    return out


def _gradient_diagnosis(scenario, world):
    """Why the first step's gradients differ from torch's: per parameter, ours / torch's."""
    grads = scenario["first_grads"]
    slices = _slices([(n, size) for n, size, _ in scenario["layout"]["trainable"]])
    ratios = {}
    for name, (a, b) in slices.items():
        ours, theirs = grads["ours"][a:b], grads["torch"][a:b]
        norm = sum(t * t for t in theirs)
        if agree(ours, theirs, ROUNDING):  # torch's DDP divides before summing, the lab after
            continue
        ratios[name] = sum(o * t for o, t in zip(ours, theirs)) / norm if norm else math.inf
    if not ratios:
        return ""
    names = ", ".join(ratios)
    if world > 1 and all(abs(r - world) < 1e-3 * world for r in ratios.values()):
        return (f"the gradients of {names} are {world}x torch's: the SUM over ranks; divide each bucket by the "
                f"world size after its all-reduce")
    if world > 1 and all(abs(r - 1 / world) < 1e-3 for r in ratios.values()):
        return f"the gradients of {names} are 1/{world} of torch's: divided by the world size twice"
    tied = list(scenario["layout"]["tied"])
    if list(ratios) == tied:
        return (f"only the gradient of {_shared_with(scenario['layout'])} is wrong ({ratios[tied[0]]:.3g}x torch's): "
                f"a parameter shared by two layers has one gradient, reduced once (model.parameters() lists it once)")
    return f"the gradients of {names} differ from torch's (ours / torch's: " + ", ".join(
        f"{r:.3g}" for r in ratios.values()) + ")"


def _equality_check(name, scenario, world):
    state = _slices(scenario["layout"]["state"])
    off = [n for n, (a, b) in state.items() if not agree(scenario["ours"][a:b], scenario["torch"][a:b], ROUNDING)]
    detail = ""
    if off:
        why = _gradient_diagnosis(scenario, world)
        detail = f"after {CONFIG['steps']} steps {', '.join(off)} differ from torch's DDP" + (f": {why}" if why else "")
    return Check(f"weights and buffers equal torch's DDP after {CONFIG['steps']} steps ({LABELS[name]})",
                 not off, detail)


def _steps_calls(scenario):
    return [[e for e in step if e[0] == "launch"] for step in scenario["events"]]


def _calls_check(scenarios):
    problems, counts = [], []
    for name, scenario in scenarios.items():
        layout = scenario["layout"]
        buckets = len(expected_buckets(layout, scenario["cap_mb"]))
        elements = sum(numel for _, numel, _ in layout["trainable"])
        counts.append(f"{buckets} with {LABELS[name]}")
        for step, launches in enumerate(_steps_calls(scenario), start=1):
            sent = sum(e[2] for e in launches)
            if sent > elements:
                problems.append(f"{LABELS[name]}, step {step}: {sent} gradient elements all-reduced, the model has "
                                f"{elements} trainable: some are reduced twice ({_shared_with(layout)} is tied: "
                                f"register its hook and give it a bucket slot once)")
            elif len(launches) != buckets:
                problems.append(f"{LABELS[name]}, step {step}: {len(launches)} all_reduce calls, expected one per "
                                f"bucket: {buckets}" + (" (did you all-reduce each gradient on its own?)"
                                                         if len(launches) > buckets else ""))
            if problems:
                break
    return Check(f"one all_reduce per bucket per step ({', '.join(counts)})", not problems,
                 "\n      ".join(problems[:2]))


def _overlap_check(scenario):
    """Some bucket's all-reduce started before the last gradient of the backward and was still running then."""
    problems = []
    for step, events in enumerate(scenario["events"], start=1):
        grads = [i for i, e in enumerate(events) if e[0] == "grad"]
        launches = {e[1]: i for i, e in enumerate(events) if e[0] == "launch"}
        done = {}
        for i, e in enumerate(events):
            if e[0] == "done":
                done.setdefault(e[1], i)  # the first wait ends it (a second wait is a no-op)
        if not grads or not launches:
            problems.append(f"step {step}: no all_reduce was logged while training")
            break
        last_grad = grads[-1]
        early = [c for c, i in launches.items() if i < last_grad]
        if not early:
            problems.append(f"step {step}: every all_reduce started after the backward had produced its last "
                            f"gradient: launch a bucket from the hook as soon as its last gradient is ready")
            break
        in_flight = [c for c in early if done.get(c, len(events)) > last_grad]
        if not in_flight:
            problems.append(f"step {step}: all_reduce calls started during the backward but each ended before the "
                            f"next gradient: waiting inside the hook (.wait() or async_op=False) leaves no overlap; "
                            f"keep the work and wait in finish_gradient_synchronization()")
            break
    buckets = len(expected_buckets(scenario["layout"], scenario["cap_mb"]))
    return Check(f"communication overlaps the backward ({buckets} buckets: an all_reduce in flight before the "
                 f"last gradient)", not problems, "\n      ".join(problems))


def explain_failure(run):
    failure = run.failure
    if failure is None or failure.kind != EXCEPTION_KIND:
        return ""
    error = failure.error  # "Type: first line" of the root-cause rank's exception
    if error.startswith("AttributeError: 'NoneType' object has no attribute 'wait'"):
        return ("a bucket was never all-reduced: its count of pending gradients never reached 0. Is a parameter "
                "counted twice, or in two buckets? A weight shared by two layers (tied) is one tensor with one "
                "gradient: model.parameters() lists it once; walking the layers lists it twice")
    if error.startswith("AttributeError: 'NoneType' object has no attribute"):
        return ("a gradient was still None when its bucket was flattened: the bucket was launched before all its "
                "gradients were ready; launch it when its count of pending gradients reaches 0")
    return ""


def checks(run):
    world = run.nproc
    config = run.values("config")[0]
    if config != CONFIG:
        return [Check("the lab keeps its harness settings", False,
                      f"the lab reports {config}, expected {CONFIG}: keep the part below the class as it is")]
    per_rank = run.values("scenarios")
    scenarios = per_rank[0]
    found = []

    start = [r for r in range(1, world) for name in scenarios
             if per_rank[r][name]["after_wrap"] != scenarios[name]["after_wrap"]]
    found.append(Check("the constructor gives every rank rank 0's weights and buffers", not start,
                       f"right after BucketedDDP(...) ranks {sorted(set(start))} differ from rank 0 (each rank "
                       f"built its model from another seed): broadcast every parameter and buffer from rank 0"
                       if start else ""))

    for name, scenario in scenarios.items():
        found.append(_equality_check(name, scenario, world))

    problems = []
    for name in scenarios:
        # parameters only: like torch's DDP, the buffers are rank 0's at the start of each forward and then
        # updated by each rank's own batch
        layout = scenarios[name]["layout"]
        size = sum(n for _, n in layout["state"][:len(layout["trainable"]) + len(layout["frozen"])])
        differ = [r for r in range(1, world) if per_rank[r][name]["ours"][:size] != scenarios[name]["ours"][:size]]
        if differ:
            problems.append(f"{LABELS[name]}: after {CONFIG['steps']} steps the parameters of ranks {differ} differ "
                            f"from rank 0's")
        if not all(per_rank[r][name]["frozen_grad_is_none"] for r in range(world)):
            problems.append(f"{LABELS[name]}: the frozen layer got a .grad: skip parameters with requires_grad=False")
        if not all(per_rank[r][name]["frozen_unchanged"] for r in range(world)):
            problems.append(f"{LABELS[name]}: the frozen layer changed during training")
    found.append(Check("parameters identical on every rank; the frozen layer unchanged, with no gradient",
                       not problems, "\n      ".join(problems)))

    found.append(_calls_check(scenarios))
    found.append(_overlap_check(scenarios["many_buckets"]))

    accumulations = run.values("accumulation")
    accumulation = accumulations[0]
    problems = []
    if any(a["calls_inside_no_sync"] for a in accumulations):
        problems.append(f"{accumulation['calls_inside_no_sync']} all_reduce calls inside no_sync(): the hook must "
                        f"not launch there")
    if not all(agree(a["ours"], a["large_batch"], ROUNDING) for a in accumulations):
        diff = max(abs(x - y) for a in accumulations for x, y in zip(a["ours"], a["large_batch"]))
        problems.append(f"after {CONFIG['micro_batches']} micro-batches (all but the last in no_sync()) the weights "
                        f"differ from one step on the whole batch by up to {diff:.3g}")
    found.append(Check(f"no_sync() accumulates; the next step equals one step on the large batch "
                       f"({CONFIG['micro_batches']} micro-batches x {world} ranks)", not problems,
                       "\n      ".join(problems)))
    return found
