"""Where each rank is: ask the live ranks for their Python stacks and format the lab's thread.

Each worker registers faulthandler on SIGUSR1, writing every thread's stack to ``rank<r>.stacks`` in the
run folder (ddpcourse.launch.rank). Windows has no SIGUSR1: there a timeout shows no stacks.
"""
import linecache
import os
import re
import signal
import time
from pathlib import Path

from ddpcourse.launch.events import ENDINGS, READY, STARTED
from ddpcourse.paths import display_path

# Where a rank is that has not reached the script: its stack would be kilobytes of torch's imports.
STILL_STARTING = "still starting (importing torch): the script had not begun"
_FRAME = re.compile(r'^\s*File "(.*)", line (\d+) in (.*)$')


def dump_stacks(run_dir, pids, wait=2.0):
    """{rank: raw faulthandler text} for the ranks ``pids`` ({rank: pid}) that are still alive."""
    if not hasattr(signal, "SIGUSR1"):
        return {}
    for pid in pids.values():
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            pass
    files = {rank: stacks_file(run_dir, rank) for rank in pids}
    deadline = time.monotonic() + wait

    def written(path):
        try:
            return path.stat().st_size > 0
        except OSError:
            return False

    while time.monotonic() < deadline and not all(written(f) for f in files.values()):
        time.sleep(0.05)
    time.sleep(0.2)  # the handler writes thread by thread: let it finish
    return {rank: f.read_text(errors="replace") for rank, f in files.items() if written(f)}


def _short(path):
    """site-packages/torch/x.py -> torch/x.py; course files relative to the course root."""
    marker = "site-packages" + os.sep
    if marker in path:
        return path.split(marker, 1)[1]
    return display_path(path) if os.path.isabs(path) else path


def _lab_thread(raw, lab_file):
    """[(file, line, function)] of the thread running the lab, most recent call first; None if none is."""
    threads, current = [], None
    for line in raw.splitlines():
        if "(most recent call first)" in line:
            current = []
            threads.append(current)
        elif current is not None:
            match = _FRAME.match(line)
            if match:
                current.append((match.group(1), int(match.group(2)), match.group(3)))
    lab_file = str(Path(lab_file).resolve())
    lab_threads = [t for t in threads if any(os.path.abspath(f) == lab_file for f, _, _ in t)]
    return lab_threads[-1] if lab_threads else None


def lab_line(raw, lab_file):
    """(line, code) of the innermost frame in the lab file of the thread running it, or None."""
    frames = _lab_thread(raw, lab_file) or []
    lab_file = str(Path(lab_file).resolve())
    for filename, lineno, _ in frames:
        if os.path.abspath(filename) == lab_file:
            return lineno, linecache.getline(filename, lineno).strip()
    return None


def format_stack(raw, lab_file):
    """The thread that is running the lab, most recent call first, the lab's own lines marked ``->``."""
    frames = _lab_thread(raw, lab_file)
    if frames is None:
        return raw.strip()
    lab_file = str(Path(lab_file).resolve())
    out = []
    for filename, lineno, func in frames:
        if "runpy" in filename or filename.endswith(os.path.join("launch", "rank.py")):
            break
        if filename.startswith("<frozen importlib"):  # the import machinery: noise between modules
            continue
        if os.path.abspath(filename) == lab_file:
            code = linecache.getline(filename, lineno).strip()
            out.append(f"  -> {_short(filename)}:{lineno} in {func}:  {code}")
        else:
            out.append(f"     {_short(filename)}:{lineno} in {func}")
    return "\n".join(out)


def stacks_text(stacks, world_size):
    parts = []
    for rank in range(world_size):
        stack = stacks.get(rank)
        if stack == STILL_STARTING:
            parts.append(f"rank {rank}: {stack}")
        else:
            parts.append(f"rank {rank}:\n{stack}" if stack else f"rank {rank}: no stack (not running yet, or already gone)")
    return "\n".join(parts)


def where_ranks_are(run_dir, events, lab_file, wait=2.0):
    """({rank: where it is}, {rank: (line, code) of its innermost frame in the script, or None}) of each rank
    running the script: the formatted stack; one line for a rank still starting, whose stack is only torch's
    imports (kilobytes of them) and says nothing about the script."""
    events.poll()  # what the ranks wrote since the last look (an interrupt can come before the loop read it)
    pids = {rank: events.first(rank, STARTED)["pid"] for rank in events.ranks() if events.first(rank, STARTED)}
    live = {rank: pid for rank, pid in pids.items() if not any(e["event"] in ENDINGS for e in events.events(rank))}
    starting = {rank for rank in live if events.first(rank, READY) is None}
    raw = dump_stacks(run_dir, {rank: pid for rank, pid in live.items() if rank not in starting}, wait=wait)
    where = {rank: format_stack(text, lab_file) for rank, text in raw.items()}
    lines = {rank: lab_line(text, lab_file) for rank, text in raw.items()}
    where.update({rank: STILL_STARTING for rank in starting})
    return dict(sorted(where.items())), lines


def where_stopped_ranks_were(run_dir, events, lab_file):
    """{rank: (line, code) or None} of the ranks that were still running when a peer failed in a collective:
    that peer asked them for their stacks (ddpcourse.launch.rank) before torchrun stopped them. A rank with an
    ending event, or that left no stack, is not among them."""
    found = {}
    for rank in events.ranks():
        if any(e["event"] in ENDINGS for e in events.events(rank)):
            continue
        raw = stacks_written(run_dir, rank)
        if raw.strip():
            found[rank] = lab_line(raw, lab_file)
    return found


def stacks_file(run_dir, rank):
    """Where rank ``rank``'s faulthandler writes its stacks (ddpcourse.launch.rank opens it, emptied)."""
    return Path(run_dir) / f"rank{rank}.stacks"


def stacks_written(run_dir, rank):
    """All that rank ``rank``'s faulthandler wrote to its stacks file since the rank started (each dump is
    appended), "" when it wrote none."""
    try:
        return stacks_file(run_dir, rank).read_text(errors="replace")
    except OSError:
        return ""


C10D = os.path.join("torch", "distributed", "distributed_c10d.py")  # the module of every collective's frame


def collective_in(raw):
    """The torch.distributed function (all_reduce, broadcast, ...) innermost in the stack a rank's fatal signal
    left (faulthandler's text), or None: where a rank died inside a collective."""
    marker = C10D
    for line in raw.splitlines():  # innermost first, thread by thread: the first such frame is where it died
        match = _FRAME.match(line)
        if match and match.group(1).endswith(marker) and not match.group(3).startswith("_"):
            return match.group(3)
    return None


def ranks_in(run_dir, ranks, function):
    """The ranks among ``ranks`` whose last stack (rank<r>.stacks) is inside torch.distributed's ``function``
    (e.g. init_process_group): where every rank waits at start-up for a peer that never comes."""
    marker = os.path.join("torch", "distributed") + os.sep
    found = []
    for rank in ranks:
        frames = [m for m in map(_FRAME.match, stacks_written(run_dir, rank).splitlines()) if m]
        if any(marker in m.group(1) and m.group(3) == function for m in frames):
            found.append(rank)
    return found

