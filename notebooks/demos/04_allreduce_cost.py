"""Demo for notebook 04: all_reduce time over message sizes on this machine, and its memory-copy bandwidth.

python -m ddpcourse run notebooks/demos/04_allreduce_cost.py --nproc 2
"""
import time

import torch
import torch.distributed as dist

from ddpcourse import init_distributed, report

# -------------------------------------------------------------------------------------------- config
SIZES = [4 * 4**i for i in range(13)]   # bytes: 4 B (one float32) ... 64 MiB, a factor 4 apart
TIME_PER_SIZE = 0.15                     # seconds of repeats per size (fewer repeats for big messages)
MAX_REPEATS = 40
COPY_BYTES = 64 * 2**20                  # the memory-copy reference: one 64 MiB copy
# -----------------------------------------------------------------------------------------------------

rank, world_size, device = init_distributed()


def median(values):
    return sorted(values)[len(values) // 2]


# Memory-copy bandwidth on this machine, measured by every rank at the same time (as they will share
# the memory bus during the all_reduce). A copy reads and writes: count both.
source = torch.ones(COPY_BYTES // 4)
target = torch.empty_like(source)
target.copy_(source)  # touch the pages once
copy_times = []
for _ in range(5):
    dist.barrier()
    start = time.perf_counter()
    target.copy_(source)
    copy_times.append(time.perf_counter() - start)
copy_gbps = 2 * COPY_BYTES / median(copy_times) / 1e9

seconds = []
for size in SIZES:
    tensor = torch.ones(size // 4)
    dist.all_reduce(tensor)  # warm-up: connections, buffers
    # Every rank must run the same number of repeats: rank 0 decides from its warm-up time.
    probe = time.perf_counter()
    dist.all_reduce(tensor)
    repeats = torch.tensor([max(3, min(MAX_REPEATS, int(TIME_PER_SIZE / (time.perf_counter() - probe + 1e-9))))])
    dist.broadcast(repeats, src=0)
    times = []
    for _ in range(int(repeats)):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - start)
    seconds.append(median(times))

factor = 2 * (world_size - 1) / world_size  # bytes each rank sends (and receives) per byte of message, ring
algbw = [size / t / 1e9 for size, t in zip(SIZES, seconds)]
busbw = [bw * factor for bw in algbw]
print(f"all_reduce of {len(SIZES)} sizes from {SIZES[0]} B to {SIZES[-1] // 2**20} MiB timed on {world_size} ranks")
report(sizes=SIZES, seconds=seconds, algbw_gbps=algbw, busbw_gbps=busbw, copy_gbps=copy_gbps)
dist.destroy_process_group()
