"""Checks for lab 05 (a trainer that survives a crash): each world size runs the lab undisturbed and,
from 2 ranks on, once more with its last rank killed mid-epoch under torchrun --max-restarts 1 (the last
checkpoint, step 6, is an epoch boundary on 2 ranks and mid-epoch on 3: resuming must handle both; one rank
adds no case of its own, so its crash is not staged).

Both runs watch the checkpoint folder (ddpcourse.checks.write_observer): which ranks wrote into it and how
(opened for writing, os.fsync, os.replace); the lab reports what each rank found there once save_checkpoint
returned. In the uninterrupted run every write into the folder waits a moment first, so a rank that does not
wait for the write is seen returning before the file exists.
"""
import os

from ddpcourse.checks import Check, LabCheck
from ddpcourse.checks.write_observer import WATCH_LOG_KEY

WRITE_DELAY_S = 0.25  # per checkpoint write (6 of them) in the uninterrupted run: see the barrier check
CHECKPOINT = "checkpoint.pt"  # the lab's file name in its --checkpoint-dir (set in main, outside the TODOs)

NPROCS = (1, 2, 3)
FAIL_AT_STEP = 7  # mid-epoch on 2 and 3 ranks; the resume from step 6 starts an epoch on 2, not on 3
CRASH_FROM_NPROC = 2
OBSERVER = "ddpcourse.checks.write_observer:observe"  # every rank calls it before the lab runs


def runs(workdir, nproc):
    specs = {}
    for name in ("uninterrupted", "crashed") if nproc >= CRASH_FROM_NPROC else ("uninterrupted",):
        folder = os.path.join(workdir, name)
        os.makedirs(folder)
        specs[name] = {"args": ["--checkpoint-dir", folder], "observer": OBSERVER,
                       "observer_options": {"folder": folder, "delay": 0.0}}
    if nproc > 1:  # one rank has nobody who could run ahead of its write: slowing it down shows nothing
        specs["uninterrupted"]["observer_options"]["delay"] = WRITE_DELAY_S
    if "crashed" in specs:
        specs["crashed"]["args"] += ["--fail-at-step", str(FAIL_AT_STEP)]
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
        return ("no rank opened a file in the checkpoint folder for writing or renamed one into it: save_checkpoint "
                "never wrote, or wrote with torch.save(state, path), which writes in place (open the temporary "
                "file yourself, then os.replace it onto the checkpoint)")
    return (f"ranks {writers} wrote into the checkpoint folder: the replicas are identical, so rank 0 alone "
            "writes (if rank == 0: ...) and every rank waits at dist.barrier(); several writers race on one file")


def explain_failure(run):
    problem = _writers_problem([run])
    return problem if problem.startswith("ranks") else ""


def checks(runs):
    plain, crashed = runs["uninterrupted"], runs.get("crashed")
    world = plain.world_size
    found = _resume_checks(plain, crashed) if crashed is not None else []
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

    problem = _writers_problem([run for run in (plain, crashed) if run is not None])
    found.append(Check("only rank 0 writes the checkpoint", not problem, problem))
    problem = _atomic_problem(plain.reports.get(0, {}).get(WATCH_LOG_KEY, []))
    found.append(Check("rank 0 writes atomically: a temporary file, os.fsync, then os.replace", not problem, problem))
    problem = _barrier_problem(plain)
    found.append(Check("every rank returns from save_checkpoint only once the checkpoint is written",
                       not problem, problem))
    return found


def _resume_checks(plain, crashed):
    """What the crashed-and-restarted run must show: a restart, a resume from the last checkpoint, the
    uninterrupted run's weights on every rank."""
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
    # After a resume, not in the undisturbed run: there DDP keeps the replicas equal by construction, but
    # what a restarted rank loads (or fails to load) happens after DDP's constructor broadcast.
    apart = [r for r in range(world) if final_crashed[r] != final_crashed[0]]
    found.append(Check("replicas are identical at the end of the resumed run", not apart,
                       f"after the restart, ranks {apart} end with other weights than rank 0 (first: "
                       f"{_first_difference(final_crashed[0], final_crashed[apart[0]])}): every rank must load the "
                       "checkpoint (the load happens after DDP's constructor broadcast, which cannot fix it)"
                       if apart else ""))

    return found


def _atomic_problem(log):
    """What is wrong with how rank 0 wrote the checkpoint ("" if nothing), from the watched folder's log."""
    if any(e["op"] == "open" and e["path"] == CHECKPOINT for e in log):
        return (f"{CHECKPOINT} itself was opened for writing: a crash during the write leaves half a checkpoint "
                "under the name the restart loads. Save into a temporary file in the same folder, then "
                "os.replace(temporary, path): the name then points at the old file or the new one, never half")
    replaced = [e for e in log if e["op"] == "replace" and e["dst"] == CHECKPOINT]
    if not replaced:
        return (f"no file was renamed onto {CHECKPOINT} (torch.save(state, path) writes it in place): write a "
                "temporary file, then os.replace(temporary, path)")
    for i, entry in enumerate(log):
        if entry["op"] != "replace" or entry["dst"] != CHECKPOINT:
            continue
        previous = max((j for j in range(i) if log[j]["op"] == "replace"), default=-1)
        since = [e for e in log[previous + 1:i] if e["op"] == "fsync" and e["path"] == entry["src"]]
        if not since:
            return (f"{entry['src']} was renamed onto {CHECKPOINT} without os.fsync: the rename can reach the disk "
                    "before the data, and after a power cut the checkpoint's name points at missing bytes. Call "
                    "os.fsync(file.fileno()) on the temporary file after torch.save, before os.replace")
        if entry["size"] is not None and since[-1]["size"] != entry["size"]:
            return (f"os.fsync ran when {entry['src']} held {since[-1]['size']} of its {entry['size']} bytes: "
                    "fsync once torch.save has written everything (after the save, before closing the file)")
    return ""


def _barrier_problem(run):
    """A rank that returned from save_checkpoint before rank 0's checkpoint was in the folder ("" if none):
    each rank reports the digest of the checkpoint it found right after every save_checkpoint call."""
    views = run.values("checkpoints_seen")
    written = views[0]
    for rank, seen in enumerate(views):
        for call, (found, wanted) in enumerate(zip(seen, written)):
            if wanted is not None and found != wanted:
                state = "an older checkpoint" if found else f"no {CHECKPOINT} at all"
                return (f"rank {rank} returned from save_checkpoint call {call + 1} while the folder held {state}: "
                        "it went on before rank 0 had written. Every rank (rank 0 too) must call dist.barrier() "
                        "after rank 0's write, or a rank can train on, or crash, with no checkpoint of this step")
    return ""


LAB_CHECK = LabCheck(judge=checks, nprocs=NPROCS, runs=runs, explain_failure=explain_failure)
