"""Demo for notebook 04: all_reduce time over message sizes on this machine, and its memory-copy bandwidth.

python -m ddpcourse run notebooks/demos/04_allreduce_cost.py --nproc 2
"""
import time

import torch
import torch.distributed as dist

from ddpcourse import init_distributed, report

# -------------------------------------------------------------------------------------------- config
SIZES = [4 * 4**i for i in range(13)]   # bytes: 4 B (one float32) ... 64 MiB, a factor 4 apart
ROUNDS = 9                               # each round times every size once
SMALL_ROUNDS = 45                        # sizes up to 1 MiB (2 ms or less a call) get this many rounds
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

tensors = [torch.ones(size // 4) for size in SIZES]
for tensor in tensors:
    dist.all_reduce(tensor)  # warm-up: connections, buffers
# Rounds over all sizes, not all repeats of one size in a row: a burst of load on the machine then
# slows every size a little instead of one size a lot, and the medians stay comparable. Each round starts
# at another size, so that whatever follows the largest message does not always land on the same size.
times = [[] for _ in SIZES]
for round_number in range(SMALL_ROUNDS):
    for i in range(len(SIZES)):
        index = (i + 5 * round_number) % len(SIZES)
        if round_number >= ROUNDS and SIZES[index] > 2**20:
            continue  # the large sizes are steady after ROUNDS rounds, and each costs milliseconds
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensors[index])
        times[index].append(time.perf_counter() - start)
seconds = [median(size_times) for size_times in times]
# Load only ever adds time: on a busy machine a call often waits for a core, and the fastest of a size's rounds
# is the closest to what the call itself costs. The table and the bandwidths use it: a rerun shows the same shape.
fastest_seconds = [min(size_times) for size_times in times]

factor = 2 * (world_size - 1) / world_size  # bytes each rank sends (and receives) per byte of message, ring
algbw = [size / t / 1e9 for size, t in zip(SIZES, fastest_seconds)]
busbw = [bw * factor for bw in algbw]
print(f"all_reduce of {len(SIZES)} sizes from {SIZES[0]} B to {SIZES[-1] // 2**20} MiB timed on {world_size} ranks")
report(sizes=SIZES, seconds=seconds, fastest_seconds=fastest_seconds, rounds=[len(t) for t in times],
       algbw_gbps=algbw, busbw_gbps=busbw, copy_gbps=copy_gbps)
if __name__ == "__main__":  # run alone; inside 04_sync.py the next part uses the same group
    dist.destroy_process_group()
