"""Demo for notebook 05: ranks with different numbers of batches, with and without Join.

One launch trains twice: first inside Join (quietly: it only reports its steps and whether the replicas
agree), then without Join, where rank 1's extra batch waits until the launcher's timeout ends the run.

python -m ddpcourse run notebooks/demos/05_uneven_inputs.py --nproc 2 --timeout 6         # Join, then a hang
python -m ddpcourse run notebooks/demos/05_uneven_inputs.py --nproc 2 -- --join           # Join only: finishes
"""
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse import init_distributed, report
from ddpcourse.lab import compare_replicas
from ddpcourse.toy import build_model, make_dataset

JOIN_ONLY = "--join" in sys.argv[1:]
rank, world_size, device = init_distributed()
data = make_dataset(samples=32)
batches = 2 + rank  # rank 0 has 2 batches, rank 1 has 3: the last batch of rank 1 has no partner


def train(model, say=print):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(batches):
        x, y = data.tensors[0][step * 4:(step + 1) * 4], data.tensors[1][step * 4:(step + 1) * 4]
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()  # DDP all-reduces the gradients here
        optimizer.step()
        say(f"step {step} done")


# 1. With Join: a rank that ran out of data shadows the others' all-reduces with zeros.
model = DDP(build_model(0))
with Join([model]):
    train(model, say=(print if JOIN_ONLY else lambda text: None))
replicas = compare_replicas(model)
report(joined_steps=batches, joined_identical=replicas.identical)
if JOIN_ONLY:
    print(f"with Join: finished {batches} steps; {replicas}")
else:
    # 2. Without Join: rank 1's third backward waits for a partner that has left the loop.
    model = DDP(build_model(0))
    train(model)
    replicas = compare_replicas(model)
    report(steps=batches, identical=replicas.identical)
    print(f"finished {batches} steps; {replicas}")
dist.destroy_process_group()
