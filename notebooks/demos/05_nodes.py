"""Demo for notebook 05: global and local ranks when torchrun runs on several nodes, and one DDP step across them.

python -m ddpcourse run notebooks/demos/05_nodes.py --nproc 2 --nnodes 2
"""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse import init_distributed, report
from ddpcourse.lab import compare_replicas
from ddpcourse.toy import build_model, make_dataset

rank, world_size, device = init_distributed()  # on GPUs: cuda:LOCAL_RANK, never cuda:RANK
local_rank, node = int(os.environ["LOCAL_RANK"]), int(os.environ["GROUP_RANK"])
everyone = torch.zeros(world_size)
everyone[rank] = 1.0
dist.all_reduce(everyone)  # one collective across both nodes: every rank takes part
print(f"node {node}, local rank {local_rank} -> global rank {rank} of {world_size}")
report(rank=rank, node=node, local_rank=local_rank, world_size=world_size, joined=everyone.tolist())

# One real training step across the nodes. Each rank builds different weights on purpose (seed = rank):
# the wrapper's broadcast, then the gradient all-reduce in backward, must make all four replicas agree.
model = build_model(seed=rank).to(device)
ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
inputs, targets = (t[rank::world_size].to(device) for t in make_dataset(samples=8 * world_size).tensors)
start = [p.detach().clone() for p in model.parameters()]
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
torch.nn.functional.mse_loss(ddp(inputs), targets).backward()  # each rank: its own 8 samples
optimizer.step()
replicas = compare_replicas(model)
moved = any(not torch.equal(before, after) for before, after in zip(start, model.parameters()))
print(f"rank {rank} on {device}: after one DDP step, {replicas}")
report(device=str(device), stepped=moved, identical=replicas.identical, checked=replicas.parameters)
dist.destroy_process_group()
