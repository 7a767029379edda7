"""Checks for lab 02 (initialization and broadcast): every src's values reach every rank, buffers too, in
place, with autograd left out; the DDP run that follows (init_sync=False: only the lab's broadcast makes the
start equal) starts identical, reads the shards DistributedSampler gives and ends with the data-parallel run's
weights.

The expected values are rebuilt here (the lab's differently_started, replayed), not taken from the lab.
"""
import re

import torch
import torch.nn as nn
from torch.utils.data import DistributedSampler

from ddpcourse.checks import RECOMPUTED, ROUNDING, Check, LabCheck, agree
from ddpcourse.toy import build_model, make_dataset

NPROCS = (1, 2, 3)
# The lab's config, repeated: the check must not trust the learner's file for what is expected.
SEED, LR, WARMUP_ROWS, BATCH_SIZE = 0, 0.1, 8, 8
# What torch's autograd fallback warns (torch 2.13, autograd_not_implemented_fallback.cpp) when a backward
# reaches an op with no autograd kernel, such as c10d::broadcast_ run into a parameter with grad mode on.
NO_AUTOGRAD_KERNEL = re.compile(r"(\S+): an autograd kernel was not registered to the Autograd key")


def started_state(rank):
    """What rank `rank` holds before any broadcast (the lab's differently_started, rebuilt here)."""
    model = build_model(seed=100 + rank, batchnorm=True)
    generator = torch.Generator().manual_seed(200 + rank)
    for _ in range(rank + 1):
        model(torch.randn(WARMUP_ROWS, 8, generator=generator) + rank)
    return {name: t.detach().double().flatten() for name, t in model.state_dict().items()}


def _equal(reported, expected, names):
    # copies of values the check recomputes (BatchNorm statistics may round in their last bits)
    return all(agree(reported[n], expected[n], RECOMPUTED) for n in names)


def _broadcast_checks(run, world):
    starts = [started_state(r) for r in range(world)]
    params = [n for n in starts[0] if not n.startswith("norm.running") and "num_batches" not in n]
    buffers = [n for n in starts[0] if n not in params]
    values_problems, buffer_problems, object_problems = [], [], []
    for src in range(world):
        per_rank = run.values(f"src{src}")
        owners = [[r for r in range(world) if _equal(got["state"], starts[r], params)] for got in per_rank]
        object_problems += [f"src={src}, rank {rank}" for rank, got in enumerate(per_rank) if not got["same_objects"]]
        if all(o == [src] for o in owners):
            buffer_problems += [
                f"src={src}: rank {rank}'s buffers ({', '.join(buffers)}) are not rank {src}'s: only the "
                "parameters were broadcast. Loop over module.buffers() too (BatchNorm's running "
                "statistics are buffers, not parameters)."
                for rank, got in enumerate(per_rank) if not _equal(got["state"], starts[src], buffers)]
        elif world > 1 and all(o == owners[0] for o in owners) and owners[0]:
            values_problems.append(
                f"src={src}: every rank holds rank {owners[0][0]}'s parameters, not rank {src}'s: "
                f"pass src to dist.broadcast (src={src}), not a fixed rank.")
        elif any(owners[rank] == [rank] for rank in range(world) if rank != src):
            stuck = [rank for rank in range(world) if rank != src and owners[rank] == [rank]]
            values_problems.append(
                f"src={src}: ranks {stuck} still hold their own initial parameters, as if nothing was broadcast. "
                "If you used broadcast_object_list: it sends pickled copies and puts NEW tensors into the "
                "list; the module's own tensors are never written. Call dist.broadcast(tensor, src=src) "
                "on each tensor instead.")
        else:
            values_problems.append(f"src={src}: the ranks' parameters are not rank {src}'s start "
                                   f"(each rank's matches the start of ranks {owners})")
    found = [
        Check("every rank holds src's parameters, for every src", not values_problems,
              "\n      ".join(dict.fromkeys(values_problems))),
        Check("every rank holds src's buffers (BatchNorm running statistics), for every src",
              not buffer_problems and not values_problems,
              "\n      ".join(buffer_problems) if buffer_problems else
              ("see the parameters above first" if values_problems else "")),
        Check("the module keeps its tensor objects (written in place, not replaced)", not object_problems,
              f"{', '.join(object_problems)}: after broadcast_module_ the module's parameters or buffers are new "
              "objects or point at new memory (an optimizer built earlier would update the old ones). "
              "Write into the existing tensors: dist.broadcast(tensor, src) works in place." if object_problems else ""),
    ]
    return found


