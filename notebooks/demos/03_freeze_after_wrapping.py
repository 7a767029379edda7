"""Demo for notebook 03: freeze a layer of a live DDP model (the minimal run of "Expected to have finished
reduction in the prior iteration"). Expected: the step after freezing runs, the next one raises.

python -m ddpcourse run notebooks/demos/03_freeze_after_wrapping.py --nproc 2
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse import init_distributed, report
from ddpcourse.lab import compare_replicas
from ddpcourse.toy import build_model, make_dataset

rank, world_size, device = init_distributed()
x, y = make_dataset().tensors
x_local, y_local = x[rank::world_size].to(device), y[rank::world_size].to(device)

model = DDP(build_model(0).to(device))  # default: find_unused_parameters=False
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)


def step(number):
    optimizer.zero_grad()
    F.mse_loss(model(x_local), y_local).backward()
    optimizer.step()
    print(f"step {number} done")


step(1)
model.module.fc1.requires_grad_(False)  # freeze the first layer of the live DDP model
step(2)  # fc1 gets no gradient, so DDP's reduction never completes: no gradient is averaged
found = compare_replicas(model)
print("after step 2:", found)
# for Appendix C, read from DDP's private attributes: the buckets it now has, and whether step 2 rebuilt them
buckets = model.reducer._get_zeros_like_grad_buckets()  # one per bucket
report(after_step_2=[d.name for d in found.differences], rebuilt_in_step_2=model._has_rebuilt_buckets,
       bucket_bytes=[bucket.buffer().numel() * bucket.buffer().element_size() for bucket in buckets])
step(3)  # the next forward finds the previous reduction unfinished and raises
dist.destroy_process_group()
