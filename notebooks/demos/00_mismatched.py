"""Demo for notebook 00: a deliberate deadlock. Rank 0 waits in all_reduce, every other rank in barrier.

Each rank waits for the others to join *its* collective, so none ever returns. The launcher's timeout
stops the run and shows where each rank was stuck.
"""
import torch
import torch.distributed as dist

from ddpcourse import init_distributed

rank, world_size, device = init_distributed()
if rank == 0:
    dist.all_reduce(torch.ones(1, device=device))
else:
    dist.barrier()
print("unreachable: the collectives above never match")
