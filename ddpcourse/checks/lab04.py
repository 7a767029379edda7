"""Checks for lab 04 (local SGD): averaging after every k-th step, of every parameter and buffer, as a
mean, matching torch's PeriodicModelAverager; replicas drift apart between averagings.

The lab reports, per step and per rank, the flattened state right before and right after its call to
``maybe_average``. The expected "after" is computed here from every rank's "before": the mean over ranks
at the averaging steps, each rank's own "before" at the others.
"""
from ddpcourse.checks import ROUNDING, Check, LabCheck, agree

NPROCS = (1, 2, 3)
STEPS, EVERY = 12, 4
EXPECTED_STEPS = [s for s in range(1, STEPS + 1) if s % EVERY == 0]


def _close(a, b, tol=ROUNDING):  # float32 training; sums over 3 ranks may round in another order than ours
    return agree(a, b, tol)


def _slices(layout):
    """(kind, name, start, stop) of each tensor in a flattened snapshot."""
    out, offset = [], 0
    for kind, name, size in layout:
        out.append((kind, name, offset, offset + size))
        offset += size
    return out


def _names(items):
    return ", ".join(items[:6]) + (f" and {len(items) - 6} more" if len(items) > 6 else "")


def _status(run, slices, world, step):
    """For each tensor right after `step`: "mean", "sum", "differ" (not the same on every rank) or "wrong"."""
    before, after = run.values("before"), run.values("after")
    i, status = step - 1, {}
    for kind, name, a, b in slices:
        got = [after[r][i][a:b] for r in range(world)]
        mean = [sum(before[r][i][j] for r in range(world)) / world for j in range(a, b)]
        if any(not _close(got[r], got[0], 0.0) for r in range(world)):
            status[name] = "differ"
        elif _close(got[0], mean):
            status[name] = "mean"
        elif world > 1 and _close(got[0], [m * world for m in mean]):
            status[name] = "sum"
        else:
            status[name] = "wrong"
    return status


def _skipped(statuses):
    """Expected averaging steps after which nothing at all was averaged (a schedule mistake)."""
    return [step for step, status in statuses.items() if set(status.values()) == {"differ"}]


def _averaging_check(kind, statuses, slices, world):
    """Right after the averaging steps, every `kind` tensor is the same on every rank and is the mean.

    Worded from the first averaging step with a problem: later ones inherit it.
    """
    names = [n for k, n, _, _ in slices if k == kind]
    problems = []
    for step, status in statuses.items():
        if step in _skipped(statuses):
            continue  # the schedule check reports it
        by = {s: [n for n in names if status[n] == s] for s in ("differ", "sum", "wrong")}
        if by["differ"]:
            fix = ("average model.buffers() too: BatchNorm's running statistics drift like the weights "
                   "(and torch's PeriodicModelAverager leaves buffers alone)" if kind == "buffer" else
                   "average every tensor of model.parameters(), not only some of them")
            problems.append(f"{kind}s {_names(by['differ'])} still differ between ranks right after the "
                            f"averaging at step {step}: {fix}")
        if by["sum"]:
            problems.append(f"{kind}s {_names(by['sum'])} hold the SUM over ranks after the averaging at step "
                            f"{step}, {world}x the mean: divide by the world size after all_reduce(SUM)")
        if by["wrong"]:
            problems.append(f"{kind}s {_names(by['wrong'])} after the averaging at step {step} are the same on "
                            f"every rank but not the mean of the ranks' values")
        if problems:
            break
    return Check(f"every {kind} is averaged (the mean over ranks) after steps {EXPECTED_STEPS}", not problems,
                 "\n      ".join(problems))


def checks(run):
    world = run.nproc
    layout = run.values("layout")[0]
    slices = _slices(layout)
    found = []
    config = run.values("config")[0]
    if config != {"steps": STEPS, "every": EVERY}:
        return [Check(f"the lab keeps its config (STEPS={STEPS}, AVERAGE_EVERY={EVERY})", False,
                      f"the lab reports {config}: put the config block back to STEPS={STEPS}, AVERAGE_EVERY={EVERY}")]

    size = slices[-1][3] if slices else 0
    if any(len(snap) != size for rank_snaps in run.values("before") + run.values("after") for snap in rank_snaps):
        return [Check("the lab reports whole snapshots", False,
                      "the snapshots do not match the model's layout: keep snapshot() and main() as they are")]
    statuses = {step: _status(run, slices, world, step) for step in EXPECTED_STEPS}
    found.append(_averaging_check("parameter", statuses, slices, world))
    found.append(_averaging_check("buffer", statuses, slices, world))

    # Between averagings: no communication, so each rank keeps what its own step produced, and with
    # different data on each rank the replicas differ.
    before, after = run.values("before"), run.values("after")
    early = [s for s in range(1, STEPS + 1) if s not in EXPECTED_STEPS
             and any(not _close(after[r][s - 1], before[r][s - 1], 0.0) for r in range(world))]
    same = [s for s in range(1, STEPS + 1) if s not in EXPECTED_STEPS and world > 1
            and all(_close(after[r][s - 1], after[0][s - 1], 0.0) for r in range(world))]
    reported = run.values("averaged_at")[0]
    skipped = _skipped(statuses) if world > 1 else []
    problems = []
    if early:
        every = "every step" if len(early) == STEPS - len(EXPECTED_STEPS) else f"after steps {early}"
        problems.append(f"the model changed inside maybe_average after step(s) {early}, which are not averaging "
                        f"steps: you average {every}; with k={EVERY} average only after steps {EXPECTED_STEPS} "
                        f"(step % every == 0, steps counted from 1)")
    elif same and not skipped:
        problems.append(f"replicas are identical after steps {same} with no averaging: do the ranks train on "
                        f"different data? (keep batches() as it is)")
    if skipped:
        problems.append(f"no averaging after step(s) {skipped}: with k={EVERY} average after every k-th step "
                        f"{EXPECTED_STEPS} (step % every == 0, steps counted from 1)")
    if not early and not skipped and reported != EXPECTED_STEPS:
        problems.append(f"maybe_average returned True after steps {reported}, expected {EXPECTED_STEPS}")
    returned = run.values("returned")[0]
    odd = sorted({repr(r) for r in returned if r is not True and r is not False})
    if odd:
        problems.append(f"maybe_average returned {', '.join(odd)} after some steps: it must return True when it "
                        "averaged and False when it did not (a missing return gives None)")
    found.append(Check("replicas differ between averagings (no averaging after other steps)", not problems,
                       "\n      ".join(problems)))

    # The library's local SGD on the same data: PeriodicModelAverager(period=k, warmup_steps=k-1).
    n_params = sum(size for kind, _, size in layout if kind == "parameter")
    twin = run.values("twin_after")
    off = []
    for r in range(world):
        for i in range(STEPS):
            if not _close(after[r][i][:n_params], twin[r][i]):
                diff = max(abs(x - y) for x, y in zip(after[r][i][:n_params], twin[r][i]))
                off.append(f"rank {r}: after step {i + 1} your parameters differ from torch's by up to {diff:.3g}")
                break
    found.append(Check("parameters match torch's PeriodicModelAverager at every step", not off,
                       "\n      ".join(off[:3]) + ("\n      (the checks above say why)" if off else "")))
    return found


LAB_CHECK = LabCheck(judge=checks, nprocs=NPROCS)
