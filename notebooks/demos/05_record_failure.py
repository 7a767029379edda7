"""Demo for notebook 05: a plain torchrun script whose rank 1 fails, with @record writing the error file.

torchrun --standalone --nproc-per-node 2 --tee 3 --local-ranks-filter 1 --log-dir /tmp/logs notebooks/demos/05_record_failure.py
python notebooks/demos/05_record_failure.py   # one process: nobody fails

Plain torch only (no ddpcourse): this is the shape of a script learners run with torchrun after the course.
"""
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

FAILING_RANK = 1


@record  # on an exception: write it, with its traceback, to the file torchrun names in TORCHELASTIC_ERROR_FILE
def main():
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:  # plain `python file.py`: a group of one
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank = dist.get_rank()
    ranks_present = torch.ones(1)
    dist.all_reduce(ranks_present)
    print(f"rank {rank}: {ranks_present.item():g} ranks joined the all_reduce", flush=True)
    if rank == FAILING_RANK:
        time.sleep(1)  # rank 0 ends cleanly first: the only failure of this run is this one
        raise ValueError(f"rank {rank} stops on purpose: a batch it cannot handle")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
