"""A check's observer: which ranks write files into a folder, and how (lab 05's checkpoints).

Lab 05's check names it in the run's spec (``observer="ddpcourse.checks.write_observer:observe"``, with
``observer_options={"folder": ..., "delay": seconds}``); every rank calls it before the lab runs. It replaces
no function of torch's or the OS's: it listens.
- ``sys.addaudithook``: Python's audit events ``open`` (a file under the folder opened for writing: who
  writes) and ``os.rename`` (raised by os.rename and os.replace alike: the rename, with the source's size);
- ``sys.setprofile``, only on a thread that opened a file under the folder for writing, until its next rename:
  the ``c_call`` event of ``os.fsync``, with the file's size at that moment;
- a file opened for writing under the folder waits ``delay`` seconds first (a slow disk): a rank that does
  not wait for rank 0's write then finds no new file, every time.
What each rank finds in the folder once ``save_checkpoint`` returned is the lab's own report (its main).
"""
import os
import sys
import threading
import time

from ddpcourse.launch.events import REPORT, WROTE, write_event

WATCH_LOG_KEY = "_watched_folder_log"  # the report value that holds what happened in the watched folder
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def observe(spec, lab_file):
    """The observer (see RunSpec.observer): watch ``spec.observer_options["folder"]`` while the lab runs."""
    options = spec.observer_options
    watch_writes(options["folder"], float(options.get("delay", 0.0)))


def _for_writing(args):
    """Whether the audit event ``open``'s arguments (path, mode, flags) open the file for writing."""
    mode = args[1] if len(args) > 1 else None
    flags = args[2] if len(args) > 2 else 0
    if isinstance(mode, str):
        return any(letter in mode for letter in "wax+")
    return isinstance(flags, int) and bool(flags & WRITE_FLAGS)


def watch_writes(folder, delay=0.0):
    """Log, as the report value WATCH_LOG_KEY, every write into ``folder`` of this rank (see the docstring)."""
    folder = os.path.abspath(folder) + os.sep
    log, opened = [], threading.local()  # opened.path: the file under the folder this thread opened last

    def note(**entry):
        log.append(entry)
        write_event(REPORT, values={WATCH_LOG_KEY: log})

    def inside(path):
        if not isinstance(path, (str, bytes, os.PathLike)):
            return None
        path = os.path.abspath(os.fsdecode(path))
        return path if path.startswith(folder) else None

    def size(path):
        try:
            return os.stat(path).st_size
        except OSError:
            return None

    def profile(frame, event, function):
        if event == "c_call" and function is os.fsync and getattr(opened, "path", None):
            note(op="fsync", path=os.path.relpath(opened.path, folder), size=size(opened.path))

    def hook(event, args):
        if event == "open" and args:
            path = inside(args[0])
            if path is None:
                return
            if _for_writing(args):
                write_event(WROTE, path=path)
                note(op="open", path=os.path.relpath(path, folder))
                opened.path = path
                sys.setprofile(profile)  # this thread, from now until its rename: is os.fsync called?
                time.sleep(delay)
        elif event == "os.rename" and len(args) >= 2:
            target = inside(args[1])
            if target is None:
                return
            write_event(WROTE, path=target)
            source = inside(args[0])
            note(op="replace", src=os.path.relpath(source, folder) if source else os.fsdecode(args[0]),
                 dst=os.path.relpath(target, folder), size=size(os.fsdecode(args[0])))
            sys.setprofile(None)
            opened.path = None

    sys.addaudithook(hook)
