"""What each rank runs under the launcher, as torchrun's worker script: ``_worker.py FILE ARGS...``.

How a rank starts: on Linux torchrun forks it from its agent (``--run-path --start-method fork``, torch's own
options), which has imported torch already, so a rank costs milliseconds instead of a second import of
torch. On macOS, for runs torchrun may restart, and for one rank without torchrun it is a fresh interpreter,
``python -m ddpcourse._worker FILE`` (see ddpcourse.launcher.forks_ranks). Either way it wraps the script so the launcher can tell a learner precisely what happened (ddpcourse.events):
- the rank's stdout and stderr go, in order, to one log file per rank (the launcher tags and streams it);
- ``faulthandler`` dumps every thread's Python stack to a file on SIGUSR1 (used at a timeout);
- torch is imported *before* the "ready" event when the script imports it, so the launcher's timeout
  measures the script, not the imports;
- the exception that ended the rank, or its exit code, is recorded with a timestamp, so the launcher
  can name the root-cause rank instead of printing torchrun's wall of text;
- at the end of the script it records whether the default process group is still open (a lab must call
  ``dist.destroy_process_group()``; the launcher reports an open one, and that rank exits normally); a rank
  whose group was destroyed runs its atexit handlers and skips finalization (see _exit_skipping_finalization);
  a forked rank never finalizes: torch's multiprocessing ends it with ``os._exit`` once its agent has its result;
- a watchdog ends the rank and its children if its parent (torchrun's agent, or the launcher) dies;
- rank 0's store for init_process_group is torch's own, which listens on every interface for as long as rank 0
  runs: handing it a loopback socket (``TCPStore(master_listen_fd=...)``, as the agent does for the rendezvous
  store) made ranks abort at exit more often: 6 of 24 three-rank runs of solutions/03, against 0 of 6 without it and
  0 of 20 under plain torchrun, on an idle machine (docs/troubleshooting.md, the macOS firewall row; under load a
  bare torchrun aborts too: see _exit_skipping_finalization);
- hooks named in $DDPCOURSE_WORKER_HOOKS ("module:function,...") are called with the script's path before
  it runs: lab 05's check uses ddpcourse.watch_writes to see which ranks write its checkpoints, and how.
"""
import ast
import atexit
import faulthandler
import importlib
import os
import runpy
import signal
import sys
import traceback

from ddpcourse.events import EXCEPTION, EXIT, FINISHED, INTERRUPTED, READY, RUN_DIR_ENV, STARTED, write_event
from ddpcourse.processes import watch_parent
from ddpcourse.todos import todo_in_message
# The write-watching hook's settings, re-exported for the checks that import them from here.

HOOKS_ENV = "DDPCOURSE_WORKER_HOOKS"  # "module:function,...": each is called with the script's path first


