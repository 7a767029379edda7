"""What every rank runs: ``python -m ddpcourse.launch.rank FILE ARGS...``, started by torchrun as a fresh
interpreter (its default, the way a learner's own jobs start). It runs FILE as ``python FILE`` would and
leaves the launcher (ddpcourse.launch.launcher) the evidence it needs to tell a learner what happened, as
events in the run folder (ddpcourse.launch.events):
- the rank's stdout and stderr go, in order, to one log file per rank (the launcher tags and streams it);
- ``faulthandler`` dumps every thread's Python stack to a file on SIGUSR1 (used at a timeout);
- torch is imported *before* the "ready" event when the script imports it, so the launcher's timeout
  measures the script, not the imports;
- the exception that ended the rank, or its exit code, is recorded with a timestamp, so the launcher can name
  the root-cause rank instead of printing torchrun's wall of text; torch's ``ErrorHandler`` also writes it to
  torchrun's error file, so torchrun's own summary names it (the launcher reads it back from the agent's
  ``ChildFailedError.failures``);
- its flight recorder (torch's record of the collectives it launched, on by default) is written to the run
  folder when it raises, when it finishes, and when asked, by a thread of the rank (the main thread is blocked
  in a collective then): by the launcher at a timeout, and by a rank that raised in a collective, which waits
  for its peers' records before torchrun stops them (ddpcourse.launch.collectives reads them);
- at the end of the script it records whether the default process group is still open (a lab must call
  ``dist.destroy_process_group()``; the launcher reports an open one);
- a watchdog ends the rank and its children if its parent (torchrun's agent) dies;
- a check's observer named in the run's spec is called before the script runs (lab 05's check watches
  which ranks write its checkpoints, and how: ddpcourse.checks.write_observer).
Rank 0's store for init_process_group is torch's own (it listens on every interface while rank 0 runs):
handing it a loopback socket, as the agent does for the rendezvous store, made ranks abort at exit more often.
"""
import ast
import faulthandler
import gc
import importlib
import os
import pickle
import re
import runpy
import signal
import sys
import threading
import time
import traceback

from ddpcourse.todos import todo_in_message
from ddpcourse.launch.collectives import DUMP_REQUEST, PEER_REQUEST, dump_file
from ddpcourse.launch.events import (ENDINGS, EXCEPTION, EXIT, FINISHED, INTERRUPTED, READY, STARTED, read_events,
                                     write_event)
from ddpcourse.launch.processes import watch_parent
from ddpcourse.launch.spec import current_spec
from ddpcourse.launch.stacks import stacks_file


