"""The files of a run folder between the ranks, the agents and the launcher: events (one JSON line per event,
one file per rank) and the agents' saved failures.

The rank bootstrap (ddpcourse.launch.rank) and ``report()`` write ``rank<r>.events`` in the run folder (its
RunSpec's run_dir); the launcher reads them while the run goes on and once it is over. Kinds:

    started      the worker began (pid, local_rank, restart: torchrun's restart count)
    ready        the script is about to run: imports are done, the launcher's timeout starts
    report       values the script passed to report(...)
    wrote        a file written under a watched folder (a check's observer: ddpcourse.checks.write_observer)
    exception    the exception that ended the rank (type, message, traceback, todo, lab_line)
    exit         sys.exit with a non-zero code (code, message)
    finished     the script ran to its end (process_group_open: the default group was still initialized)
    interrupted  KeyboardInterrupt

This module never imports torch: the launcher process imports it too.
"""
import json
import os
import time
from enum import Enum
from pathlib import Path

from ddpcourse.launch.spec import current_spec

class EventKind(str, Enum):
    """What one line of a rank's event file records (the table above). A str, so a line read back as JSON
    compares equal to its kind."""
    STARTED = "started"
    READY = "ready"
    REPORT = "report"
    WROTE = "wrote"
    EXCEPTION = "exception"
    EXIT = "exit"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"

    __str__ = str.__str__


# Module names for the kinds, as the writers (rank, report(), observers) and readers use them.
STARTED, READY, REPORT, WROTE = EventKind.STARTED, EventKind.READY, EventKind.REPORT, EventKind.WROTE
EXCEPTION, EXIT, FINISHED, INTERRUPTED = EventKind.EXCEPTION, EventKind.EXIT, EventKind.FINISHED, EventKind.INTERRUPTED
ENDINGS = (EXCEPTION, EXIT, FINISHED, INTERRUPTED)
SERVE_STORE = "--serve-store"  # the agent option of the one agent that serves a multi-node run's store


def _rank():
    return int(os.environ.get("RANK", "0"))


def write_event(kind, **fields):
    """Append one event to this rank's event file; a no-op outside the launcher."""
    spec = current_spec()
    if spec is None:
        return
    run_dir = spec.run_dir
    event = {"event": kind, "time": time.time(), "pid": os.getpid(), **fields}
    line = (json.dumps(event) + "\n").encode("utf-8")
    # One write() of the whole line in append mode: a reader sees it whole or not at all (killed mid-write:
    # a partial last line, which the reader skips).
    fd = os.open(os.path.join(run_dir, f"rank{_rank()}.events"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


class RankFiles:
    """Follows the files rank<r><suffix> of a run folder as the ranks append to them: complete lines only.

    The launcher reads two kinds this way: the ranks' event files (here) and their output logs."""

    def __init__(self, run_dir, suffix):
        self.run_dir, self.suffix = Path(run_dir), suffix
        self.offsets, self.partial = {}, {}

    def poll(self):
        """The complete lines appended since the last call, as (rank, bytes) in rank order."""
        new = []
        for path in sorted(self.run_dir.glob(f"rank*{self.suffix}")):
            rank = int(path.name[len("rank"):-len(self.suffix)])
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets.get(rank, 0))
                    chunk = f.read()
            except OSError:
                continue
            if not chunk:
                continue
            self.offsets[rank] = self.offsets.get(rank, 0) + len(chunk)
            *lines, rest = (self.partial.pop(rank, b"") + chunk).split(b"\n")
            if rest:
                self.partial[rank] = rest
            new.extend((rank, line) for line in lines)
        return new

    def remainders(self):
        """Each rank's last line without a newline (read mid-write, or the last output); then forgotten."""
        rest = sorted(self.partial.items())
        self.partial.clear()
        return rest


class EventReader:
    """Follows every rank's event file as it grows; only complete lines count.

    ``events(rank)`` is that rank's latest attempt: a rank restarted by torchrun starts a new history.
    A line cut short (read mid-write, or its rank killed while writing) is never parsed; at the end of a
    run such a remainder is dropped.
    """

    def __init__(self, run_dir):
        self.files = RankFiles(run_dir, ".events")
        self.rows = {}

    def poll(self):
        """Read what was appended since the last call; returns the new events as (rank, event)."""
        new = []
        for rank, line in self.files.poll():
            try:
                event = json.loads(line)
            except ValueError:  # not one of ours (a damaged line): skip it, never crash
                continue
            if event.get("event") == STARTED:
                self.rows[rank] = []
            self.rows.setdefault(rank, []).append(event)
            new.append((rank, event))
        return new

    def close(self):
        """The final read: complete lines only; a partial last line is dropped."""
        self.poll()
        self.files.remainders()

    def events(self, rank):
        return self.rows.get(rank, [])

    def ranks(self):
        return sorted(self.rows)

    def first(self, rank, kind):
        return next((e for e in self.events(rank) if e.get("event") == kind), None)

    def reports(self, rank):
        merged = {}
        for event in self.events(rank):
            if event.get("event") == REPORT:
                merged.update(event["values"])
        return merged


def read_events(run_dir, rank):
    """One rank's events of its latest attempt, read whole at once (complete lines only): for a rank reading
    its peers', where the launcher follows them with an EventReader."""
    try:
        with open(os.path.join(run_dir, f"rank{rank}.events"), "rb") as f:
            lines = f.read().split(b"\n")[:-1]  # the last piece has no newline yet, or is empty
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == STARTED:
            events = []
        events.append(event)
    return events


# ----------------------------------------------------------------------------- the agents' failures
def failures_file(run_dir, pid):
    return os.path.join(run_dir, f"agent-{pid}.failures.json")


def read_failures(run_dir):
    """{rank: {exitcode, local_rank, pid, message}} of every failed rank, from every agent of the run."""
    found = {}
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("agent-") and name.endswith(".failures.json"):
            with open(os.path.join(run_dir, name), encoding="utf-8") as f:
                found.update({int(rank): row for rank, row in json.load(f).items()})
    return found