def _redirect_output(run_dir, rank):
    # Raw descriptors, not file objects: nothing for Python to warn about ("unclosed file") at exit.
    log = os.open(os.path.join(run_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)  # both streams into one file keeps their relative order
    os.dup2(log, 2)
    os.close(log)
    stacks = os.open(os.path.join(run_dir, f"rank{rank}.stacks"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    if hasattr(signal, "SIGUSR1"):  # not on Windows
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    faulthandler.enable(file=2)  # a segfault still leaves a stack in the log


def _lab_frames(tb, lab_file):
    """The traceback entries from the lab file onwards (the bootstrap and runpy are noise)."""
    entries = traceback.extract_tb(tb)
    for i, entry in enumerate(entries):
        if os.path.abspath(entry.filename) == lab_file:
            return entries[i:]
    return entries


def _record_exception(exc, lab_file):
    frames = _lab_frames(exc.__traceback__, lab_file)
    text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
    text += "".join(traceback.format_exception_only(type(exc), exc))
    fields = {"type": type(exc).__name__, "message": str(exc), "traceback": text}
    lab_lines = [f for f in frames if os.path.abspath(f.filename) == lab_file]
    if lab_lines:
        fields["lab_line"] = lab_lines[-1].lineno
    todo = todo_in_message(str(exc)) if isinstance(exc, NotImplementedError) else None
    if todo:
        fields["todo"] = {"number": todo[0], "hint": todo[1]}
    # Not printed here: the launcher prints the root-cause rank's traceback once, not once per rank.
    write_event(EXCEPTION, **fields)


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


def _hooks():
    return [spec.strip() for spec in os.environ.get(HOOKS_ENV, "").split(",") if spec.strip()]


def _run_hooks(lab_file):
    for spec in _hooks():
        module, _, function = spec.partition(":")
        getattr(importlib.import_module(module), function)(lab_file)


def _process_group_open():
    distributed = sys.modules.get("torch.distributed")
    return bool(distributed and distributed.is_available() and distributed.is_initialized())


def _forked_from_agent():
    """Whether torchrun forked this rank from its agent (``--run-path --start-method fork``)."""
    import multiprocessing

    return multiprocessing.parent_process() is not None


def _as_a_fresh_process():
    """Undo what a forked rank inherits from torchrun's agent and a fresh ``python`` would not have: the agent's
    signal handlers (its SIGTERM raises an exception instead of ending the process) and its atexit handlers
    (they clean up the agent's own files)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("SIGTERM", "SIGHUP", "SIGQUIT"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    atexit._clear()


def _finished():
    """Record the end of the script and whether the default process group is still open; a rank whose group
    was destroyed then ends without the interpreter's finalization (see _exit_skipping_finalization)."""
    group_open = _process_group_open()
    write_event(FINISHED, process_group_open=group_open)
    if _forked_from_agent():  # torch's multiprocessing ends it with os._exit: only the script's handlers to run
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    elif not group_open:
        _exit_skipping_finalization()


def _exit_skipping_finalization():
    """Run the atexit handlers, flush, and end without the interpreter's finalization.

    Only after a correct ``destroy_process_group()``: a group left open is reported and the interpreter exits
    normally. Why: torch 2.13 on gloo aborts at interpreter exit now and then, after a correct destroy
    ("terminate called without an active exception", SIGABRT). benchmarks/exit_after_destroy.py shows it with
    no course code at all: a bare torchrun of a five-step DDP script, 3 ranks, 2 busy processes beside (3 of
    30 runs here). The mechanism is torch's: a C++ thread that takes the GIL while the interpreter finalizes
    is ended by Python, and the unwind through a C++ destructor calls std::terminate; see
    https://github.com/pytorch/pytorch/issues/38228
    (the cause, with a maintainer's analysis) and https://github.com/pytorch/pytorch/issues/190489 (the same
    message from gloo and autograd threads at exit). Skipping finalization skips that window; remove this
    shortcut once the reproducer runs clean on the pinned torch.
    """
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: python -m ddpcourse._worker FILE [ARGS...]")
    lab_file = os.path.abspath(sys.argv[1])
    run_dir = os.environ[RUN_DIR_ENV]
    rank = int(os.environ.get("RANK", "0"))
    if _forked_from_agent():
        _as_a_fresh_process()
    _redirect_output(run_dir, rank)
    watch_parent()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    write_event(STARTED, local_rank=int(os.environ.get("LOCAL_RANK", "0")), restart=restart)
    if restart:  # the same log continues: mark where the new attempt begins
        print(f"--- torchrun restarted this rank (restart {restart}) ---", flush=True)
    if _imports_torch(lab_file):
        import torch  # noqa: F401 - the script's own import is then instant
        import torch.distributed  # noqa: F401
    _run_hooks(lab_file)
    sys.argv = [lab_file] + sys.argv[2:]
    sys.path.insert(0, os.path.dirname(lab_file))  # as `python lab.py` would
    write_event(READY)
    try:
        runpy.run_path(lab_file, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        if code in (None, 0):
            _finished()
            if _forked_from_agent():
                return  # a forked rank that ends well returns (torch then reads its result, code 0)
        else:
            write_event(EXIT, code=code if isinstance(code, int) else 1, message=str(code))
        raise
    except KeyboardInterrupt:
        write_event(INTERRUPTED)
        if _forked_from_agent():  # end as python does after an uncaught Ctrl-C (torch would exit 0)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        raise
    except BaseException as exc:  # noqa: BLE001 - recorded, then the rank fails as it would have
        _record_exception(exc, lab_file)
        sys.exit(1)
    _finished()


if __name__ == "__main__":
    main()
