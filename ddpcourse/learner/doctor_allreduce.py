"""The doctor's end-to-end test: every rank all-reduces its rank number; the sum must be 0+1+...+N-1."""
import torch
import torch.distributed as dist

from ddpcourse import init_distributed, report

rank, world_size, device = init_distributed()
value = torch.tensor([float(rank)], device=device)
dist.all_reduce(value)
report(total=value.item(), backend=dist.get_backend())
dist.destroy_process_group()
