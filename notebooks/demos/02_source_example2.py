"""The source's Example 2 ("correct initialization with a shared random seed"), as a learner would copy it.

Adapted to a CPU laptop only where marked `# adapted:` (gloo instead of nccl, the CPU instead of GPU
`rank`). Everything else is the source's pattern. Run it alone:
    python -m ddpcourse run notebooks/demos/02_source_example2.py --nproc 2
"""
import torch
import torch.nn as nn
import torch.distributed as dist
import os

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
    torch.manual_seed(42)  # Same seed on all ranks
    model = create_model().to("cpu")  # adapted: was .to(rank), a GPU. Create the model after setting the seed
    model = nn.parallel.DistributedDataParallel(model)  # adapted: was device_ids=[rank]
    print(f"Rank {rank} - Model weights {model.module.fc.weight[:2, :2]}")
    # Training would proceed here

if __name__ == "__main__":
    world_size = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    main(rank, world_size)
