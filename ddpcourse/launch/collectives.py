"""Which collective each rank was in when a run hung or crashed, from torch's flight recorder, and the cause.

torch records every collective a process group launches in a ring buffer, its *flight recorder*, when
``TORCH_FR_BUFFER_SIZE`` is above 0 (build_env sets it for every run; gloo records too). Each entry is
structured: the group, the collective's sequence number in that group, the op, the sizes and dtypes of its
tensors, whether it has completed, and the Python frames that called it. ddpcourse.launch.rank writes a rank's
buffer (``torch._C._distributed_c10d._dump_fr_trace()``, a pickle of plain dicts, lists and strings) to
``rank<r>.collectives`` when the rank records an exception, and when the launcher asks at a timeout (the
request file below: the rank's main thread is blocked in C++ then, a thread of the rank answers).

This module reads those dumps without torch and says, in a line or two ahead of the stacks:
- which collective each rank was waiting in (op, sizes, dtype, sequence number, the script's line);
- the first sequence number at which the ranks' calls disagree: another op, other sizes or dtypes, or the
  same op called from another line of the script (one rank's extra call shifts every later number);
- a rank in no collective while the others wait in one: the likely cause, with the line its stack is at.
torch ships an analyser of the same dumps (``python -m torch.distributed.flight_recorder.fr_trace``); in
torch 2.13 it stops with a KeyError on gloo's dumps (their ``pg_config`` names the default group ``""``
while the entries name it ``"0"``), so the launcher compares the entries itself, by the same rule: first
by sequence number, then by op, sizes and dtypes.
"""
import linecache
import os
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path

BUFFER_SIZE_ENV = "TORCH_FR_BUFFER_SIZE"
BUFFER_SIZE = 2000  # entries kept per process: a lab launches tens to hundreds of collectives; the ring keeps the newest
DUMP_REQUEST = "dump-collectives"
# the recorder's dtype names (c10's ScalarType) as torch spells them in Python
DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
          "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool"}  # a file in the run folder: its existence asks every live rank for its buffer


def dump_file(run_dir, rank):
    return Path(run_dir) / f"rank{rank}.collectives"


@dataclass(frozen=True)
class CollectiveCall:
    """One collective as a rank's flight recorder saw it."""
    group: str          # the process group's name ("0": the default group)
    seq: int            # its number among the group's collectives (1 = the first)
    op: str             # "all_reduce", "broadcast", "barrier", ...
    sizes: tuple        # the input tensors' shapes
    dtypes: tuple       # "Float", "Long", ...
    completed: bool
    line: int = None    # the innermost line of the script that made the call (None: not called from it)
    code: str = ""      # that line's text

    def describe(self, script=""):
        """"all_reduce #3 of float32[4] at train.py:16 (dist.all_reduce(loss))"."""
        tensors = ", ".join(f"{DTYPES.get(dtype, dtype)}{list(size)}" for size, dtype in zip(self.sizes, self.dtypes))
        where = f" at {script}:{self.line}" + (f" ({self.code})" if self.code else "") if self.line else ""
        group = f" in group {self.group}" if self.group != "0" else ""  # "0": the default group
        return f"{self.op} #{self.seq}{group}{f' of {tensors}' if tensors else ''}{where}"

    def signature(self):
        return (self.op, self.sizes, self.dtypes)


@dataclass
class HangReport:
    """What the ranks' flight recorders say about a run that hung or crashed in its collectives."""
    waiting: dict = field(default_factory=dict)   # rank -> the CollectiveCall it had not completed
    failed_in: dict = field(default_factory=dict)  # rank -> the CollectiveCall that raised its exception
    outside: list = field(default_factory=list)   # ranks alive in no collective while others wait
    outside_lines: dict = field(default_factory=dict)  # rank -> (line, code) of its stack in the script
    disagreement: int = None                      # the first sequence number whose calls differ across ranks
    calls_at: dict = field(default_factory=dict)  # rank -> its CollectiveCall at that sequence number
    mismatch: str = ""                            # "op", "sizes", "dtypes" or "line": what differs there
    ended_after: dict = field(default_factory=dict)  # rank -> its last collective, for ranks that ended (in no
                                                     # collective, not alive) with fewer than a waiting rank made
    recorded: list = field(default_factory=list)  # the ranks whose buffers were read

    @property
    def likely_cause(self):
        """The rank to name first: one outside every collective, else the first of the disagreement."""
        if self.outside:
            return self.outside[0]
        return min(self.calls_at) if self.calls_at else None

    def lines(self, script):
        """One or two sentences a learner acts on, then the collective each rank was in."""
        out = []
        for rank in self.outside:
            line, code = self.outside_lines.get(rank, (None, ""))
            where = f" (its stack is at {script}:{line}: {code})" if line else ""
            waiting = sorted(self.waiting)
            out.append(f"Likely cause: rank {rank} is in no collective{where} while rank(s) {waiting} wait in one.")
        stuck = {**self.failed_in, **self.waiting}
        for rank, last in sorted(self.ended_after.items()):
            longer = sorted(r for r, call in stuck.items() if call.group == last.group and call.seq > last.seq)
            out.append(f"Rank {rank} ended after collective #{last.seq} while rank(s) {longer} went on to more: "
                       f"they made a collective that rank {rank} never made.")
        if self.disagreement is not None:
            differ = {"op": "different collectives", "sizes": "different sizes", "dtypes": "different dtypes",
                      "line": "the same collective from different lines"}[self.mismatch]
            calls = "; ".join(f"rank {r}: {call.describe(script)}" for r, call in sorted(self.calls_at.items()))
            group = next(iter(self.calls_at.values())).group
            named = f" of group {group}" if group != "0" else ""
            out.append(f"The ranks disagree first at collective #{self.disagreement}{named} ({differ}): {calls}.")
        for rank in sorted(stuck):
            verb = "failed in" if rank in self.failed_in else "waits in"
            out.append(f"  rank {rank} {verb} {stuck[rank].describe(script)}")
        return out


