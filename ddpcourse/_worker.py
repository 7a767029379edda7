"""What each rank runs under the launcher: ``python -m ddpcourse._worker FILE ARGS...``.

It wraps the script so the launcher can tell a learner precisely what happened (ddpcourse.events):
- the rank's stdout and stderr go, in order, to one log file per rank (the launcher tags and streams it);
- ``faulthandler`` dumps every thread's Python stack to a file on SIGUSR1 (used at a timeout);
- torch is imported *before* the "ready" event when the script imports it, so the launcher's timeout
  measures the script, not the imports;
- the exception that ended the rank, or its exit code, is recorded with a timestamp, so the launcher
  can name the root-cause rank instead of printing torchrun's wall of text;
- at the end of the script it records whether the default process group is still open (a lab must call
  ``dist.destroy_process_group()``), then the interpreter exits normally (atexit handlers, flushed files);
- a watchdog ends the rank and its children if its parent (torchrun's agent, or the launcher) dies;
- hooks named in $DDPCOURSE_WORKER_HOOKS ("module:function,...") are called with the script's path before
  it runs: a check uses one to watch what the script does (see WATCH_WRITES_ENV).
"""
import ast
import faulthandler
import hashlib
import importlib
import os
import runpy
import signal
import sys
import time
import traceback

from ddpcourse.events import (EXCEPTION, EXIT, FINISHED, INTERRUPTED, READY, REPORT, RUN_DIR_ENV, STARTED, WROTE,
                              write_event)
from ddpcourse.processes import watch_parent
from ddpcourse.todos import todo_in_message

HOOKS_ENV = "DDPCOURSE_WORKER_HOOKS"  # "module:function,...": each is called with the script's path first

WATCH_WRITES_ENV = "DDPCOURSE_WATCH_WRITES"  # set by a check: report files written under this folder
WATCH_RETURNS_ENV = "DDPCOURSE_WATCH_RETURNS"  # lab functions (comma-separated) whose returns are logged
WATCH_LOG_KEY = "_watched_folder_log"  # the report value that holds what happened in the watched folder
WATCH_DELAY_ENV = "DDPCOURSE_WATCH_DELAY"  # seconds each torch.save into the watched folder waits first


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


