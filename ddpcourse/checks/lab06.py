"""Checks for lab 06 (BucketedDDP): equal to torch's DDP, replicas identical, frozen parameters untouched,
buckets holding the parameters torch's DDP puts in each, one all-reduce per bucket per step on the process
group given, communication overlapping the backward, no_sync() accumulation.

One launch per world size: the lab's harness trains the course model (frozen layer, tied weight, BatchNorm)
with one bucket and with several, against torch's DDP on the same data. The evidence of communication comes
from the process groups themselves (each counts the collectives launched on it, by whatever route), noted as
each gradient becomes ready; the evidence of overlap from a collective that cannot finish before rank 0's last
gradient exists (the harness's hold_back). The expected buckets are computed here from the reported parameter
sizes and the cap, independently of the lab.
"""
import math

from ddpcourse.checks import ROUNDING, Check, KnownError, LabCheck, agree, changed_settings

NPROCS = (1, 2, 3)
CONFIG = {"steps": 3, "micro_batches": 3, "caps": [None, 256 / 2**20], "layout_caps": [None, 2.5],
          "hold_seconds": 5.0}
LABELS = {"one_bucket": "one bucket", "many_buckets": "256-byte buckets"}
DEFAULT_CAP_MB, FIRST_BUCKET_MB = 25.0, 1.0  # torch's DDP: bucket_cap_mb=None, dist._DEFAULT_FIRST_BUCKET_BYTES


def expected_buckets(layout, cap_mb):
    """Trainable parameters in reverse registration order, a bucket closed once it holds its cap, as torch's
    DDP's rebuilt buckets for a model that runs its layers in registration order: the first bucket's cap is
    1 MiB when cap_mb is None (the default: 25 MiB for the others), else cap_mb like every other bucket."""
    cap = (DEFAULT_CAP_MB if cap_mb is None else cap_mb) * 2**20
    caps = [FIRST_BUCKET_MB * 2**20 if cap_mb is None else cap, cap]
    buckets, size = [[]], 0
    for name, numel, element_size in reversed(layout["trainable"]):
        buckets[-1].append(name)
        size += numel * element_size
        if size >= caps[len(buckets) > 1]:
            buckets.append([])
            size = 0
    return [bucket for bucket in buckets if bucket]


def _cap_label(cap_mb):
    return "bucket_cap_mb=None (default)" if cap_mb is None else f"bucket_cap_mb={cap_mb:g}"


def _as_sets(buckets):
    return [sorted(bucket) for bucket in buckets]


def _layout_check(scenarios, layouts):
    """Which parameters the lab put in each bucket, bucket by bucket: against torch's rule (computed here) and
    against the buckets torch's DDP itself rebuilt for the same model (the order inside a bucket is free)."""
    problems = []
    cases = [(LABELS[name], s["layout"], s["cap_mb"], s["torch_buckets"]) for name, s in scenarios.items()]
    cases += [(f"3 x Linear(512, 512), {_cap_label(l['cap_mb'])}", l, l["cap_mb"], None) for l in layouts]
    for label, layout, cap_mb, torch_buckets in cases:
        expected = expected_buckets(layout, cap_mb)
        if _as_sets(layout["buckets"]) != _as_sets(expected):
            problems.append(f"{label}: buckets {layout['buckets']}, expected {expected} (reverse registration "
                            f"order; the first bucket closes at 1 MiB only when bucket_cap_mb is None)")
        elif torch_buckets is not None and _as_sets(layout["buckets"]) != _as_sets(torch_buckets):
            problems.append(f"{label}: buckets {layout['buckets']}, torch's DDP rebuilt {torch_buckets}")
    return Check("buckets hold the parameters torch's DDP puts in each (its rule, and its own rebuilt buckets)",
                 not problems, "\n      ".join(problems[:2]))


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


def _calls_check(scenarios):
    """Collectives launched on the given group between the forward and the end of the finish, per step."""
    problems, counts = [], []
    for name, scenario in scenarios.items():
        buckets = len(expected_buckets(scenario["layout"], scenario["cap_mb"]))
        counts.append(f"{buckets} with {LABELS[name]}")
        for step, events in enumerate(scenario["events"], start=1):
            on_group, on_default = (end - start for end, start in zip(events["finished"], events["start"]))
            if on_default:
                problems.append(f"{LABELS[name]}, step {step}: {on_default} collectives on the default group and "
                                f"{on_group} on the process_group the wrapper was given: reduce over "
                                f"self.process_group (group=...)")
            elif on_group != buckets:
                problems.append(f"{LABELS[name]}, step {step}: {on_group} all_reduce calls, expected one per "
                                f"bucket: {buckets}" + (" (did you all-reduce each gradient on its own?)"
                                                         if on_group > buckets else ""))
            if problems:
                break
    return Check(f"one all_reduce per bucket per step, on the process group given ({', '.join(counts)})",
                 not problems, "\n      ".join(problems[:2]))


