"""A worker hook for checks: which ranks write files under a folder, and how.

Named in $DDPCOURSE_WORKER_HOOKS as ``ddpcourse.watch_writes:install``; lab 05's check sets both that and
$DDPCOURSE_WATCH_WRITES. Lab 05's check uses it to see which ranks write the checkpoint and whether
they write it atomically (ddpcourse/checks/lab05.py).
"""
import functools
import hashlib
import os
import sys
import time

from ddpcourse.events import REPORT, WROTE, write_event

WATCH_WRITES_ENV = "DDPCOURSE_WATCH_WRITES"  # set by a check: report files written under this folder
WATCH_RETURNS_ENV = "DDPCOURSE_WATCH_RETURNS"  # lab functions (comma-separated) whose returns are logged
WATCH_LOG_KEY = "_watched_folder_log"  # the report value that holds what happened in the watched folder
WATCH_DELAY_ENV = "DDPCOURSE_WATCH_DELAY"  # seconds each torch.save into the watched folder waits first


def install(lab_file):
    """The hook: watch $DDPCOURSE_WATCH_WRITES while ``lab_file`` runs (nothing when it is not set)."""
    if os.environ.get(WATCH_WRITES_ENV):
        watch_writes(os.environ[WATCH_WRITES_ENV], lab_file)


def watch_writes(folder, lab_file):
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

    def noting_returns(function):
        @functools.wraps(function)
        def watched_function(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            finally:
                note(op="returned", function=function.__name__, files=folder_digests())
        return watched_function

    def wrap_when_defined(frame, event, arg):
        """Line by line through the lab's module body only: once it has defined every watched function,
        replace each with a wrapper that notes its returns, and stop tracing. A profiler that watched every
        call instead slowed the whole run down (torch's imports in DDP's constructor: seconds)."""
        namespace = frame.f_globals
        if all(callable(namespace.get(name)) for name in functions):
            for name in functions:
                namespace[name] = noting_returns(namespace[name])
            sys.settrace(None)
            return None
        return wrap_when_defined

    def find_lab_module(frame, event, arg):
        code = frame.f_code
        return wrap_when_defined if code.co_filename == lab_file and code.co_name == "<module>" else None

    torch.save, os.fsync, os.replace, os.rename = save, fsync, renamer(original_replace), renamer(original_rename)
    if functions:
        sys.settrace(find_lab_module)
