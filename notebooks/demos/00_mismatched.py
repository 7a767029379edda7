"""Demo for notebook 00: collective calls that do not match across ranks, each mismatch in its own group.

python -m ddpcourse run notebooks/demos/00_mismatched.py --nproc 2 --timeout 6
    1. different operations (rank 0 all_reduce, rank 1 barrier) in a group created with timeout=2 s:
       both ranks raise after about 2 s;
    2. the same operation with different sizes (rank 0 broadcasts 1 element into rank 1's 2): both return
       at once, with no error, and rank 1's tensor is only partly written;
    3. different operations in a group created under the debug level DETAIL (what
       TORCH_DISTRIBUTED_DEBUG=DETAIL sets for a whole run): torch compares the ranks' calls first and
       raises at once;
    4. all_reduce with SUM on rank 0 and MAX on rank 1 in a DETAIL group: the check does not compare the
       ReduceOp, both return, and rank 1 does not get the maximum it asked for;
    5. different operations in the default group, with torch's own timeout (30 minutes): nothing raises,
       so the launcher's timeout stops the run and shows where each rank was stuck.
Each finished part is report()-ed at once, so the notebook reads parts 1 to 4 from a run that timed out.

python -m ddpcourse run notebooks/demos/00_mismatched.py --nproc 2 -- --dtypes
    instead: all_reduce of a float32 tensor on rank 0 and a float64 one on rank 1. gloo aborts rank 0
    at once, in C++, where no `try` can catch it.
"""
import argparse
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ddpcourse import init_distributed, report

parser = argparse.ArgumentParser()
parser.add_argument("--pg-timeout", type=float, default=2.0, help="seconds, for the groups of parts 1 to 4")
parser.add_argument("--dtypes", action="store_true", help="run only the float32/float64 mismatch (it aborts)")
args = parser.parse_args()


def mismatched_collectives(device, group=None):
    if dist.get_rank(group) == 0:
        dist.all_reduce(torch.ones(1, device=device), group=group)
    else:
        dist.barrier(group=group)


def outcome(call):
    """Run `call`; return what it raised (or None) and its value, after how many seconds."""
    started = time.monotonic()
    try:
        value = call()
    except RuntimeError as error:
        return {"type": type(error).__name__, "text": str(error), "seconds": time.monotonic() - started}
    return {"type": None, "value": value, "seconds": time.monotonic() - started}


def said(result):
    return result["type"] or f"returned {result['value']}"


def new_group():
    # a group of its own per mismatch: a mismatch can leave a group's connections out of step
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=args.pg_timeout))


def sizes_differ(group):
    t = torch.tensor([7.0]) if dist.get_rank(group) == 0 else torch.tensor([1.0, 1.0])
    dist.broadcast(t, src=0, group=group)
    return t.tolist()


def reduce_ops_differ(group):
    rank = dist.get_rank(group)
    t = torch.tensor([7.0, 1.0][rank])
    dist.all_reduce(t, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX, group=group)
    return t.item()


level_at_start = str(dist.get_debug_level())  # set by $TORCH_DISTRIBUTED_DEBUG (OFF if unset)
rank, world_size, device = init_distributed("gloo")  # the default group, torch's default timeout; CPU on any machine
if world_size < 2:
    print("one rank: nothing to mismatch. Run it with --nproc 2.")
    dist.destroy_process_group()
    raise SystemExit(0)

if args.dtypes:
    dtype = torch.float32 if rank == 0 else torch.float64
    print(f"all_reduce of a {dtype} tensor", flush=True)
    dist.all_reduce(torch.ones(1, dtype=dtype))  # rank 0 receives 8 bytes where it expects 4: gloo aborts it
    print("never printed by rank 0")
    dist.destroy_process_group()
    raise SystemExit(0)

short = new_group()
timed_out = outcome(lambda: mismatched_collectives(torch.device("cpu"), short))
print(f"1. different ops, group with timeout={args.pg_timeout:g} s: {timed_out['type']} after "
      f"{timed_out['seconds']:.1f} s")
report(level_at_start=level_at_start, timed_out=timed_out)

sizes = outcome(lambda: sizes_differ(new_group()))
print(f"2. broadcast, 1 element vs 2: {said(sizes)} after {sizes['seconds']:.1f} s")
report(sizes=sizes)

dist.set_debug_level(dist.DebugLevel.DETAIL)  # groups created from now on check every collective
checked = new_group()
detected = outcome(lambda: mismatched_collectives(torch.device("cpu"), checked))
print(f"3. different ops, group created under DETAIL: {detected['type']} after {detected['seconds']:.1f} s")
report(detected=detected, checked_backend=type(checked._get_backend(torch.device("cpu"))).__name__)

ops = outcome(lambda: reduce_ops_differ(new_group()))  # this group is created under DETAIL too
print(f"4. all_reduce, SUM vs MAX, under DETAIL: {said(ops)} after {ops['seconds']:.1f} s")
report(reduce_ops=ops)

print("5. different ops, the default group: waiting (only a timeout can end this)", flush=True)
mismatched_collectives(device)
print("never printed on 2 ranks or more: the call above does not return")
dist.destroy_process_group()
