"""Demo for notebook 00: a deliberate deadlock. Rank 0 waits in all_reduce, every other rank in barrier.

python -m ddpcourse run notebooks/demos/00_mismatched.py --nproc 2 --timeout 15
    Each rank waits for the others to join *its* collective. torch's own timeout for a gloo group is
    30 minutes, so the launcher's timeout stops the run first and shows where each rank was stuck.
python -m ddpcourse run notebooks/demos/00_mismatched.py --nproc 2 -- --pg-timeout 3
    The group is created with init_process_group(timeout=3 s): the same mismatch raises after 3 s.
    Then the debug level DETAIL (what TORCH_DISTRIBUTED_DEBUG=DETAIL sets for a whole run) checks a
    second group's collectives: the same mismatch raises at once.
"""
import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from ddpcourse import init_distributed, report

parser = argparse.ArgumentParser()
parser.add_argument("--pg-timeout", type=float, default=None, help="seconds; default: torch's own")
args = parser.parse_args()


def mismatched_collectives(device, group=None):
    if dist.get_rank(group) == 0:
        dist.all_reduce(torch.ones(1, device=device), group=group)
    else:
        dist.barrier(group=group)


if args.pg_timeout is None:
    rank, world_size, device = init_distributed()
    mismatched_collectives(device)
    print("one rank: nothing to mismatch. On 2 ranks or more this line is never reached.")
elif int(os.environ.get("WORLD_SIZE", "1")) < 2:
    print("--pg-timeout needs 2 ranks or more: python -m ddpcourse run notebooks/demos/00_mismatched.py "
          "--nproc 2 -- --pg-timeout 3")
else:
    level_at_start = str(dist.get_debug_level())  # set by $TORCH_DISTRIBUTED_DEBUG (OFF if unset)
    timeout = timedelta(seconds=args.pg_timeout)
    dist.init_process_group("gloo", timeout=timeout)  # the launcher set RANK, WORLD_SIZE, MASTER_ADDR/PORT

    def error_of(group=None):
        """Run the mismatch; return what it raised and after how many seconds."""
        started = time.monotonic()
        try:
            mismatched_collectives(torch.device("cpu"), group)
        except RuntimeError as error:
            return {"type": type(error).__name__, "text": str(error), "seconds": time.monotonic() - started}
        return None

    timed_out = error_of()
    print(f"with timeout={args.pg_timeout:g} s: {timed_out['type']} after {timed_out['seconds']:.1f} s")

    dist.set_debug_level(dist.DebugLevel.DETAIL)  # groups created from now on check every collective
    checked = dist.new_group(timeout=timeout)
    detected = error_of(checked)
    print(f"with DETAIL: {detected['type']} after {detected['seconds']:.1f} s")
    report(level_at_start=level_at_start, timed_out=timed_out, detected=detected,
           checked_backend=type(checked._get_backend(torch.device("cpu"))).__name__,
           default_timeout_s=default_pg_timeout.total_seconds())
    dist.destroy_process_group()
