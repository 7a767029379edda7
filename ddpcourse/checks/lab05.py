"""Checks for lab 05 (a trainer that survives a crash): each world size runs the lab twice, once
undisturbed and once with its last rank killed mid-training under torchrun --max-restarts 1."""
import os

from ddpcourse._worker import WATCH_WRITES_ENV
from ddpcourse.checks import Check

NPROCS = (1, 2, 3)
FAIL_AT_STEP = 7  # mid-epoch for 1 and 3 ranks, at an epoch boundary for 2: resuming must handle both


def runs(workdir):
    specs = {}
    for name in ("uninterrupted", "crashed"):
        folder = os.path.join(workdir, name)
        os.makedirs(folder)
        specs[name] = {"args": ["--checkpoint-dir", folder], "env": {WATCH_WRITES_ENV: folder}}
    specs["crashed"]["env"]["DDPCOURSE_FAIL_AT_STEP"] = str(FAIL_AT_STEP)
    specs["crashed"]["torchrun_args"] = ["--max-restarts", "1"]
    return specs


def _first_difference(a, b):
    for name in a:
        if a[name] != b.get(name):
            return name
    return None


def _writers_problem(runs):
    writers = sorted({rank for run in runs for rank, paths in run.writes.items() if paths})
    if writers == [0]:
        return ""
    if not writers:
        return "no rank wrote a file into the checkpoint folder: save_checkpoint never wrote"
    return (f"ranks {writers} wrote into the checkpoint folder: the replicas are identical, so rank 0 alone "
            "writes (if rank == 0: ...) and every rank waits at dist.barrier(); several writers race on one file")


def explain_failure(run):
    problem = _writers_problem([run])
    return problem if problem.startswith("ranks") else ""


def checks(runs):
    plain, crashed = runs["uninterrupted"], runs["crashed"]
    world = plain.world_size
    found = []

    attempts = crashed.values("attempt")
    found.append(Check("the crashed run was restarted by torchrun and finished", attempts == [1] * world,
                       f"attempt per rank {attempts}, expected [1] * {world}"))

    every = plain.values("checkpoint_every")[0]
    expected = (FAIL_AT_STEP // every) * every
    starts = crashed.values("start_step")
    if starts == [expected] * world:
        found.append(Check(f"the restart resumed from the last checkpoint (step {expected})", True))
    else:
        why = ("it started again from step 0: load the checkpoint (model, optimizer, step) before training"
               if starts == [0] * world else "each rank must continue from the step stored in the checkpoint")
        found.append(Check(f"the restart resumed from the last checkpoint (step {expected})", False,
                           f"start step per rank {starts}, expected {expected} (the crash came after step "
                           f"{FAIL_AT_STEP}, checkpoints every {every} steps): {why}"))

    final_plain, final_crashed = plain.values("weights"), crashed.values("weights")
    differing = [r for r in range(world) if final_crashed[r] != final_plain[r]]
    detail = ""
    if differing:
        rank = differing[0]
        name = _first_difference(final_plain[rank], final_crashed[rank])
        detail = (f"ranks {differing} end with other weights than the uninterrupted run (first: {name} on rank "
                  f"{rank}); a resume must restore everything that shapes the next steps: weights, optimizer "
                  "state (momentum), the step and the data order")
    found.append(Check("final weights equal the uninterrupted run's exactly", not differing, detail))
    found.append(Check("replicas are identical at the end", all(w == final_plain[0] for w in final_plain),
                       "" if all(w == final_plain[0] for w in final_plain) else "ranks disagree at the end"))

    samples = plain.values("samples")[0]
    orders = plain.values("orders")  # rank -> epoch -> indices
    problems = []
    for epoch in range(len(orders[0])):
        seen = sorted(i for rank in range(world) for i in orders[rank][epoch])
        if seen != list(range(samples)):
            missing = sorted(set(range(samples)) - set(seen))
            twice = sorted({i for i in seen if seen.count(i) > 1})
            problems.append(f"epoch {epoch}: missing {missing[:8]}, seen twice {twice[:8]}")
    found.append(Check(f"across ranks every sample is seen once per epoch ({samples} samples)", not problems,
                       "; ".join(problems) + (": shard with DistributedSampler(num_replicas=world_size, rank=rank)"
                                              if problems else "")))
    repeated = [rank for rank in range(world) if len(orders[rank]) > 1 and orders[rank][1] == orders[rank][0]]
    found.append(Check("each epoch has a new order", not repeated,
                       f"ranks {repeated} train epoch 1 in exactly epoch 0's order: call sampler.set_epoch(epoch) "
                       "at the start of every epoch" if repeated else ""))

    problem = _writers_problem([plain, crashed])
    found.append(Check("only rank 0 writes the checkpoint", not problem, problem))
    return found
