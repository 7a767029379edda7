"""Demo for notebook 08: one distributed failure per run, chosen with --failure, each as small as it can be.

python -m ddpcourse run notebooks/demos/08_failures.py --nproc 2 --timeout 20 -- --failure NAME [--pg-timeout S]

Failures that break the job (each needs its own launch: a broken group cannot be reused):
    extra      rank 0 alone all-reduces its loss for a log line, then both ranks all-reduce the gradients
    order      rank 0 all-reduces then broadcasts; rank 1 broadcasts then all-reduces
    outside    rank 1 is stuck in Python (a lock its own thread holds) while rank 0 waits in a collective;
               with --monitored, every rank calls dist.monitored_barrier first
    dies       rank 1 exits between two collectives (os._exit: no exception, no cleanup)
    unused     a DDP model whose second layer rank 1 skips (a branch on the rank's data)
    world      every rank asks init_process_group for one rank more than torchrun started
Silent ones, in one launch (no error anywhere; each part starts from identical replicas):
    silent     a parameter edited outside DDP on rank 1; noise drawn from a per-rank seed; a NaN in rank
               1's batch. Per step, every rank's checksums are all-gathered: where the replicas part.

--dump-dir DIR: a thread of each rank writes its flight recorder there (fr_rank_<r>) once the main thread is
stuck (the main thread is blocked in C++, which releases the GIL, so a Python thread still runs).
--debug-server PORT: start torch.distributed.debug's server; rank 0's thread fetches its /stacks and
/fr_trace pages of every rank while the ranks are stuck, and reports what it got.
"""
import argparse
import datetime
import os
import pickle
import threading
import time
import urllib.request

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse import report

parser = argparse.ArgumentParser()
parser.add_argument("--failure", required=True,
                    choices=["extra", "order", "outside", "dies", "unused", "world", "silent"])
parser.add_argument("--pg-timeout", type=float, default=4.0, help="seconds: the group's timeout (short: debugging)")
parser.add_argument("--monitored", action="store_true", help="outside: call dist.monitored_barrier first")
parser.add_argument("--detail-after-init", action="store_true",
                    help="set TORCH_DISTRIBUTED_DEBUG's DETAIL from Python once the default group exists")
parser.add_argument("--dump-dir", default="", help="where each rank writes its flight recorder when stuck")
parser.add_argument("--debug-server", type=int, default=0, help="port of torch.distributed.debug's server")
args = parser.parse_args()
STUCK_AFTER_S = 1.5  # when the helper thread acts: the main thread is stuck by then (it waits --pg-timeout)


def init(world_size=None):
    """The default group with a short timeout: a hang becomes an error after --pg-timeout seconds."""
    timeout = datetime.timedelta(seconds=args.pg_timeout)
    if world_size is None:
        dist.init_process_group("gloo", timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout, world_size=world_size)
    if args.detail_after_init:
        # after init: the group is not wrapped (DETAIL's wrapper is chosen when a group is made), so DDP's
        # constructor, which crashes on a wrapped gloo group, runs; DDP's errors still read the level
        dist.set_debug_level(dist.DebugLevel.DETAIL)
    return dist.get_rank(), dist.get_world_size()


def later(action):
    """Run `action` in a daemon thread once the main thread has had time to get stuck."""
    def wait_then_act():
        time.sleep(STUCK_AFTER_S)
        action()
    threading.Thread(target=wait_then_act, daemon=True).start()


def dump_flight_recorder(rank):
    """Write this rank's record once it is settled: its newest collective open, the ones before it completed,
    and both unchanged for half a second. Why wait: the record counts a call completed a moment after it
    returns, longer on a loaded machine, and a dump taken in between tells another story."""
    from torch._C._distributed_c10d import _dump_fr_trace
    deadline, seen, since = time.monotonic() + args.pg_timeout - STUCK_AFTER_S - 0.5, None, time.monotonic()
    while time.monotonic() < deadline:
        record = pickle.loads(_dump_fr_trace(includeStackTraces=False))
        newest = max((e["collective_seq_id"] for e in record["entries"]), default=0)
        now = (newest, record["pg_status"].get("0", {}).get("last_completed_collective"))
        if now != seen:
            seen, since = now, time.monotonic()
        elif now[1] == newest - 1 and time.monotonic() - since >= 0.5:
            break
        time.sleep(0.05)
    os.makedirs(args.dump_dir, exist_ok=True)
    data = _dump_fr_trace()
    with open(os.path.join(args.dump_dir, f"fr_rank_{rank}"), "wb") as file:
        file.write(data)
    entries = pickle.loads(data)["entries"]
    report(recorded=[(e["collective_seq_id"], e["profiling_name"], e["input_sizes"]) for e in entries])


def fetch_debug_pages():
    """What a browser would show: the page's text, or the error it got (reported, not hidden)."""
    pages = {}
    for page in ("stacks", "fr_trace"):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{args.debug_server}/{page}", timeout=10) as answer:
                pages[page] = answer.read().decode(errors="replace")
        except Exception as error:
            pages[page] = f"ERROR {type(error).__name__}: {error}"
    report(debug_pages=pages)


def outcome(call):
    """What `call` raised (type, first line of its message) or None, and after how many seconds."""
    started = time.monotonic()
    try:
        call()
    except Exception as error:  # the notebook reads the type and the text
        return {"type": type(error).__name__, "text": str(error), "seconds": time.monotonic() - started}, error
    return {"type": None, "text": "", "seconds": time.monotonic() - started}, None