def _watch_writes(folder, lab_file):
    """Record every file this rank opens for writing (or renames into) under `folder`.

    Lets a check tell *which ranks* wrote a checkpoint, which the file itself cannot say. It also logs, as
    the report value WATCH_LOG_KEY, how the files got there (torch.save, os.fsync with the file's size at
    that moment, os.replace / os.rename) and, at every return from a lab function named in
    $DDPCOURSE_WATCH_RETURNS, the digest of every file in the folder: what that rank could read then.
    """
    folder = os.path.abspath(folder) + os.sep

    def hook(event, args):
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            mode = args[1] if len(args) > 1 and isinstance(args[1], str) else "r"
            path = os.path.abspath(os.fsdecode(args[0]))
            if path.startswith(folder) and any(flag in mode for flag in "wax+"):
                write_event(WROTE, path=path)
        elif event == "os.rename" and len(args) >= 2:
            path = os.path.abspath(os.fsdecode(args[1]))
            if path.startswith(folder):
                write_event(WROTE, path=path)

    sys.addaudithook(hook)
    # torch.save(obj, "path") writes from C++, unseen by the audit hook: wrap it (this mode is for checks,
    # and the labs import torch anyway). os.fsync and os.replace raise no audit event (or none after the
    # fact): wrapped too.
    import torch

    log, delay = [], float(os.environ.get(WATCH_DELAY_ENV, "0"))

    def note(**entry):
        log.append(entry)
        write_event(REPORT, values={WATCH_LOG_KEY: log})

    def watched(target):
        """`target`'s path relative to the folder (a path or an open file's name), or None if outside."""
        name = target if isinstance(target, (str, bytes, os.PathLike)) else getattr(target, "name", None)
        if not isinstance(name, (str, bytes, os.PathLike)):
            return None
        path = os.path.abspath(os.fsdecode(name))
        return os.path.relpath(path, folder) if path.startswith(folder) else None

    original_save, original_fsync = torch.save, os.fsync
    original_replace, original_rename = os.replace, os.rename

    def save(obj, f, *args, **kwargs):
        name = watched(f)
        if name is not None and isinstance(f, (str, bytes, os.PathLike)):
            write_event(WROTE, path=os.path.join(folder, name))
        if name is not None:
            # A slow write: a rank that does not wait for it (no barrier) returns from the save before the
            # file exists every time, instead of only when it happens to be faster than the writer.
            time.sleep(delay)
        result = original_save(obj, f, *args, **kwargs)
        if name is not None:
            note(op="save", path=name)
        return result

    def fsync(fd):
        number = fd if isinstance(fd, int) else fd.fileno()
        stat = os.fstat(number)
        result = original_fsync(fd)
        for root, _, files in os.walk(folder):
            for file in files:
                other = os.stat(os.path.join(root, file))
                if (other.st_dev, other.st_ino) == (stat.st_dev, stat.st_ino):
                    note(op="fsync", path=os.path.relpath(os.path.join(root, file), folder), size=stat.st_size)
        return result

    def renamer(original):
        def rename(src, dst, *args, **kwargs):
            target = watched(dst)
            size = os.stat(src).st_size if target is not None and os.path.exists(src) else None
            result = original(src, dst, *args, **kwargs)
            if target is not None:
                note(op="replace", src=watched(src) or os.fsdecode(src), dst=target, size=size)
            return result
        return rename

    def folder_digests():
        digests = {}
        for root, _, files in os.walk(folder):
            for file in files:
                path = os.path.join(root, file)
                try:
                    with open(path, "rb") as handle:
                        digests[os.path.relpath(path, folder)] = hashlib.sha1(handle.read()).hexdigest()
                except OSError:
                    pass  # renamed away while we looked
        return digests

    functions = set(filter(None, os.environ.get(WATCH_RETURNS_ENV, "").split(",")))

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "return" and code.co_name in functions and code.co_filename == lab_file:
            note(op="returned", function=code.co_name, files=folder_digests())

    torch.save, os.fsync, os.replace, os.rename = save, fsync, renamer(original_replace), renamer(original_rename)
    if functions:
        sys.setprofile(profile)


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


def _run_hooks(lab_file):
    for spec in filter(None, os.environ.get(HOOKS_ENV, "").split(",")):
        module, _, function = spec.strip().partition(":")
        getattr(importlib.import_module(module), function)(lab_file)


def _process_group_open():
    distributed = sys.modules.get("torch.distributed")
    return bool(distributed and distributed.is_available() and distributed.is_initialized())


def _finished():
    write_event(FINISHED, process_group_open=_process_group_open())


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: python -m ddpcourse._worker FILE [ARGS...]")
    lab_file = os.path.abspath(sys.argv[1])
    run_dir = os.environ[RUN_DIR_ENV]
    rank = int(os.environ.get("RANK", "0"))
    _redirect_output(run_dir, rank)
    watch_parent()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    write_event(STARTED, local_rank=int(os.environ.get("LOCAL_RANK", "0")), restart=restart)
    if restart:  # the same log continues: mark where the new attempt begins
        print(f"--- torchrun restarted this rank (restart {restart}) ---", flush=True)
    if _imports_torch(lab_file):
        import torch  # noqa: F401 - the script's own import is then instant
        import torch.distributed  # noqa: F401
    if os.environ.get(WATCH_WRITES_ENV):
        _watch_writes(os.environ[WATCH_WRITES_ENV], lab_file)
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
        else:
            write_event(EXIT, code=code if isinstance(code, int) else 1, message=str(code))
        raise
    except KeyboardInterrupt:
        write_event(INTERRUPTED)
        raise
    except BaseException as exc:  # noqa: BLE001 - recorded, then the rank fails as it would have
        _record_exception(exc, lab_file)
        sys.exit(1)
    _finished()


if __name__ == "__main__":
    main()
