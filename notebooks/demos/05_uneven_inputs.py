"""Demo for notebook 05: ranks with different numbers of batches, with and without Join.

python -m ddpcourse run notebooks/demos/05_uneven_inputs.py --nproc 2 --timeout 10           # hangs
python -m ddpcourse run notebooks/demos/05_uneven_inputs.py --nproc 2 -- --join              # finishes
"""
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse import init_distributed, report
from ddpcourse.lab import compare_replicas
from ddpcourse.toy import build_model, make_dataset

USE_JOIN = "--join" in sys.argv[1:]
rank, world_size, device = init_distributed()
data = make_dataset(samples=32)
batches = 2 + rank  # rank 0 has 2 batches, rank 1 has 3: the last batch of rank 1 has no partner
model = DDP(build_model(0))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def train():
    for step in range(batches):
        x, y = data.tensors[0][step * 4:(step + 1) * 4], data.tensors[1][step * 4:(step + 1) * 4]
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()  # DDP all-reduces the gradients here
        optimizer.step()
        print(f"step {step} done", flush=True)


if USE_JOIN:
    with Join([model]):  # a rank that ran out of data shadows the others' all-reduces with zeros
        train()
else:
    train()
replicas = compare_replicas(model)
report(steps=batches, identical=replicas.identical)
print(f"finished {batches} steps; {replicas}")
dist.destroy_process_group()
