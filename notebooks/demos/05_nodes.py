"""Demo for notebook 05: global and local ranks when torchrun runs on several nodes.

python -m ddpcourse run notebooks/demos/05_nodes.py --nproc 2 --nnodes 2
"""
import os

import torch
import torch.distributed as dist

from ddpcourse import init_distributed, report

rank, world_size, device = init_distributed()
local_rank, node = int(os.environ["LOCAL_RANK"]), int(os.environ["GROUP_RANK"])
everyone = torch.zeros(world_size)
everyone[rank] = 1.0
dist.all_reduce(everyone)  # one collective across both nodes: every rank takes part
print(f"node {node}, local rank {local_rank} -> global rank {rank} of {world_size}")
report(rank=rank, node=node, local_rank=local_rank, world_size=world_size, joined=everyone.tolist())
dist.destroy_process_group()