def _launch_profile(scenario):
    """(gradient, launched by then, expected by then) as each gradient became ready: a bucket is expected to
    be launched from the hook of its last gradient, so the next gradient's note counts it."""
    bucket_names = expected_buckets(scenario["layout"], scenario["cap_mb"])
    profile = []
    for events in scenario["events"]:
        start, seen, rows = events["start"][0], set(), []
        for name, on_group, _ in events["grads"]:
            complete = sum(all(n in seen for n in bucket) for bucket in bucket_names)
            rows.append((name, on_group - start, complete))
            seen.add(name)
        rows.append(("the end of backward()", events["backward returned"][0] - start, len(bucket_names)))
        profile.append(rows)
    return profile


def _overlap_check(scenario, holds, world):
    """Each bucket launched from the hook of its last gradient; on 2 or more ranks, the first bucket's all-reduce
    (which cannot finish before the other ranks join it) still in flight when rank 0's last gradient exists."""
    problems = []
    for step, rows in enumerate(_launch_profile(scenario), start=1):
        if rows[-2][1] == 0:  # nothing launched before the last gradient
            problems.append(f"step {step}: every all_reduce started after the backward had produced its last "
                            f"gradient: launch a bucket from the hook as soon as its last gradient is ready")
            break
        wrong = [(name, launched, expected) for name, launched, expected in rows if launched != expected]
        if wrong:
            name, launched, expected = wrong[0]
            problems.append(f"step {step}: when {name} was ready, {launched} all_reduce calls had been launched, "
                            f"expected {expected} (the buckets complete by then): launch each bucket in the hook "
                            f"of its last gradient, once")
            break
    held = {outcome for outcomes in holds[1:] for outcome in outcomes}
    if world > 1 and held != {"released"}:
        problems.append(f"rank 0 never produced its last gradient while its first bucket's all_reduce was waiting "
                        f"for the other ranks (they held back {CONFIG['hold_seconds']:g} s): the backward waited for "
                        f"an all_reduce: waiting inside the hook (.wait(), get_future(), async_op=False, a barrier) "
                        f"leaves no overlap; keep the work and wait in finish_gradient_synchronization()")
    buckets = len(expected_buckets(scenario["layout"], scenario["cap_mb"]))
    if world == 1:  # an all_reduce over one rank has no one to wait for: nothing is there to overlap
        return Check(f"buckets launched from the backward's hooks ({buckets} buckets, each when its last gradient is "
                     f"ready; on 1 rank no communication to overlap)", not problems, "\n      ".join(problems))
    return Check(f"communication overlaps the backward ({buckets} buckets, each launched when its last gradient "
                 f"is ready; an all_reduce still in flight at rank 0's last gradient)", not problems,
                 "\n      ".join(problems))


# A crash whose message does not name the mistake: the likely mistakes, first match wins.
KNOWN_ERRORS = (
    KnownError(r"^AttributeError: 'NoneType' object has no attribute 'wait'",
               "a bucket had no work to wait for. Either it was never launched: its count of pending gradients "
               "never reached 0 (is a parameter counted twice, or in two buckets? A weight shared by two layers "
               "(tied) is one tensor with one gradient: model.parameters() lists it once; walking the layers lists "
               "it twice); or its all_reduce ran without async_op=True, which blocks and returns None"),
    KnownError(r"^AttributeError: 'NoneType' object has no attribute|^TypeError: expected Tensor as element.*but got "
               r"NoneType$",
               "a gradient was still None when its bucket was flattened: the bucket was launched before all its "
               "gradients were ready; launch it when its count of pending gradients reaches 0"),
)


def checks(run):
    world = run.nproc
    changed = changed_settings(run, CONFIG)
    if changed:
        return changed
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

    found.append(_layout_check(scenarios, run.values("layouts")[0]))
    found.append(_calls_check(scenarios))
    found.append(_overlap_check(scenarios["many_buckets"], run.values("holds"), world))

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


LAB_CHECK = LabCheck(judge=checks, nprocs=NPROCS, known_errors=KNOWN_ERRORS)
