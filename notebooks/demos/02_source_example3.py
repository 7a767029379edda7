"""The source's Example 3 (custom weights on rank 0, "broadcast" with broadcast_object_list), as written.

Adapted to a CPU laptop only where marked `# adapted:` (gloo instead of nccl, the CPU instead of GPU
`rank`). Everything else is the source's pattern. Run it alone:
    python -m ddpcourse run notebooks/demos/02_source_example3.py --nproc 2
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

def modify_weights(model, rank):
    if rank == 0:
        with torch.no_grad():
            model.fc.weight[0,:] = torch.arange(10.0)
    # No modifications for other ranks on initial weights

def main(rank, world_size):
    dist.init_process_group(backend="gloo", rank=rank, world_size=world_size)  # adapted: was "nccl"
    model = create_model().to("cpu")  # adapted: was .to(rank), a GPU
    modify_weights(model, rank)

    # Broadcast the weights using broadcast_object_list
    params_list = [param.data for param in model.parameters()]

    dist.broadcast_object_list(params_list, src=0)

    model = nn.parallel.DistributedDataParallel(model)  # adapted: was device_ids=[rank]
    print(f"Rank {rank} - Model weights {model.module.fc.weight[:2, :2]}")

    # Training would proceed here

if __name__ == "__main__":
    world_size = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    main(rank, world_size)