def _redirect_output(run_dir, rank):
    # Raw descriptors, not file objects: nothing for Python to warn about ("unclosed file") at exit.
    log = os.open(os.path.join(run_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)  # both streams into one file keeps their relative order
    os.dup2(log, 2)
    os.close(log)
    stacks = os.open(stacks_file(run_dir, rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    if hasattr(signal, "SIGUSR1"):  # not on Windows
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    faulthandler.enable(file=2)  # a segfault still leaves a stack in the log


def _dump_collectives(run_dir, rank, lines=True, asked=False):
    """Write this rank's flight recorder to the run folder, when the script used torch.distributed (torch keeps
    it by default; the record outlives destroy_process_group: a rank that finished still tells what it called).
    Written to another name and renamed: the launcher reads whole files only. lines: with the Python frames of
    each call, which costs a second the first time in a process on an idle machine, 3-5 s on a loaded one
    (torch's symbolizer asks ``hasattr(torch, "_inductor")``, which imports torch._inductor and torch._dynamo):
    for a failure only; a rank that finished well leaves its calls without them (about a millisecond).
    asked: the launcher's request at a timeout, answered even by a rank that never used torch.distributed."""
    if "torch.distributed" not in sys.modules and not asked:
        return
    try:
        target = dump_file(run_dir, rank)
        partial = target.with_name(target.name + ".partial")
        if "torch.distributed" in sys.modules:
            partial.write_bytes(pickle.dumps(_flight_record(lines)))
        else:  # asked by the launcher: an empty record says so at once (it waits for every rank's answer)
            partial.write_bytes(pickle.dumps({"entries": []}))
        os.replace(partial, target)
    except Exception:  # noqa: BLE001 - evidence for the verdict, never a reason for the rank to fail
        pass


def _flight_record(lines):
    """torch's record of this process's collectives: gloo's (CPU) recorder, or nccl's when this process used
    CUDA and nccl recorded calls: a recorder of its own (CUDA events), which ``_dump_fr_trace`` does not return
    (seen on one H200, torch 2.11: an nccl all_reduce only in ``_dump_nccl_trace``; not run on several GPUs)."""
    from torch._C import _distributed_c10d as c10d

    cuda = sys.modules.get("torch.cuda")
    if hasattr(c10d, "_dump_nccl_trace") and cuda is not None and cuda.is_initialized():
        try:
            nccl = pickle.loads(c10d._dump_nccl_trace(includeCollectives=True, includeStackTraces=lines,
                                                      onlyActive=False))
        except Exception:  # noqa: BLE001 - no nccl group in this process
            nccl = {}
        if nccl.get("entries"):
            return nccl
    return pickle.loads(c10d._dump_fr_trace(includeStackTraces=lines))


class _DumpOnRequest:
    """A thread that writes the flight recorder when the launcher asks (DUMP_REQUEST appears in the run
    folder: with the calls' frames) or a peer that failed does (PEER_REQUEST: without them); stopped before the
    interpreter exits, so nothing of it runs during finalization."""

    def __init__(self, run_dir, rank):
        self.request, self.stop = os.path.join(run_dir, DUMP_REQUEST), threading.Event()
        self.peer_request = os.path.join(run_dir, PEER_REQUEST)
        self.thread = threading.Thread(target=self._serve, args=(run_dir, rank), daemon=True,
                                       name="ddpcourse-collectives")
        self.thread.start()

    def _serve(self, run_dir, rank):
        while not self.stop.wait(0.1):
            if os.path.exists(self.request):
                _dump_collectives(run_dir, rank, asked=True)
                return
            if os.path.exists(self.peer_request):
                _dump_collectives(run_dir, rank, lines=False, asked=True)
                return

    def close(self):
        self.stop.set()
        self.thread.join(timeout=1.0)


PEERS_WAIT_S = 10.0  # at most: a peer that raised too writes its record with frames, 1-5 s on a loaded machine


def _alive(pid):
    import psutil  # here only: a rank that never fails in a collective does not pay for it

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _ask_for_stack(pid):
    """faulthandler's dump of every thread into the rank's stacks file (registered on SIGUSR1, as at a timeout)."""
    if hasattr(signal, "SIGUSR1"):
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            pass


def _gather_peer_records(run_dir, rank):
    """Ask every other rank for its flight recorder (PEER_REQUEST: without frames) and its stack, and wait until
    each has written a record or ended (at most PEERS_WAIT_S). Why: as soon as this rank exits, torchrun stops
    the others (SIGTERM), and a peer stopped while it waits in a collective, or while it writes its own record,
    leaves the verdict nothing of its side (seen: a 2-rank order mismatch named only one rank's call, now and
    then, on a loaded machine)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    peers = [r for r in range(world) if r != rank]
    if not peers:
        return
    request = os.path.join(run_dir, PEER_REQUEST)
    try:  # ours to remove afterwards only if we made it (another failing rank may have made it first)
        os.close(os.open(request, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        made = True
    except FileExistsError:
        made = False
    deadline = time.monotonic() + PEERS_WAIT_S
    waiting = set(peers)
    while waiting and time.monotonic() < deadline:
        for peer in sorted(waiting):
            events = read_events(run_dir, peer)
            started = [e for e in events if e.get("event") == STARTED]
            if any(e.get("event") in ENDINGS for e in events) or (started and not _alive(started[-1]["pid"])):
                waiting.discard(peer)  # it ended: its own record, if any, is written
            elif started and dump_file(run_dir, peer).exists():
                # its stack after its record: blocked in the call the record shows open, it is still there
                _ask_for_stack(started[-1]["pid"])
                waiting.discard(peer)
        time.sleep(0.05)
    for peer in waiting:  # no record in time: its stack at least (faulthandler needs no help from Python)
        started = [e for e in read_events(run_dir, peer) if e.get("event") == STARTED]
        if started:
            _ask_for_stack(started[-1]["pid"])
    if made:  # a restarted attempt (torchrun --max-restarts) must not find it and dump at once
        try:
            os.remove(request)
        except OSError:
            pass


# DDP's error for parameters that got no gradient lists their indices; their names need a debug level the
# learner may not have set. The indices are the one thing read from torch's message: the names are DDP's own.
_UNUSED = re.compile(r"Parameter indices which did not receive grad for rank \d+: ([\d ]+)")


def _unused_parameters(exc):
    """{index: name} of the parameters DDP says got no gradient, named by the one DDP model in this process
    that has them (DistributedDataParallel._build_debug_param_to_name_mapping); {} otherwise."""
    found = _UNUSED.search(str(exc))
    ddp_module = sys.modules.get("torch.nn.parallel.distributed")
    if not found or ddp_module is None:
        return {}
    indices = [int(i) for i in found.group(1).split()]
    models = [o for o in gc.get_objects() if isinstance(o, ddp_module.DistributedDataParallel)]
    names = []
    for model in models:
        try:
            mapping = model._build_debug_param_to_name_mapping(model._build_params_for_reducer()[0])
        except Exception:  # noqa: BLE001 - a name is a courtesy: without one the verdict keeps the indices
            continue
        if all(i in mapping for i in indices):
            # torch names a parameter of the model itself ".name" (an empty module name before the dot)
            names.append({i: mapping[i].lstrip(".") for i in indices})
    return names[0] if len(names) == 1 else {}


def _lab_frames(tb, lab_file):
    """The traceback entries from the lab file onwards (the bootstrap and runpy are noise)."""
    entries = traceback.extract_tb(tb)
    for i, entry in enumerate(entries):
        if os.path.abspath(entry.filename) == lab_file:
            return entries[i:]
    return entries


def _record_exception(exc, lab_file, run_dir, rank):
    # before the event: when the launcher sees the exception, the file is there. With the calls' lines when the
    # exception came out of torch.distributed (a failed collective), the case their cost is worth it.
    in_collective = any(f"torch{os.sep}distributed{os.sep}" in entry.filename
                        for entry in traceback.extract_tb(exc.__traceback__))
    _dump_collectives(run_dir, rank, lines=in_collective)
    frames = _lab_frames(exc.__traceback__, lab_file)
    text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
    text += "".join(traceback.format_exception_only(type(exc), exc))
    fields = {"type": type(exc).__name__, "message": str(exc), "traceback": text}
    lab_lines = [f for f in frames if os.path.abspath(f.filename) == lab_file]
    if lab_lines:
        fields["lab_line"] = lab_lines[-1].lineno
    unused = _unused_parameters(exc) if isinstance(exc, RuntimeError) else {}
    if unused:
        fields["unused_parameters"] = [[index, name] for index, name in sorted(unused.items())]
    todo = todo_in_message(str(exc)) if isinstance(exc, NotImplementedError) else None
    if todo:
        fields["todo"] = {"number": todo[0], "hint": todo[1]}
    # Not printed here: the launcher prints the root-cause rank's traceback once, not once per rank.
    write_event(EXCEPTION, **fields)
    if in_collective:  # the others' side of the failed collective, before torchrun stops them
        _gather_peer_records(run_dir, rank)
    if "torch" in sys.modules:  # torchrun's error file ($TORCHELASTIC_ERROR_FILE), written by torch's own handler
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(exc)


def _imports_torch(lab_file):
    """Whether the script imports torch (directly, or through the course's lab helpers)."""
    try:
        with open(lab_file, "rb") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] == "torch" or node.module in ("ddpcourse.lab", "ddpcourse.toy"):
                return True
            if node.module == "ddpcourse" and any(a.name in ("init_distributed", "compare_replicas") for a in node.names):
                return True
    return False


def _call_observer(spec, lab_file):
    if spec.observer:
        module, _, function = spec.observer.partition(":")
        getattr(importlib.import_module(module), function)(spec, lab_file)


def _process_group_open():
    distributed = sys.modules.get("torch.distributed")
    return bool(distributed and distributed.is_available() and distributed.is_initialized())


def _finished(run_dir, rank):
    """Record the end of the script and whether the default process group is still open; then free what
    the script left while the interpreter is whole. Why: torch 2.13 aborts now and then ("terminate called
    without an active exception") when DDP's objects are destroyed during the interpreter's finalization;
    benchmarks/exit_after_destroy.py counts it under a bare torchrun, with the collection and without (0 of
    25 against 4 of 19 here). Rarer, not gone: the launcher names an abort that still comes after a complete
    run (ddpcourse.launch.diagnosis.aborted_after_finishing)."""
    _dump_collectives(run_dir, rank, lines=False)  # a peer that hangs or fails is compared with these calls
    write_event(FINISHED, process_group_open=_process_group_open())
    gc.collect()


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: python -m ddpcourse.launch.rank FILE [ARGS...]")
    lab_file = os.path.abspath(sys.argv[1])
    spec = current_spec()
    rank = int(os.environ.get("RANK", "0"))
    _redirect_output(spec.run_dir, rank)
    watch_parent()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    write_event(STARTED, local_rank=int(os.environ.get("LOCAL_RANK", "0")), restart=restart)
    if restart:  # the same log continues: mark where the new attempt begins
        print(f"--- torchrun restarted this rank (restart {restart}) ---", flush=True)
    if _imports_torch(lab_file):
        import torch  # noqa: F401 - the script's own import is then instant
        import torch.distributed  # noqa: F401
    gc.freeze()  # what the imports made lives as long as the process: the collection at the end skips it
    _call_observer(spec, lab_file)
    sys.argv = [lab_file] + sys.argv[2:]
    sys.path.insert(0, os.path.dirname(lab_file))  # as `python lab.py` would
    write_event(READY)
    dumper = _DumpOnRequest(spec.run_dir, rank)
    try:
        runpy.run_path(lab_file, run_name="__main__")
    except SystemExit as exc:
        dumper.close()
        code = exc.code
        if code in (None, 0):
            _finished(spec.run_dir, rank)
        else:
            where = [f for f in _lab_frames(exc.__traceback__, lab_file) if os.path.abspath(f.filename) == lab_file]
            at = {"lab_line": where[-1].lineno, "lab_code": (where[-1].line or "").strip()} if where else {}
            write_event(EXIT, code=code if isinstance(code, int) else 1, message=str(code), **at)
        raise
    except KeyboardInterrupt:
        dumper.close()
        write_event(INTERRUPTED)
        raise
    except BaseException as exc:  # noqa: BLE001 - recorded, then the rank fails as it would have
        dumper.close()
        _record_exception(exc, lab_file, spec.run_dir, rank)
        sys.exit(1)
    dumper.close()
    _finished(spec.run_dir, rank)


if __name__ == "__main__":
    main()
