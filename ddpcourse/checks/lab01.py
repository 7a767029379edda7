"""Checks for lab 01 (data parallel by hand, then DDP): shards, averaged gradients, weights, replicas.

The reference is computed here, independently of the lab: one process training the same model on the
whole global batch (world_size * B samples per step). When the gradients are wrong, the check works out
which mistake produced them from the gradients each rank would have on its own block.
"""
import torch
import torch.nn.functional as F

from ddpcourse.checks import ROUNDING, Check, LabCheck, agree, replica_differences
from ddpcourse.toy import build_model, make_dataset

NPROCS = (1, 2, 3)


def _gradients(seed, x, y):
    model = build_model(seed)
    F.mse_loss(model(x), y).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def _baseline(config, world, x_all, y_all):
    """One process, global batch world * B: the first step's gradients and the final weights."""
    batch = world * config["per_rank_batch"]
    model = build_model(config["seed"])
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    for step in range(config["steps"]):
        x, y = x_all[step * batch:(step + 1) * batch], y_all[step * batch:(step + 1) * batch]
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        if step == 0:
            first_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        optimizer.step()
    return first_grads, {name: p.detach().clone() for name, p in model.named_parameters()}


def _close(got, expected):
    return agree(got, expected, ROUNDING)  # float32: the per-rank means and the full-batch mean round differently


def _max_diff(got, expected):
    return float((torch.as_tensor(got, dtype=expected.dtype) - expected).abs().max())


def _names(names):
    return ", ".join(names)


def _diagnose_gradients(rank, world, got, expected, locals_, shards_ok):
    """Why rank `rank`'s averaged gradients are wrong, per parameter, in the words of the mistake."""
    mean = {n: sum(local[n] for local in locals_) / world for n in expected}
    kinds = {}
    for name in expected:
        if _close(got[name], expected[name]):
            kinds[name] = "right"
        elif _close(got[name], mean[name]):
            kinds[name] = "mean of the wrong samples"
        elif world > 1 and _close(got[name], mean[name] * world):
            kinds[name] = "summed"
        elif world > 1 and _close(got[name], mean[name] / world):
            kinds[name] = "divided twice"
        elif world > 1 and (_close(got[name], locals_[rank][name])
                            or _close(got[name], locals_[rank][name] / world)):  # divided, never reduced
            kinds[name] = "own"
        else:
            kinds[name] = "other"
    by_kind = {}
    for name, kind in kinds.items():
        by_kind.setdefault(kind, []).append(name)
    parts = []
    if "summed" in by_kind:
        name = by_kind["summed"][0]
        parts.append(f"{_names(by_kind['summed'])}: the SUM over ranks, {world}x the mean (e.g. {name}[0] is "
                     f"{torch.as_tensor(got[name]).flatten()[0]:.6g}, expected {expected[name].flatten()[0]:.6g}): "
                     f"divide by world_size after all_reduce")
    if "divided twice" in by_kind:
        parts.append(f"{_names(by_kind['divided twice'])}: the mean divided by world_size once more ({world}x too "
                     f"small): all_reduce with op=ReduceOp.AVG already averages; use the default SUM, then divide")
    if "own" in by_kind:
        if len(by_kind["own"]) == len(kinds):
            parts.append("each rank kept the gradient of its own samples: no all_reduce combined them "
                         "(call dist.all_reduce on every parameter's grad)")
        else:
            reduced = [n for n in kinds if kinds[n] != "own"]
            parts.append(f"only {_names(reduced)} were all-reduced; {_names(by_kind['own'])} kept this rank's "
                         f"own gradient: reduce EVERY parameter (loop over model.parameters())")
    if "mean of the wrong samples" in by_kind and not shards_ok:
        parts.append("averaged correctly, but over the wrong samples: fix shard_indices (see above)")
    if "other" in by_kind:
        name = by_kind["other"][0]
        parts.append(f"{_names(by_kind['other'])} match no known mistake "
                     f"(max |diff| {_max_diff(got[name], expected[name]):.3g} for {name})")
    return f"rank {rank}: " + "; ".join(parts)


def _replicas_check(name, replicas, hint):
    if replicas["identical"]:
        return Check(name, True)
    return Check(name, False, f"the replicas differ: {replica_differences(replicas)}. {hint}")


def checks(run):
    world = run.nproc
    config = run.values("config")[0]
    batch = config["per_rank_batch"]
    x_all, y_all = make_dataset(samples=96, seed=config["seed"]).tensors
    expected_grads, expected_weights = _baseline(config, world, x_all, y_all)
    found = []

    # 1. shards: rank r trains on block r of the global batch
    shards = run.values("first_shard")
    wanted = [list(range(r * batch, (r + 1) * batch)) for r in range(world)]
    if shards == wanted:
        found.append(Check("each rank trains on its own block of the global batch", True))
    else:
        if world > 1 and all(s == shards[0] for s in shards):
            why = (f"every rank trains on the same samples {shards[0]}: use rank to pick this rank's block "
                   f"(expected {wanted})")
        else:
            why = f"step 0: the ranks trained on {shards}, expected {wanted} (rank r takes block r of B={batch})"
        found.append(Check("each rank trains on its own block of the global batch", False, why))
    shards_ok = shards == wanted

    # 2. gradients after average_gradients, first step, every rank
    problems = []
    locals_ = None
    for rank, got in enumerate(run.values("first_grads")):
        if all(_close(got[n], expected_grads[n]) for n in expected_grads):
            continue
        if locals_ is None:  # each rank's own-block gradient, from the blocks the lab really used
            locals_ = [_gradients(config["seed"], x_all[s], y_all[s]) for s in shards]
        problems.append(_diagnose_gradients(rank, world, got, expected_grads, locals_, shards_ok))
    found.append(Check(f"averaged gradients equal one process's on the global batch of {world * batch}",
                       not problems, "\n      ".join(problems)))

    # 3. replicas, by hand and with DDP
    found.append(_replicas_check("replicas identical after training by hand", run.values("hand_replicas")[0],
                                 "The ranks applied different gradients: every rank must average every gradient."))
    found.append(_replicas_check("replicas identical after training with DDP", run.values("ddp_replicas")[0],
                                 "DDP keeps replicas identical only if every rank wraps the same model."))

    # 4. weights after k steps, by hand and with DDP, against the single-process baseline
    steps = config["steps"]
    for label, key in (("by hand", "hand_weights"), ("with DDP", "ddp_weights")):
        wrong = []
        for rank, weights in enumerate(run.values(key)):
            bad = [n for n in expected_weights if not _close(weights[n], expected_weights[n])]
            if bad:
                wrong.append(f"rank {rank}: {_names(bad)} differ (max |diff| "
                             f"{max(_max_diff(weights[n], expected_weights[n]) for n in bad):.3g})")
        found.append(Check(f"weights after {steps} steps {label} equal one process trained on batch {world * batch}",
                           not wrong, "\n      ".join(wrong)))

    # 5. the two versions agree with each other
    gaps = [max(_max_diff(h[n], torch.as_tensor(d[n])) for n in d)
            for h, d in zip(run.values("hand_weights"), run.values("ddp_weights"))]
    worst = max(gaps)
    found.append(Check("DDP and the hand-written version agree", worst <= ROUNDING,
                       f"max |by hand - DDP| over ranks is {worst:.3g}: the hand-written steps do not do what "
                       f"DDP does" if worst > ROUNDING else ""))
    return found


LAB_CHECK = LabCheck(judge=checks, nprocs=NPROCS)
