"""Checks for lab 00 (first collectives): exact global mean, max and gather on every rank."""
from ddpcourse.checks import Check, LabCheck, agree

NPROCS = (1, 2, 3)


def expected_inputs(rank):
    """The lab's local_measurements, recomputed here so the check does not trust the lab."""
    return 1.0 + 0.5 * rank, float((rank * 5) % 7 + 1)


def _diagnose(name, got, rank, world, expected, local, total, rank0_value, sum_fix):
    """Why `got` is wrong, in the words of the likely mistake."""
    if not isinstance(got, (int, float)):
        return f"rank {rank}: {name} is {got!r}, expected the number {expected:g}"
    if world > 1 and agree(got, total):
        return f"rank {rank}: {name} is {got:g}, the SUM over ranks (expected {expected:g}): {sum_fix}"
    if rank != 0 and agree(rank0_value, expected):
        return (f"rank {rank}: {name} is {got:g}, expected {expected:g}; rank 0 is right, so the result reached "
                f"rank 0 only: use all_reduce (every rank gets the result), not reduce(dst=0)")
    if world > 1 and agree(got, local) and not agree(local, expected):
        return (f"rank {rank}: {name} is {got:g}, this rank's own value (expected {expected:g}): "
                f"no collective combined it with the other ranks")
    return f"rank {rank}: {name} is {got:g}, expected {expected:g}"


def _agreed(name, values, world, expected, locals_, sum_fix):
    problems = [_diagnose(name, got, rank, world, expected, locals_[rank], sum(locals_), values[0], sum_fix)
                for rank, got in enumerate(values) if not agree(got, expected)]
    return Check(f"{name} = {expected:g} on every rank", not problems, "\n      ".join(problems))


def checks(run):
    world = run.nproc
    inputs = [expected_inputs(rank) for rank in range(world)]
    losses, norms = [i[0] for i in inputs], [i[1] for i in inputs]
    found = []

    local_loss, local_norm = run.values("local_loss"), run.values("local_grad_norm")
    problems = []
    for rank in range(world):
        if not agree(local_loss[rank], losses[rank]):
            problems.append(f"rank {rank}: local_loss became {local_loss[rank]:g} (was {losses[rank]:g}): global_mean or "
                            "gather_all changed its input in place")
        if not agree(local_norm[rank], norms[rank]):
            problems.append(f"rank {rank}: local_grad_norm became {local_norm[rank]:g} (was {norms[rank]:g}): "
                            "global_max changed its input in place")
    if problems:
        problems.append("all_reduce writes its result into the tensor you pass: reduce a clone()")
    found.append(Check("each rank's own values are left unchanged", not problems, "\n      ".join(problems)))

    found.append(_agreed("mean_loss", run.values("mean_loss"), world, sum(losses) / world, losses,
                         "divide the sum by the world size"))
    found.append(_agreed("max_grad_norm", run.values("max_grad_norm"), world, max(norms), norms,
                         "reduce with op=dist.ReduceOp.MAX, not the default SUM"))

    problems = []
    for rank, got in enumerate(run.values("all_losses")):
        if isinstance(got, list) and len(got) == world and all(agree(g, e) for g, e in zip(got, losses)):
            continue
        if isinstance(got, list) and sorted(got) == sorted(losses):
            problems.append(f"rank {rank}: {got} has every loss but not in rank order (expected {losses})")
        else:
            problems.append(f"rank {rank}: all_losses is {got}, expected {losses} (element i from rank i)")
    found.append(Check(f"all_losses = {losses} on every rank", not problems, "\n      ".join(problems)))
    return found


LAB_CHECK = LabCheck(judge=checks, nprocs=NPROCS)
