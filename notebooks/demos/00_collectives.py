"""Demo for notebook 00: broadcast, all_reduce and all_gather on the values of the pictures.

python -m ddpcourse run notebooks/demos/00_collectives.py --nproc 3
"""
import torch
import torch.distributed as dist

from ddpcourse import init_distributed, report

rank, world_size, device = init_distributed()
start = [7.0, 1.0, 4.0, 2.0][rank % 4]  # each rank starts with its own number

t = torch.tensor(start, device=device)
dist.broadcast(t, src=0)  # in place: every rank's t now holds rank 0's value
broadcast = t.item()

t = torch.tensor(start, device=device)
dist.all_reduce(t, op=dist.ReduceOp.SUM)  # in place: every rank's t now holds the sum
summed = t.item()

t = torch.tensor(start, device=device)
parts = [torch.empty_like(t) for _ in range(world_size)]  # one slot per rank, filled in rank order
dist.all_gather(parts, t)
gathered = [p.item() for p in parts]

print(f"started with {start:g}: broadcast -> {broadcast:g}, all_reduce -> {summed:g}, all_gather -> {gathered}")
report(start=start, broadcast=broadcast, all_reduce=summed, all_gather=gathered)
dist.destroy_process_group()
