"""Demo for notebook 00: the same mismatch three times. Rank 0 calls all_reduce, every other rank barrier.

python -m ddpcourse run notebooks/demos/00_mismatched.py --nproc 2 --timeout 6
    1. in a group created with timeout=2 s: every rank raises after about 2 s;
    2. in a group created under the debug level DETAIL (what TORCH_DISTRIBUTED_DEBUG=DETAIL sets for a
       whole run): torch compares the ranks' calls first and raises at once;
    3. in the default group, with torch's own timeout (30 minutes for gloo): nothing raises, so the
       launcher's timeout stops the run and shows where each rank was stuck.
Each finished part is report()-ed at once, so the notebook reads parts 1 and 2 from a run that timed out.
"""
import argparse
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ddpcourse import init_distributed, report

parser = argparse.ArgumentParser()
parser.add_argument("--pg-timeout", type=float, default=2.0, help="seconds, for the group of part 1")
args = parser.parse_args()


def mismatched_collectives(device, group=None):
    if dist.get_rank(group) == 0:
        dist.all_reduce(torch.ones(1, device=device), group=group)
    else:
        dist.barrier(group=group)


def error_of(group):
    """Run the mismatch in `group`; return what it raised and after how many seconds."""
    started = time.monotonic()
    try:
        mismatched_collectives(torch.device("cpu"), group)
    except RuntimeError as error:
        return {"type": type(error).__name__, "text": str(error), "seconds": time.monotonic() - started}
    return None


level_at_start = str(dist.get_debug_level())  # set by $TORCH_DISTRIBUTED_DEBUG (OFF if unset)
rank, world_size, device = init_distributed("gloo")  # the default group, torch's default timeout; CPU on any machine
if world_size < 2:
    print("one rank: nothing to mismatch. Run it with --nproc 2.")
    dist.destroy_process_group()
    raise SystemExit(0)

short = dist.new_group(backend="gloo", timeout=timedelta(seconds=args.pg_timeout))
timed_out = error_of(short)
print(f"1. group with timeout={args.pg_timeout:g} s: {timed_out['type']} after {timed_out['seconds']:.1f} s")
report(level_at_start=level_at_start, timed_out=timed_out)

dist.set_debug_level(dist.DebugLevel.DETAIL)  # groups created from now on check every collective
checked = dist.new_group(backend="gloo", timeout=timedelta(seconds=args.pg_timeout))
detected = error_of(checked)
print(f"2. group created under DETAIL: {detected['type']} after {detected['seconds']:.1f} s")
report(detected=detected, checked_backend=type(checked._get_backend(torch.device("cpu"))).__name__)

print("3. the default group: waiting (only a timeout can end this)", flush=True)
mismatched_collectives(device)
print("never printed on 2 ranks or more: the call above does not return")
dist.destroy_process_group()