def every_rank_caught_its_error(rank, world_size):
    """Wait until every rank has caught its error (at most the group's timeout again). The group is broken,
    the store its ranks met through is not: a new client of it (MASTER_ADDR, MASTER_PORT) still works."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=args.pg_timeout))
    store.set(f"demo08/caught/{rank}", "1")
    store.wait([f"demo08/caught/{r}" for r in range(world_size)])


def grads_like():
    return torch.ones(4)


# ----------------------------------------------------------------------------- failures that break the job
def extra(rank):
    # step 1's gradients, on both ranks
    dist.all_reduce(grads_like())
    if rank == 0:
        # the average loss for a log line: rank 0 only
        dist.all_reduce(torch.tensor([0.5]))
    # step 2's gradients: rank 1's call meets rank 0's extra one
    dist.all_reduce(grads_like())


def order(rank):
    weights = grads_like()
    if rank == 0:
        dist.all_reduce(weights)
        dist.broadcast(weights, src=0)
    else:
        dist.broadcast(weights, src=0)
        dist.all_reduce(weights)


def outside(rank):
    if args.monitored:
        if rank == 1:
            # slow data: rank 1 reaches the barrier after rank 0's timeout
            time.sleep(args.pg_timeout + 2)
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=args.pg_timeout))
        return
    lock = threading.Lock()
    if rank == 1:
        lock.acquire()
        threading.Thread(target=lambda: (time.sleep(args.pg_timeout + 2), lock.release()), daemon=True).start()
        # user code waits for a lock: in no collective at all
        lock.acquire()
    dist.all_reduce(grads_like())


def dies(rank):
    dist.all_reduce(grads_like())
    if rank == 1:
        # as if the kernel killed it: no exception, no goodbye
        os._exit(3)
    dist.all_reduce(grads_like())


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.second = torch.nn.Linear(4, 1)

    def forward(self, x, use_second):
        hidden = self.first(x)
        return self.second(hidden).sum() if use_second else hidden.sum()


def unused(rank):
    torch.manual_seed(0)
    model = DDP(TwoLayers())
    for step in range(2):
        # rank 1's batches never need `second`
        model(torch.ones(2, 4), use_second=(rank == 0)).backward()


# ----------------------------------------------------------------------------- silent divergence
def checksums(tensors):
    """Every rank's sum of `tensors` (float64), gathered: different sums <=> different replicas (equal sums
    almost surely mean equal replicas)."""
    local = torch.stack([t.detach().double().sum() for t in tensors]).sum().reshape(1)
    gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return [g.item() for g in gathered]


def silent(rank):
    results = {}
    for part in ("edited", "per_rank_seed", "nan"):
        torch.manual_seed(0)                                     # identical replicas at the start of each part
        model = DDP(torch.nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data_seed = torch.Generator().manual_seed(1 + rank)      # each rank its own batches, as a sampler gives
        steps = []
        for step in range(4):
            x = torch.randn(8, 4, generator=data_seed)
            if part == "nan" and rank == 1 and step == 2:
                x[0, 0] = float("nan")                           # one bad sample on one rank
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            grad_finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
            optimizer.step()
            if part == "edited" and rank == 1 and step == 1:
                with torch.no_grad():
                    model.module.weight.mul_(0.5)                # "clip my weights": outside DDP, rank 1 only
            if part == "per_rank_seed" and step == 1:
                noise = torch.Generator().manual_seed(100 + rank)  # must be one seed for all ranks
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(0.01 * torch.randn(p.shape, generator=noise))
            loss_finite = bool(torch.isfinite(loss))
            steps.append({"weights": checksums(model.parameters()),
                          "grads": checksums(p.grad for p in model.parameters()),
                          "loss_finite": loss_finite, "grad_finite": grad_finite})
        results[part] = steps
    report(silent=results)


# ----------------------------------------------------------------------------- main
if args.failure == "world":
    world = int(os.environ["WORLD_SIZE"])
    print(f"asking for world_size={world + 1} where torchrun started {world} ranks", flush=True)
    result, error = outcome(lambda: init(world_size=world + 1))
    report(result=result)
    raise SystemExit(0)

rank, world_size = init()
if args.dump_dir:
    later(lambda: dump_flight_recorder(rank))
if args.debug_server:
    from torch.distributed.debug import start_debug_server
    start_debug_server(port=args.debug_server)
    if rank == 0:
        later(fetch_debug_pages)
failure = {"extra": extra, "order": order, "outside": outside, "dies": dies, "unused": unused,
           "silent": silent}[args.failure]
result, error = outcome(lambda: failure(rank))
print(f"rank {rank}: {result['type'] or 'returned'} after {result['seconds']:.1f} s", flush=True)
# the flight recorder's size as this rank's environment sets it (None: unset, torch's default applies)
report(result=result, fr_buffer_size=os.environ.get("TORCH_FR_BUFFER_SIZE"))
if args.debug_server:
    time.sleep(STUCK_AFTER_S + 4)  # let rank 0's thread fetch the pages before the servers go
if error is not None:
    # torchrun stops the other ranks once one exits: where every rank raises after the timeout, wait until each
    # has caught its error (its own timeout, or the closed connection a peer's timeout leaves: gloo closes a
    # timed-out rank's connections) and reported it; elsewhere a moment.
    # --monitored: rank 0 (raised at --pg-timeout) stays until the late rank has reached the barrier (at
    # --pg-timeout + 2 s), found rank 0's connections closed and raised, and still exits first, so that the
    # verdict names rank 0's error
    if args.failure in ("extra", "order"):
        every_rank_caught_its_error(rank, world_size)
    else:
        time.sleep((3.5 if rank == 0 else 3.0) if args.monitored else 1.0)
    raise error  # the launcher then reads this rank's flight recorder and stack, and says its verdict
dist.destroy_process_group()
