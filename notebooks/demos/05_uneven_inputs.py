"""Demo for notebook 05: ranks with different numbers of batches, with and without Join.

Rank 0 has 2 batches, rank 1 has 3. One launch trains three times:
1. inside Join (quietly: it reports its steps, whether the replicas agree, and how far the weights are from
   one process replaying the same steps with the third gradient halved, and with it whole);
2. without Join, while rank 0, done, waits in its next collective (the replicas' comparison): rank 1's third
   backward waits too, until its group's timeout (2 s here; 30 minutes by default for gloo) raises;
3. without Join, and rank 0, done, exits: rank 1's third backward raises at once, the connection to rank 0
   closed (gloo), long before any timeout.
Each rank catches and reports what its backward raised, so the run ends OK.

python -m ddpcourse run notebooks/demos/05_uneven_inputs.py --nproc 2             # all three parts
python -m ddpcourse run notebooks/demos/05_uneven_inputs.py --nproc 2 -- --join   # Join only
"""
import re
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse import init_distributed, report
from ddpcourse.lab import compare_replicas
from ddpcourse.toy import build_model, make_dataset

# -----------------------------------------------------------------------------
GROUP_TIMEOUT = timedelta(seconds=2)  # part 2's group: torch's own timeout ends the wait, and the run goes on
# -----------------------------------------------------------------------------
JOIN_ONLY = "--join" in sys.argv[1:]
rank, world_size, device = init_distributed()
data = make_dataset(samples=32)
batches = 2 + rank  # rank 0 has 2 batches, rank 1 has 3: the last batch of rank 1 has no partner


def train(model, say=print):
    """Train on this rank's batches; return (steps done, the error the last backward raised or None, its seconds)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(batches):
        x, y = data.tensors[0][step * 4:(step + 1) * 4], data.tensors[1][step * 4:(step + 1) * 4]
        optimizer.zero_grad()
        started = time.monotonic()
        try:
            torch.nn.functional.mse_loss(model(x), y).backward()  # DDP all-reduces the gradients here
        except RuntimeError as error:  # only the extra batch's backward can raise here
            return step, f"{type(error).__name__}: {error}", time.monotonic() - started
        optimizer.step()
        say(f"step {step} done")
    return batches, None, None


def first_sentence(error):
    """gloo's message without its source file, address and advice: what the notebook prints."""
    return re.sub(r"\s*\[[^\]]*\](:\d+)?", "", error.splitlines()[0]).split(". ")[0]


def replay(third_step_scale):
    """One process redoing part 1's 3 steps. Both ranks train on the same slices of the data, so for the first
    two steps DDP's mean gradient is the batch's own; at the third, rank 0 has joined and sends zeros, and DDP
    still divides by the world size (2): rank 1's gradient times 0.5."""
    replica = build_model(0)
    optimizer = torch.optim.SGD(replica.parameters(), lr=0.1)
    for step in range(3):
        x, y = data.tensors[0][step * 4:(step + 1) * 4], data.tensors[1][step * 4:(step + 1) * 4]
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(replica(x), y).backward()
        if step == 2:
            for parameter in replica.parameters():
                parameter.grad *= third_step_scale
        optimizer.step()
    return replica


def farthest(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


# 1. With Join: a rank that ran out of data shadows DDP's own collectives (zeros for the gradient all-reduce)
#    until every rank is done; at the end Join broadcasts the last rank's weights to all.
model = DDP(build_model(0))
with Join([model]):
    train(model, say=(print if JOIN_ONLY else lambda text: None))
replicas = compare_replicas(model)
report(joined_steps=batches, joined_identical=replicas.identical,
       joined_vs_halved=farthest(model.module, replay(0.5)), joined_vs_whole=farthest(model.module, replay(1.0)))
if JOIN_ONLY:
    print(f"with Join: finished {batches} steps; {replicas}")
    dist.destroy_process_group()
    sys.exit(0)

# 2. Without Join, rank 0 done and waiting in its next collective: rank 1's third backward waits for a partner
#    that never comes, until the group's timeout raises. (A group of its own, so that the world group that
#    compare_replicas uses stays healthy.)
short_group = dist.new_group(timeout=GROUP_TIMEOUT)
model = DDP(build_model(0), process_group=short_group)
steps, error, seconds = train(model, say=lambda text: print(f"part 2: {text}"))
waited = time.monotonic()
compare_replicas(model)  # rank 0 waits here, in the world group, until rank 1 comes
waited = time.monotonic() - waited
report(stays_steps=steps, stays_error=error, stays_seconds=seconds, stays_rank0_waited=waited)
print(f"part 2 (rank 0 waits in a collective): after {steps} steps, the extra backward raised after {seconds:.1f} s: "
      f"{first_sentence(error)}" if error else f"part 2: {steps} steps, then waited {waited:.1f} s for rank 1")

# 3. Without Join, rank 0 done and gone: rank 1's third backward finds the connection to rank 0 closed.
model = DDP(build_model(0))  # the world group: the default timeout, 30 minutes for gloo
steps, error, seconds = train(model, say=lambda text: print(f"part 3: {text}"))
report(exits_steps=steps, exits_error=error, exits_seconds=seconds)
print(f"part 3 (rank 0 exits): after {steps} steps, the extra backward raised after {seconds:.1f} s: "
      f"{first_sentence(error)}" if error else f"part 3: {steps} steps; this rank now exits")
dist.destroy_process_group()  # rank 0 leaves here; rank 1 gets here after its error