def request_dumps(run_dir):
    Path(run_dir, DUMP_REQUEST).touch()


def read_dumps(run_dir, ranks, wait=2.0):
    """{rank: dump} of the ``ranks`` whose buffer was written within ``wait`` seconds (a dump is written to a
    temporary name and renamed, so a file that exists is whole)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and not all(dump_file(run_dir, r).exists() for r in ranks):
        time.sleep(0.05)
    dumps = {}
    for rank in ranks:
        try:
            dumps[rank] = pickle.loads(dump_file(run_dir, rank).read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError):
            continue
    return dumps


def calls_of(dump, lab_file):
    """The CollectiveCalls in one rank's dump, oldest first (point-to-point operations left out)."""
    lab_file = os.path.abspath(lab_file)
    status = dump.get("pg_status", {})
    calls = []
    for entry in dump.get("entries", []):
        if entry.get("is_p2p"):
            continue
        group = str(entry["process_group"][0])
        seq = int(entry["collective_seq_id"])
        done = entry.get("state") == "completed" or seq <= int(
            status.get(group, {}).get("last_completed_collective", -1))
        line, code = None, ""
        for frame in entry.get("frames", []):  # innermost first
            if os.path.abspath(frame.get("filename", "")) == lab_file:
                line = int(frame["line"])
                code = _source_line(lab_file, line)
                break
        op = entry.get("profiling_name", "").split(":")[-1]
        calls.append(CollectiveCall(group, seq, op, tuple(tuple(s) for s in entry.get("input_sizes", [])),
                                    tuple(entry.get("input_dtypes", [])), done, line, code))
    return calls


def _source_line(path, line):
    return linecache.getline(path, line).strip()


def analyse(dumps, lab_file, alive=(), raised=None, stack_lines=None):
    """The HangReport of a run from its ranks' dumps ({rank: dump}). alive: the ranks still running (a rank
    that is alive, recorded, and in no collective while another waits is named); raised: {rank: the script's
    line its exception came from} (the recorder counts a collective that raised as completed: a rank's last
    call made from that line is the one it failed in); stack_lines: {rank: (line, code)} of each rank's
    innermost frame in the script, from its stack."""
    calls = {rank: calls_of(dump, lab_file) for rank, dump in sorted(dumps.items())}
    report = HangReport(recorded=sorted(calls))
    for rank, found in calls.items():
        pending = [c for c in found if not c.completed]
        if pending:  # the one its stack is at; else the newest (a call that raised in another group stays open)
            at = (stack_lines or {}).get(rank)
            report.waiting[rank] = next((c for c in reversed(pending) if at and c.line == at[0]), pending[-1])
        elif found and (raised or {}).get(rank) is not None and found[-1].line == raised[rank]:
            report.failed_in[rank] = found[-1]
    stuck = {**report.failed_in, **report.waiting}
    if stuck:
        report.outside = [r for r in sorted(calls) if r in alive and r not in stuck]
        report.outside_lines = {r: stack_lines[r] for r in report.outside if stack_lines and r in stack_lines}
        for rank, found in calls.items():
            if rank in alive or rank in stuck or rank in (raised or {}) or not found:
                continue
            last = found[-1]
            if any(c.group == last.group and c.seq > last.seq for c in stuck.values()):
                report.ended_after[rank] = last
    _first_disagreement(calls, report)
    return report


def _first_disagreement(calls, report):
    """Compare the ranks' calls group by group, number by number. A difference of op, sizes or dtypes is a
    mismatch wherever it is; a call from another line only counts when there is no such mismatch (ranks may
    make one collective from two branches of an if). The group the ranks are stuck in comes first: an earlier
    group's mismatch may have ended long ago (a timeout raised and was caught)."""
    by_group = {}
    for rank, found in calls.items():
        for call in found:
            by_group.setdefault(call.group, {}).setdefault(call.seq, {})[rank] = call
    stuck = {call.group for call in [*report.waiting.values(), *report.failed_in.values()]}
    found = []  # (weak, not stuck, seq, calls, what)
    for group, numbered in by_group.items():
        for strength in ("strong", "weak"):
            for seq in sorted(numbered):
                what = _what_differs(numbered[seq].values())
                if what and (what == "line") == (strength == "weak"):
                    found.append((strength == "weak", group not in stuck, seq, numbered[seq], what))
                    break
    if found:
        _, _, report.disagreement, report.calls_at, report.mismatch = min(found, key=lambda f: f[:3])


def _what_differs(calls):
    """What differs among one number's calls: op, sizes, dtypes, else the line (compared among the calls whose
    line is known: a rank that ended well records its calls without their frames)."""
    calls = list(calls)
    for name, key in (("op", lambda c: c.op), ("sizes", lambda c: c.sizes), ("dtypes", lambda c: c.dtypes)):
        if len({key(c) for c in calls}) > 1:
            return name
    return "line" if len({c.line for c in calls if c.line is not None}) > 1 else ""
