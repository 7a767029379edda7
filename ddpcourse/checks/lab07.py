"""Checks for lab 07 (ShardedOptimizer, FSDP): equal to one process on the whole batch and to torch's
ZeroRedundancyOptimizer and fully_shard; each rank's optimizer holding and stepping only its own parameters;
the full parameters freed after each unit's forward; two all-gathers and one reduce-scatter per unit per step.

One launch per world size. Which parameters a rank owns, how large its shards and its optimizer state must
be, and which collectives a step needs are computed here from the sizes the lab reports (the model's own
structure, not the lab's bookkeeping). The evidence comes from outside the classes: an optimizer subclass that
records what it was given and what its step changed, the bytes of every live tensor storage after each unit's
forward, and the collectives the dispatcher saw in one step.
"""
import math

from ddpcourse.checks import Check, KnownError, LabCheck, changed_settings

NPROCS = (1, 2, 3)
CONFIG = {"steps": 3, "batch_size": 16, "width": 512, "seed": 7, "memory_step": 1, "collectives_step": 2}
# max |difference| allowed in the final weights, by what is compared
SAME_ARITHMETIC = 1e-6   # the same operations in the same order (ZeroRedundancyOptimizer): the last bits at most
FP32_ROUNDING = 1e-5     # fp32 sums in another order (per-rank means averaged vs one mean): ~1e-8 seen
# Adam steps each element by about lr * sign(g) wherever |g| >> eps: where a gradient is near zero, the order of
# the sums can decide its sign, and rounding becomes a whole step of lr (1e-3) in either direction. So against one
# process: 2 x lr x 3 steps (1.3e-3 seen with ATEN_CPU_CAPABILITY=default); ZeroRedundancyOptimizer, which gets the
# same all-reduced gradients, stays within SAME_ARITHMETIC.
ADAM_ROUNDING = 6e-3
BF16_VS_FP32 = 5e-3      # bf16 compute (8-bit mantissa) vs fp32 after 3 steps: ~1.6e-3 seen on 1 rank
BF16_VS_TORCH = 1e-3     # bf16 reductions summed in another order than fully_shard's: ~1.3e-4 seen on 3 ranks
BIG_UNIT = 256 * 1024    # bytes: a unit whose full copy dwarfs the activations of one forward
ITEMSIZE = {"fp32": 4, "bf16": 2}
OPTIMIZER_LABELS = {"sgd": "SGD with momentum", "adam": "Adam"}


def greedy_partition(sizes, world):
    """Owner of each size: the largest first, to the least-loaded rank, ties to the lower rank."""
    load, owners = [0] * world, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owners[i] = rank
        load[rank] += sizes[i]
    return owners


def padded(numel, world):
    return math.ceil(numel / world) * world


def _worst(diffs):
    name = max(diffs, key=diffs.get)
    return diffs[name], name


def _partition_check(partitions):
    wrong = [f"partition({sizes}, {world}) = {got}, expected {greedy_partition(sizes, world)}"
             for sizes, world, got in partitions if got != greedy_partition(sizes, world)]
    return Check("partition(): largest parameter first, to the least-loaded rank (ties to the lower rank)",
                 not wrong, "; ".join(wrong[:2]))