def _autograd_check(run):
    """The lab's DDP training backpropagates through the parameters broadcast_module_ wrote: had autograd
    recorded that broadcast, torch warns there, on the rank that ran the backward."""
    warned = {rank: NO_AUTOGRAD_KERNEL.search(" ".join(lines)) for rank, lines in sorted(run.output.items())}
    warned = {rank: found.group(1) for rank, found in warned.items() if found}
    problem = ""
    if warned:
        ops = ", ".join(dict.fromkeys(warned.values()))
        problem = (f"ranks {list(warned)}: the DDP training's backward warned \"{ops}: an autograd kernel was not "
                   "registered ... This may lead to silently incorrect behavior\". broadcast_module_ wrote into "
                   "parameters with grad mode on, so autograd recorded the broadcast, which it cannot "
                   "differentiate. Broadcast under `with torch.no_grad():` (or broadcast tensor.detach()).")
    return Check("broadcast_module_ is not recorded by autograd (no backward warns of an op without an autograd "
                 "kernel)", not problem, problem)


def _replay(batches, world):
    """The DDP run, replayed in one process: start from rank 0's seed, average the ranks' gradients."""
    torch.manual_seed(0)
    model = build_model(seed=SEED)
    data = make_dataset(seed=SEED)
    x, y = data.tensors
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(len(batches[0])):
        optimizer.zero_grad()
        for rank in range(world):
            rows = torch.tensor(batches[rank][step])
            (nn.functional.mse_loss(model(x[rows]), y[rows]) / world).backward()
        optimizer.step()
    return {name: t.detach().double().flatten() for name, t in model.state_dict().items()}


def _training_checks(run, world):
    found = []
    before = run.values("before_ddp")
    found.append(Check("replicas identical after broadcast_module_(model, 0), before DDP",
                       all(b["identical"] for b in before),
                       "" if before[0]["identical"] else f"rank 0 reports: {before[0]}"))
    batches = run.values("batches")
    seen = [sorted(i for batch in ranks for i in batch) for ranks in batches]
    total = len(make_dataset(seed=SEED))
    problem = ""
    if world > 1 and all(s == seen[0] for s in seen):
        problem = (f"every rank read the same {len(seen[0])} samples: without a DistributedSampler every rank "
                   "trains on the same data (world_size copies of one batch). Use "
                   "DistributedSampler(dataset, num_replicas=world_size, rank=rank, ...) as the sampler.")
    elif world > 1 and len(set().union(*map(set, seen))) < sum(map(len, seen)):
        problem = ("the ranks' shards overlap: some samples are read by several ranks, others by none. "
                   "Every rank's DistributedSampler needs the same seed (it splits one shared shuffle).")
    elif sorted(i for s in seen for i in s) != list(range(total)):
        problem = f"the ranks read {sum(map(len, seen))} samples in all, expected each of the {total} once."
    else:
        expected = [list(DistributedSampler(range(total), num_replicas=world, rank=r, shuffle=True, seed=SEED))
                    for r in range(world)]
        expected = [[order[i:i + BATCH_SIZE] for i in range(0, len(order), BATCH_SIZE)] for order in expected]
        off = [r for r in range(world) if batches[r] != expected[r]]
        if off:
            problem = (f"ranks {off} read their shard in other batches than DistributedSampler(dataset, "
                       "num_replicas=world_size, rank=rank, shuffle=True, seed=SEED) with batch_size=BATCH_SIZE "
                       "gives (shuffled with the shared SEED, BATCH_SIZE samples per batch).")
    found.append(Check("each rank reads its own shard: disjoint, together the whole dataset, in the sampler's "
                       "shuffled batches", not problem, problem))
    after = run.values("after_training")
    found.append(Check("replicas identical after DDP training", all(a["identical"] for a in after),
                       "" if after[0]["identical"] else
                       f"rank 0 reports: {after[0]}. DDP(model, init_sync=False) broadcast nothing: the "
                       "replicas trained from the start broadcast_module_(model, 0) left them."))
    if len({len(b) for b in batches}) == 1:
        expected = _replay(batches, world)
        trained = run.values("trained")[0]
        # the DDP replay sums gradients in another order than gloo does
        wrong = [n for n in expected if not agree(trained[n], expected[n], ROUNDING)]
        found.append(Check("the trained weights are the data-parallel run's, from rank 0's start", not wrong,
                           f"{wrong} differ from a replay of the same batches (one process, gradients averaged "
                           "over ranks) starting from rank 0's model: after broadcast_module_(model, 0) every rank "
                           "must hold rank 0's values unchanged" if wrong else ""))
    else:
        found.append(Check("the trained weights are the data-parallel run's, from rank 0's start", False,
                           f"the ranks took different numbers of steps: {[len(b) for b in batches]}"))
    return found


def checks(run):
    world = run.nproc
    return _broadcast_checks(run, world) + [_autograd_check(run)] + _training_checks(run, world)


LAB_CHECK = LabCheck(judge=checks, nprocs=NPROCS)
