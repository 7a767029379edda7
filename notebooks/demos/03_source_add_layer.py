"""Demo for notebook 03: the source's example 2 (add a layer on rank 0, broadcast it), as a learner copies it.

Its MyModel is our TinyNet; nothing else is changed. Expected: rank 1 fails.

python -m ddpcourse run notebooks/demos/03_source_add_layer.py --nproc 2
"""
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse import init_distributed
from ddpcourse.toy import build_model

init_distributed()

model = build_model(0)
ddp_model = DDP(model)

if dist.get_rank() == 0:
    new_layer = nn.Linear(10, 5)
    ddp_model.module.add_module('new_linear', new_layer)  # Adding to the underlying model

if dist.get_rank() == 0:
    nn.init.xavier_uniform_(ddp_model.module.new_linear.weight)
    nn.init.zeros_(ddp_model.module.new_linear.bias)

# Broadcast the weight and bias of the new layer
dist.broadcast(ddp_model.module.new_linear.weight.data, src=0)
dist.broadcast(ddp_model.module.new_linear.bias.data, src=0)

print("the new layer reached every rank")
dist.destroy_process_group()
