"""The source's Example 1 ("incorrect initialization leading to divergence"), as a learner would copy it.

Adapted to a CPU laptop only where marked `# adapted:` (gloo instead of nccl, no .to(rank) or device_ids,
which name a GPU). Everything else is the source's pattern. Run it alone:
    python -m ddpcourse run notebooks/demos/02_source_example1.py --nproc 2
"""
import torch
import torch.nn as nn
import torch.distributed as dist
import os

# This function is outside the main block, which runs once per process.

def create_model():
    class SimpleNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(10, 2)
        def forward(self, x):
            return self.fc(x)
    return SimpleNet()

def main(rank, world_size):
    dist.init_process_group(backend="gloo", rank=rank, world_size=world_size)  # adapted: was "nccl"
    # Incorrect Initialization:
    model = create_model()

    # Wrap the model after initializing process groups and model weights
    model = nn.parallel.DistributedDataParallel(model)  # adapted: was model.to(rank), device_ids=[rank]

    # Training loop or verification that shows differences would go here.
    print(f"Rank {rank} - Model weights {model.module.fc.weight[:2, :2]}")


if __name__ == "__main__":
    world_size = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    main(rank, world_size)