def _optimizer_checks(per_rank, sizes, trainable, world):
    names = [name for name, _ in sizes]
    owners = dict(zip(names, greedy_partition([numel for _, numel in sizes], world)))
    numel = dict(sizes)
    found = []
    for label, title in OPTIMIZER_LABELS.items():
        cases = [rank_cases[label] for rank_cases in per_rank]
        case = cases[0]
        tol = ADAM_ROUNDING if label == "adam" else FP32_ROUNDING
        problems = []
        stale = {r: sorted(n for n in trainable if owners[n] != r and n not in cases[r]["changed"])
                 for r in range(world)}
        stale = {r: names_ for r, names_ in stale.items() if names_}
        differ = [r for r in range(1, world) if cases[r]["digests"] != case["digests"]]
        if stale:
            r, names_ = next(iter(stale.items()))
            problems.append(f"on rank {r} the parameters other ranks own never changed ({', '.join(names_[:3])}): "
                            f"forgot to send the updated parameters: broadcast each one from its owner after the "
                            f"step (group_src=owner)")
        elif differ:
            problems.append(f"after 3 steps the parameters of ranks {differ} differ from rank 0's: every rank must "
                            f"end the step with its owner's values")
        worst = max(max(c["vs_one_process"].values()) for c in cases)
        if worst > tol:
            diff, name = _worst(case["vs_one_process"])
            problems.append(f"max |ours - one process on the whole batch| {worst:.3g} (rank 0: {name}, {diff:.3g}), "
                            f"allowed {tol:g}")
        worst_zero = max(max(c["vs_zero"].values()) for c in cases)
        if worst_zero > SAME_ARITHMETIC:
            problems.append(f"max |ours - ZeroRedundancyOptimizer| {worst_zero:.3g}, allowed {SAME_ARITHMETIC:g}")
        found.append(Check(f"ShardedOptimizer ({title}, two param groups) equals one process and "
                           f"ZeroRedundancyOptimizer after 3 steps; every rank ends with the same parameters",
                           not problems, "\n      ".join(problems[:2])))

        problems = []
        expected = {r: sorted(n for n in names if owners[n] == r) for r in range(world)}
        everything = [r for r in range(world) if len(cases[r]["held"]) == len(names)] if world > 1 else []
        if everything:
            problems.append(f"the optimizers of ranks {everything} were given all {len(names)} parameters and stepped "
                            f"{len(cases[everything[0]]['stepped'])}: every rank steps everything; build each rank's "
                            f"optimizer over the parameters it owns only (self.owner[id(p)] == self.rank)")
        else:
            wrong = [r for r in range(world) if cases[r]["held"] != expected[r]]
            if wrong:
                r = wrong[0]
                problems.append(f"rank {r}'s optimizer was given {cases[r]['held']}, expected {expected[r]} "
                                f"(partition() over all parameters, every group)")
            foreign = {r: sorted(set(cases[r]["stepped"]) - set(expected[r])) for r in range(world)}
            foreign = {r: n for r, n in foreign.items() if n}
            if foreign:
                r, names_ = next(iter(foreign.items()))
                problems.append(f"rank {r}'s optimizer changed {names_}, which rank {owners[names_[0]]} owns")
        stepped = set().union(*(c["stepped"] for c in cases))
        missing = sorted(set(trainable) - stepped)
        if missing and not problems:
            problems.append(f"no rank's optimizer changed {missing}: each trainable parameter must be stepped by "
                            f"its owner")
        per_param = 4 if label == "sgd" else 8  # momentum buffer; Adam's two moments (+ a 4-byte step count)
        state = [sum(per_param * numel[n] + (4 if label == "adam" else 0) for n in expected[r] if n in trainable)
                 for r in range(world)]
        got = [c["state_bytes"] for c in cases]
        if got != state and not problems:
            problems.append(f"optimizer state bytes per rank {got}, expected {state} (only the owned trainable "
                            f"parameters' state)")
        found.append(Check(f"ShardedOptimizer ({title}): each rank's optimizer holds and steps only the parameters "
                           f"it owns; state bytes per rank {state}", not problems, "\n      ".join(problems[:2])))
    return found


def _gradient_diagnosis(ratios, world):
    """From <ours, ref> / <ref, ref> of the first step's gradients: sum, double division, or neither."""
    values = list(ratios.values())
    if not values:
        return "no shard had a gradient after the first backward: reduce-scatter each unit's gradient"
    if world > 1 and all(abs(r - world) < 1e-2 * world for r in values):
        return (f"the shards' gradients are {world}x the mean: the SUM over ranks; reduce with "
                f"op=dist.ReduceOp.AVG (or divide by the world size)")
    if world > 1 and all(abs(r - 1 / world) < 1e-2 for r in values):
        return f"the shards' gradients are 1/{world} of the mean: divided by the world size twice"
    off = {n: r for n, r in ratios.items() if abs(r - 1) > 1e-3}
    if off:
        return ("the shards' gradients are not the mean over ranks (ours / expected: "
                + ", ".join(f"{n} {r:.3g}" for n, r in list(off.items())[:3])
                + "): gradients not reduce-scattered? Each rank needs its slice of the mean of every rank's gradient")
    return ""


