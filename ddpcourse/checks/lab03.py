"""Checks for lab 03 (change a wrapped model): the new layer trains and is the same on every rank, and
rank 0's calibration of the output bias reaches every rank.

The expected calibration is recomputed here from rank 0's validation predictions and the held-out set
(rebuilt here), so the check does not trust the lab's arithmetic.
"""
from ddpcourse.checks import ROUNDING, Check, LabCheck, agree, replica_differences

NPROCS = (1, 2, 3)
NEW_LAYER = "fc2.new."
VALIDATION_SEED, VALIDATION_SAMPLES = 1, 32  # as in the lab's config block


def _max_change(before, after):
    return max(abs(a - b) for x, y in zip(before, after) for a, b in zip(_flat(x), _flat(y)))


def _flat(value):
    if isinstance(value, list):
        return [v for item in value for v in _flat(item)]
    return [value]


def _expected_shift(predictions):
    from ddpcourse.toy import make_dataset  # imports torch: only here, in the check process

    y = make_dataset(VALIDATION_SAMPLES, seed=VALIDATION_SEED).tensors[1].flatten().double()
    return float((y - y.new_tensor(predictions)).mean())


def _new_layer_trains(run):
    at_growth, final = run.values("new_layer_at_growth")[0], run.values("new_layer_final")[0]
    moved = _max_change(at_growth, final)
    if moved > 0:
        return Check("the new layer trains", True)
    held, total = run.values("optimizer_tensors")[0], run.values("model_tensors")[0]
    why = ("the optimizer does not hold the new layer's parameters: an optimizer keeps the list of parameters "
           "it was built with. Build a new one after growing: torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)")
    if run.values("optimizer_holds_new_layer")[0]:
        why = "its parameters are in the optimizer, so did its gradients reach it? Train the model grow() returns"
    return Check("the new layer trains", False,
                 f"the new layer {NEW_LAYER}* did not change in training (the optimizer holds {held} of the "
                 f"model's {total} parameter tensors): {why}.")


def _new_layer_same_everywhere(run):
    replicas = run.values("replicas")[0]
    differ = [d for d in replicas["differences"] if d["name"].startswith(NEW_LAYER)]
    starts = run.values("new_layer_at_growth")
    differed_at_start = any(_max_change(starts[0], other) > 0 for other in starts[1:])
    if not differ and not differed_at_start:
        return Check("the new layer is identical on every rank", True)
    names = replica_differences(replicas, NEW_LAYER)
    when = "right after grow() and after training" if differed_at_start else "after training"
    return Check("the new layer is identical on every rank", False,
                 f"the new layer differs between ranks {when}: {names or 'its starting values'}. DDP averages only "
                 "the gradients of the parameters it registered when it was built (and broadcasts rank 0's "
                 "values only then), so each rank trains the new layer on its own data: wrap the changed "
                 "module in a NEW DDP, model = DDP(net), after inserting the layer.")


def _calibration_reaches_every_rank(run):
    before, after = run.values("bias_before"), run.values("bias_after")
    shift = _expected_shift(run.values("validation_predictions")[0])
    expected = before[0] + shift
    problems = []
    for rank, got in enumerate(after):
        if agree(got, expected, ROUNDING):
            continue
        if rank == 0 and agree(got, before[0], ROUNDING):
            problems.append(f"rank 0: the output bias is unchanged ({got:.6f}); expected {expected:.6f}: add "
                            "the mean validation error (y_validation - prediction).mean() to it")
        elif rank == 0 and agree(got, before[0] - shift, ROUNDING):
            problems.append(f"rank 0: the bias moved by {got - before[0]:+.6f}, expected {shift:+.6f}: the sign "
                            "is reversed; add (y_validation - prediction).mean()")
        elif rank > 0 and agree(got, before[rank], ROUNDING) and agree(after[0], expected, ROUNDING):
            problems.append(f"rank {rank}: the output bias is still this rank's own {got:.6f}, rank 0 holds the "
                            f"calibrated {expected:.6f}: the edit was made on rank 0 only and never sent. Every "
                            "rank must call dist.broadcast(bias, src=0) after rank 0's edit")
        else:
            problems.append(f"rank {rank}: the output bias is {got:.6f}, expected rank 0's calibrated {expected:.6f} "
                            f"(before {before[0]:.6f} plus the mean validation error {shift:+.6f})")
    return Check("rank 0's calibration reaches every rank", not problems, "\n      ".join(problems))


def _replicas_identical(run):
    replicas = run.values("replicas")[0]
    if replicas["identical"]:
        return Check("all replicas identical after training", True)
    return Check("all replicas identical after training", False,
                 "the ranks end with different models (the checks above say why): " + replica_differences(replicas))


def checks(run):
    return [_new_layer_trains(run), _new_layer_same_everywhere(run), _calibration_reaches_every_rank(run),
            _replicas_identical(run)]


LAB_CHECK = LabCheck(judge=checks, nprocs=NPROCS)
