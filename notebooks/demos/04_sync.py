"""Demo for notebook 04: its three parts in one launch, one after the other on the same ranks.

A launch costs seconds (every rank imports torch); each part takes a fraction of that. Each part also
runs alone: python -m ddpcourse run notebooks/demos/04_averaging.py --nproc 2

python -m ddpcourse run notebooks/demos/04_sync.py --nproc 2
"""
import runpy
from pathlib import Path

import torch.distributed as dist

from ddpcourse import init_distributed

PARTS = ["04_averaging.py", "04_no_sync_and_checksum.py", "04_allreduce_cost.py"]

init_distributed()  # each part finds the group open and keeps it open for the next
for part in PARTS:
    print(f"--- {part}", flush=True)  # the notebook finds a part's log by this line
    runpy.run_path(str(Path(__file__).with_name(part)), run_name="part")
dist.destroy_process_group()