def _fsdp_equality_checks(cases, world):
    found = []
    fp32, bf16 = (cases[0][label] for label in ("fp32", "bf16"))
    problems = []
    worst = max(max(c["fp32"]["vs_one_process"].values()) for c in cases)
    worst_torch = max(max(c["fp32"]["vs_fully_shard"].values()) for c in cases)
    if worst > FP32_ROUNDING or worst_torch > FP32_ROUNDING:
        diff, name = _worst(fp32["vs_one_process"])
        problems.append(f"after 3 steps max |ours - one process| {worst:.3g} (rank 0: {name}), max |ours - "
                        f"fully_shard| {worst_torch:.3g}, allowed {FP32_ROUNDING:g}")
        why = _gradient_diagnosis(fp32["grad_ratios"], world)
        if why:
            problems.append(why)
    if any(c["fp32"]["frozen_moved"] for c in cases):
        problems.append("the frozen unit changed: its shard must have requires_grad=False and get no gradient")
    found.append(Check("FSDP (fp32) equals one process on the whole batch and fully_shard after 3 steps; the "
                       "frozen unit unchanged", not problems, "\n      ".join(problems[:3])))

    problems = []
    dtypes = sorted({d for c in cases for d in c["bf16"]["shard_dtypes"]})
    exact = max(c["bf16"]["bf16_exact_fraction"] for c in cases)
    if dtypes != ["torch.float32"] or exact > 0.5:
        problems.append(f"fsdp.parameters() are {', '.join(dtypes)} and {exact:.0%} of the trained weights are "
                        f"exact bf16 values: mixed precision master weights lost (shards in bf16); keep the shards "
                        f"in fp32 and cast only the gathered copy to compute_dtype")
    worst = max(max(c["bf16"]["vs_one_process"].values()) for c in cases)
    worst_torch = max(max(c["bf16"]["vs_fully_shard"].values()) for c in cases)
    if worst > BF16_VS_FP32:
        problems.append(f"max |ours in bf16 - one process in fp32| {worst:.3g}, allowed {BF16_VS_FP32:g}")
    if worst_torch > BF16_VS_TORCH:
        problems.append(f"max |ours - fully_shard with MixedPrecisionPolicy(param_dtype=torch.bfloat16)| "
                        f"{worst_torch:.3g}, allowed {BF16_VS_TORCH:g}")
    found.append(Check(f"FSDP (compute_dtype=torch.bfloat16): fp32 master shards; within {BF16_VS_FP32:g} of one "
                       f"process in fp32 and {BF16_VS_TORCH:g} of fully_shard in bf16", not problems,
                       "\n      ".join(problems[:2])))
    return found


