"""Demo for notebook 02: run the source's three examples, one after the other, in the same ranks.

One launch instead of three (each launch costs every rank a torch import). The examples' files are
run unchanged (runpy, as `python file.py` would); this script only
- gives each fresh example the random state a fresh process would have: a different seed on every
  rank (fixed here, so the notebook shows the same numbers on every run; unseeded processes differ too),
- watches DistributedDataParallel: it records the replicas just before and just after the constructor,
- lets the examples share one process group: the first example's init_process_group creates it, the
  later calls reuse it (re-creating the default group in the same processes can race on torchrun's
  rendezvous store), and it is closed once at the end (the examples never close it themselves).

python -m ddpcourse run notebooks/demos/02_source_examples.py --nproc 2
"""
import gc
import os
import runpy
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from ddpcourse import report
from ddpcourse.lab import compare_replicas

HERE = Path(__file__).parent
EXAMPLES = ["02_source_example1.py", "02_source_example2.py", "02_source_example3.py"]
rank = int(os.environ["RANK"])
OriginalDDP = nn.parallel.DistributedDataParallel
seen = {}


class WatchedDDP(OriginalDDP):
    """DDP that records, for the notebook, whether the replicas agree before and after its constructor."""

    def __init__(self, module, *args, **kwargs):
        seen["before_wrap"] = compare_replicas(module).as_dict()
        super().__init__(module, *args, **kwargs)
        seen["after_wrap"] = compare_replicas(self).as_dict()
        seen["fc_weight_row0"] = [round(v, 4) for v in module.fc.weight[0].tolist()]


nn.parallel.DistributedDataParallel = WatchedDDP  # the examples look it up when they call it
original_init = dist.init_process_group


def init_once(*args, **kwargs):
    if not dist.is_initialized():
        original_init(*args, **kwargs)


dist.init_process_group = init_once

for number, name in enumerate(EXAMPLES, start=1):
    torch.manual_seed(1000 + 7 * rank)  # what an unseeded fresh process would be: a different stream per rank
    seen.clear()
    print(f"--- Example {number} ---")
    runpy.run_path(str(HERE / name), run_name="__main__")
    report(**{f"example{number}": dict(seen)})
gc.collect()  # the examples' DDP objects go before their process group does
dist.destroy_process_group()