def _shard_check(cases, units, world):
    expected = [[padded(u["numel"], world) // world, u["trainable"]] for u in units]
    problems = []
    for r, case in enumerate(cases):
        got = case["fp32"]["parameters"]
        if got != expected:
            problems.append(f"rank {r}: fsdp.parameters() are [numel, requires_grad] {got}, expected {expected} "
                            f"(each unit padded to a multiple of {world}, one equal shard per rank)")
            break
    shard_bytes = sum(4 * n for n, _ in expected)
    return Check(f"each rank holds one equal shard per unit ({shard_bytes} bytes of fp32 parameters per rank, "
                 f"{sum(4 * u['numel'] for u in units)} in the model); frozen shards without requires_grad",
                 not problems, "\n      ".join(problems))


def _memory_check(cases, units, world):
    """After each unit's forward the live tensors may hold the next unit's prefetched copy (and the shard it was
    gathered from), never this unit's full copy: a kept copy adds its whole size."""
    problems = []
    for label in ("fp32", "bf16"):
        full = [padded(u["numel"], world) * ITEMSIZE[label] for u in units]
        for r, case in enumerate(cases):
            memory = case[label]["memory"]
            added = memory["after_forward"] - memory["before_forward"]
            if added > sum(full) / 2:
                problems.append(f"{label}, rank {r}: the live tensors grew by {added} bytes during the forward; the "
                                f"units' full copies are {sum(full)} bytes: full parameters kept after forward; free "
                                f"each unit's full copy right after its forward (resize its storage to 0: autograd's "
                                f"saved views share it)")
                break
            for k, (name, live) in enumerate(memory["after_unit"]):
                nxt = full[k + 1] * (1 + world) // world if k + 1 < len(units) else 0  # prefetch and its source
                if full[k] >= BIG_UNIT and live - memory["before_forward"] > nxt + full[k] / 2:
                    problems.append(f"{label}, rank {r}: after the forward of {name} the live tensors had grown by "
                                    f"{live - memory['before_forward']} bytes, its full copy is {full[k]}: full "
                                    f"parameters kept after forward")
                    break
            if problems:
                break
    added = [c["fp32"]["memory"]["after_forward"] - c["fp32"]["memory"]["before_forward"] for c in cases]
    full = sum(padded(u["numel"], world) * 4 for u in units)
    return Check(f"each unit's full copy freed after its forward (live tensor bytes after the forward: +{max(added)}; "
                 f"kept full copies would add {full})", not problems, "\n      ".join(problems[:2]))


def _collectives_check(cases, units, world):
    problems = []
    for label in ("fp32", "bf16"):
        size = ITEMSIZE[label]
        expected = {"all_gather": sorted(padded(u["numel"], world) * size for u in units for _ in range(2)),
                    "reduce_scatter": sorted(padded(u["numel"], world) * size for u in units if u["trainable"])}
        for r, case in enumerate(cases):
            seen = case[label]["collectives"]
            calls = {"all_gather": sorted(b for n, b in seen["calls"] if "allgather" in n),
                     "reduce_scatter": sorted(b for n, b in seen["calls"] if "reduce_scatter" in n)}
            others = sorted({n for n, _ in seen["calls"]} - {"_allgather_base_", "_reduce_scatter_base_"})
            if seen["on_default"]:
                problems.append(f"{label}, rank {r}: {seen['on_default']} collectives on the default group: use the "
                                f"process_group FSDP was given (group=self.process_group)")
            elif calls == expected:
                continue
            elif not calls["reduce_scatter"] and expected["reduce_scatter"]:
                problems.append(f"{label}, rank {r}: no reduce_scatter in a step ({', '.join(others) or 'nothing'} "
                                f"instead): gradients not reduce-scattered; each rank needs only its shard's slice "
                                f"of the mean gradient: dist.reduce_scatter_single")
            elif len(calls["all_gather"]) < len(expected["all_gather"]):
                problems.append(f"{label}, rank {r}: {len(calls['all_gather'])} all-gathers in a step, expected "
                                f"{len(expected['all_gather'])} (2 per unit): a unit must be gathered again before its "
                                f"backward; was its full copy kept after the forward?")
            else:
                problems.append(f"{label}, rank {r}: all-gather bytes {calls['all_gather']}, reduce-scatter bytes "
                                f"{calls['reduce_scatter']}; expected {expected['all_gather']} and "
                                f"{expected['reduce_scatter']} (the padded flat size of each unit)")
            break
    counts = f"{2 * len(units)} all-gathers, {sum(u['trainable'] for u in units)} reduce-scatters"
    return Check(f"collectives per step: two all-gathers of each unit's full flat size and one reduce-scatter per "
                 f"trainable unit ({counts}), on the process group given", not problems, "\n      ".join(problems[:2]))


# A crash whose message does not name the mistake: the likely mistakes, first match wins.
KNOWN_ERRORS = (
    KnownError(r"split_with_sizes expects split_sizes|must be equal to world_size times|is invalid for input of size",
               "a unit's flat parameter does not split into its parameters plus padding: padding wrong; pad each "
               "flat parameter up to a multiple of the world size (math.ceil(total / world_size) * world_size) so "
               "that every rank's shard has the same size"),
    KnownError(r"attempting to assign a gradient of size|assigned grad has data of a different size",
               "a shard's .grad got the whole unit's gradient: all_reduce leaves every rank the full gradient; "
               "reduce-scatter it (dist.reduce_scatter_single) so each rank receives only its shard's slice"),
    KnownError(r"modified by an inplace operation",
               "the full copy was written in place after the forward had saved views of it: write the all-gather "
               "through unit.buffer (its own version counter), never through unit.full"),
    KnownError(r"storage of size 0|out of bounds for storage",
               "a layer read a unit's parameters while the full copy was freed: gather (and wait) before the "
               "forward and before the backward, free only after"),
    KnownError(r"optimizer got an empty parameter list",
               "a rank that owns no parameters must build no optimizer (more ranks than parameters)"),
)


def checks(run):
    world = run.nproc
    changed = changed_settings(run, CONFIG)
    if changed:
        return changed
    units, sizes, trainable = run.values("units")[0], run.values("sizes")[0], run.values("trainable")[0]
    fsdp = run.values("fsdp")
    found = [_partition_check(run.values("partitions")[0])]
    found += _optimizer_checks(run.values("optimizer"), sizes, trainable, world)
    found += _fsdp_equality_checks(fsdp, world)
    found.append(_shard_check(fsdp, units, world))
    found.append(_memory_check(fsdp, units, world))
    found.append(_collectives_check(fsdp, units, world))
    refused = run.values("tied_refused")[0]
    found.append(Check("FSDP refuses a weight tied between two units, saying why", "tied" in refused,
                       "FSDP(...) accepted a weight shared by two children: each unit would keep its own copy "
                       "and the two would drift apart" if "tied" not in refused else ""))
    return found


LAB_CHECK = LabCheck(judge=checks, nprocs=NPROCS, known_errors=KNOWN_ERRORS)
