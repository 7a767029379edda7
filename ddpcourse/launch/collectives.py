"""Which collective each rank was in when a run hung or crashed, from torch's flight recorder, and the cause.

torch records every collective a process group launches in a ring buffer, its *flight recorder*: one per
process for CPU (gloo) collectives, by default the newest 2000 entries of all its groups in torch 2.13 (nccl's
go to another recorder, of CUDA events, which ``_dump_fr_trace`` does not return)
(``TORCH_FR_BUFFER_SIZE=0`` turns it off; a bare torchrun records the same, the launcher adds nothing to it).
Each entry is structured: the group, the collective's number in that group (torch's count: the collectives
of DDP and other libraries count too), the op, the sizes and dtypes of its tensors, and the Python frames
that called it; a per-group status gives the number of the last one completed. ddpcourse.launch.rank writes
a rank's buffer (``_dump_fr_trace()``, a pickle of plain dicts, lists and strings) to ``rank<r>.collectives``
when the rank raises, when it finishes (without the frames: the first dump with them costs a second on an
idle machine, several on a loaded one), and when the launcher asks at a timeout (the request file below: the
rank's main thread is blocked in C++ then, a thread of the rank answers).

This module reads those dumps without torch and says, in a line or two ahead of the stacks:
- which collective each rank still running waits in, or failed in (op, sizes, dtype, number, the line);
- the first number at which the ranks' calls disagree, in the groups they wait in: another op, other sizes
  or dtypes, or the same op from another line (a finished rank's record has no lines), and calls from
  different lines before a mismatch (one rank's extra call shifts every later number);
- ranks that wait in different groups, when no rank in no collective explains it;
- a rank in no collective while the others wait in one: the likely cause, with the line its stack is at;
- a rank that ended with fewer collectives than one still waiting, with the lines that one called from.
torch ships an analyser of the same dumps (``python -m torch.distributed.flight_recorder.fr_trace``); in
torch 2.13 it stops with a KeyError on gloo's dumps: gloo records a group's ranks as its constructor runs,
before Python has named it, so ``pg_config`` holds one entry keyed ``""`` (the last group built) while the
entries name their groups. The launcher compares the entries itself, by the analyser's rule: number by
number, then op, sizes and dtypes.
"""
import linecache
import os
import pickle
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

DUMP_REQUEST = "dump-collectives"  # a file in the run folder: its existence asks every live rank for its buffer
# the same asked by a rank that failed in a collective: without the calls' frames (a millisecond, not the 1-5 s
# of torch's symbolizer), the line a peer waits at comes from its stack, asked for at the same time
PEER_REQUEST = "dump-collectives-for-a-peer"
# the recorder's dtype names (c10's ScalarType) as torch spells them in Python
DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
          "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool"}


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


def group_name(group):
    """How a learner reads a group's name: "0" is the default group (torch names groups by a counter)."""
    return "the default group" if group == "0" else f"group {group}"


@dataclass
class HangReport:
    """What the ranks' flight recorders say about a run that hung or crashed in its collectives."""
    waiting: dict = field(default_factory=dict)   # rank -> the CollectiveCall it waits in (ranks still running)
    failed_in: dict = field(default_factory=dict)  # rank -> the CollectiveCall that raised its exception
    outside: list = field(default_factory=list)   # ranks alive in no collective while others wait
    outside_lines: dict = field(default_factory=dict)  # rank -> (line, code) of its stack in the script
    disagreement: int = None                      # the first number whose calls differ across ranks
    calls_at: dict = field(default_factory=dict)  # rank -> its CollectiveCall at that number
    mismatch: str = ""                            # "op", "sizes", "dtypes" or "line": what differs there
    ended_after: dict = field(default_factory=dict)  # rank -> its last collective, for ranks that ended (in no
                                                     # collective, not alive) with fewer than a stuck rank made
    call_sites: dict = field(default_factory=dict)   # rank -> {line: calls} in the group, for the ranks that
                                                     # went on beyond an ended rank (their lines are known)
    lines_before: tuple = None  # (number, {rank: call}, "line"): calls from different lines before the mismatch

    @property
    def stuck(self):
        return {**self.failed_in, **self.waiting}

    @property
    def odd_one_out(self):
        """The one rank whose call at the disagreement differs from every other rank's, where those all agree
        (three ranks or more; with two, neither is odder than the other); else None."""
        if len(self.calls_at) < 3:
            return None
        key = {rank: (call.op, call.sizes, call.dtypes, call.line) for rank, call in self.calls_at.items()}
        for rank in sorted(key):
            others = {k for r, k in key.items() if r != rank}
            if len(others) == 1 and key[rank] not in others:
                return rank
        return None

    @property
    def likely_cause(self):
        """The rank to name first: one outside every collective, else the odd one out of the disagreement, else
        its first rank."""
        if self.outside:
            return self.outside[0]
        if self.odd_one_out is not None:
            return self.odd_one_out
        return min(self.calls_at) if self.calls_at else None

    def lines(self, script):
        """One or two sentences a learner acts on, then the collective each rank was in."""
        out, stuck = [], self.stuck
        for rank in self.outside:
            line, code = self.outside_lines.get(rank, (None, ""))
            where = f" (its stack is at {script}:{line}: {code})" if line else ""
            out.append(f"Likely cause: rank {rank} is in no collective{where} while rank(s) {sorted(stuck)} "
                       f"{'wait' if not self.failed_in else 'waited'} in one.")
        groups = sorted({call.group for call in self.waiting.values()})
        if len(groups) > 1 and not self.outside:  # a rank in no collective explains the wait better
            where = ", ".join(f"rank {r} in {group_name(c.group)}" for r, c in sorted(self.waiting.items()))
            out.append(f"The ranks wait in different process groups ({where}): every rank of a group must make "
                       "that group's collectives.")
        for rank, last in sorted(self.ended_after.items()):
            longer = sorted(r for r, call in stuck.items() if call.group == last.group and call.seq > last.seq)
            out.append(f"Rank {rank} ended after collective #{last.seq} while rank(s) {longer} went on to more: "
                       f"they made a collective that rank {rank} never made.")
            for other in longer:
                sites = ", ".join(f"{script}:{line} ({count})" for line, count in sorted(self.call_sites.get(other,
                                                                                                        {}).items()))
                if sites:
                    out.append(f"  rank {other}'s calls in {group_name(last.group)} came from {sites}")
        if self.disagreement is not None:
            differ = {"op": "different collectives", "sizes": "different sizes", "dtypes": "different dtypes",
                      "line": "the same collective from different lines"}[self.mismatch]
            calls = "; ".join(f"rank {r}: {call.describe(script)}" for r, call in sorted(self.calls_at.items()))
            group = group_name(next(iter(self.calls_at.values())).group)
            out.append(f"The ranks disagree first at collective #{self.disagreement} of {group} (torch's count: the "
                       f"collectives of DDP and other libraries count too), {differ}: {calls}.")
            odd = self.odd_one_out
            if odd is not None:
                rest = sorted(r for r in self.calls_at if r != odd)
                out.append(f"  Rank {odd} is the odd one out: ranks {rest} agree on their call there.")
        if self.lines_before:
            seq, calls_then, _ = self.lines_before
            where = "; ".join(f"rank {r}: {c.describe(script)}" for r, c in sorted(calls_then.items()))
            out.append(f"  Before that, at #{seq}, the ranks made it from different lines ({where}): one rank's extra "
                       "call shifts every later number.")
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
        group = str(entry["process_group"][0])  # its name: the same on every rank
        seq = int(entry["collective_seq_id"])
        # pg_status is keyed by the group's id in this process; it can lag a call that has just returned, so
        # it is read for ranks still waiting at a timeout only (analyse)
        done = seq <= int(status.get(str(entry.get("pg_id", group)), {}).get("last_completed_collective", -1))
        line, code = None, ""
        for frame in entry.get("frames", []):  # innermost first
            if os.path.abspath(frame.get("filename", "")) == lab_file:
                line = int(frame["line"])
                code = linecache.getline(lab_file, line).strip()
                break
        op = entry.get("profiling_name", "").split(":")[-1]
        calls.append(CollectiveCall(group, seq, op, tuple(tuple(s) for s in entry.get("input_sizes", [])),
                                    tuple(entry.get("input_dtypes", [])), done, line, code))
    return calls


def analyse(dumps, lab_file, alive=(), raised=None, stack_lines=None):
    """The HangReport of a run from its ranks' dumps ({rank: dump}). alive: the ranks still running (a rank
    that is alive, recorded, and in no collective while another waits is named); raised: {rank: the script's
    line its exception came from} (the recorder counts a collective that raised as completed: a rank's last
    call made from that line is the one it failed in); stack_lines: {rank: (line, code)} of each rank's
    innermost frame in the script, from its stack."""
    calls = {rank: calls_of(dump, lab_file) for rank, dump in sorted(dumps.items())}
    report = HangReport()
    for rank, found in calls.items():
        pending = [c for c in found if not c.completed]
        if rank in alive and pending:
            at = (stack_lines or {}).get(rank)
            call = _waited_on(pending, at)
            if call.line is None and at:  # recorded without frames (PEER_REQUEST): where its stack waits
                call = replace(call, line=at[0], code=at[1])
            report.waiting[rank] = call
        elif found and (raised or {}).get(rank) is not None and found[-1].line == raised[rank]:
            report.failed_in[rank] = found[-1]
    stuck = report.stuck
    if stuck:
        report.outside = [r for r in sorted(calls) if r in alive and r not in stuck]
        report.outside_lines = {r: stack_lines[r] for r in report.outside if stack_lines and r in stack_lines}
        for rank, found in calls.items():
            if rank in alive or rank in stuck or rank in (raised or {}):
                continue
            for other, call in stuck.items():  # compared in the group each stuck rank is in
                mine = [c for c in found if c.group == call.group]
                if mine and call.seq > mine[-1].seq:
                    report.ended_after[rank] = mine[-1]
                    lines = [c.line for c in calls[other] if c.group == call.group and c.line is not None]
                    report.call_sites[other] = {line: lines.count(line) for line in set(lines)}
        _first_disagreement(calls, report)
    return report


# ops whose every rank must pass tensors of the same sizes and dtypes (all_to_all, scatter, gather and the
# reduce-scatters may differ by design); gloo checks only the byte count it receives, and only where it receives
SAME_ON_EVERY_RANK = ("all_reduce", "broadcast", "reduce", "all_gather")


def silent_mismatch(dumps, lab_file):
    """For a run whose every rank finished: the first call, in each group's order, of an op in
    SAME_ON_EVERY_RANK whose sizes or dtypes differ across ranks, as a HangReport (disagreement, calls_at,
    mismatch), else None. Why: an int32 and a float32 all_reduce of 3 numbers move the same 12 bytes, so gloo
    adds one rank's bit patterns to the other's without an error, and the run ends as if nothing happened."""
    by_call = {}
    for rank, dump in sorted(dumps.items()):
        for call in calls_of(dump, lab_file):
            by_call.setdefault((call.group, call.seq), {})[rank] = call
    for (group, seq), calls in sorted(by_call.items(), key=lambda item: (item[0][1], item[0][0])):
        ops = {call.op for call in calls.values()}
        if len(calls) < 2 or len(ops) > 1 or ops.pop() not in SAME_ON_EVERY_RANK:
            continue
        what = _what_differs(calls.values())
        if what in ("sizes", "dtypes"):
            return HangReport(disagreement=seq, calls_at=calls, mismatch=what)
    return None


def _waited_on(pending, at):
    """The open call a running rank waits on: the oldest open one made from the line its stack is at (DDP
    launches every bucket's all-reduce from one backward() line, and waits on the oldest first), within the
    group of the newest such call (one line may call into several groups); without such a line (a wait() on
    async work), the oldest open one of the newest call's group."""
    here = [c for c in pending if at and c.line == at[0]] or pending
    group = here[-1].group
    return next(c for c in here if c.group == group)


def _first_disagreement(calls, report):
    """Compare the ranks' calls in the groups they are stuck in (an older group's mismatch may have ended long
    ago: a timeout raised and was caught), number by number. A difference of op, sizes or dtypes is a mismatch;
    a call from another line is one too, but ranks may make one collective from two branches of an if, so it is
    named as the disagreement only without a mismatch, and else said as what came before it."""
    stuck = {call.group for call in report.stuck.values()}
    by_group = {}
    for rank, found in calls.items():
        for call in found:
            if call.group in stuck:
                by_group.setdefault(call.group, {}).setdefault(call.seq, {})[rank] = call
    strong, weak = [], []
    for numbered in by_group.values():
        for seq in sorted(numbered):
            what = _what_differs(numbered[seq].values())
            if what:
                (weak if what == "line" else strong).append((seq, numbered[seq], what))
    strong, weak = sorted(strong, key=lambda f: f[0])[:1], sorted(weak, key=lambda f: f[0])[:1]
    chosen = (strong or weak or [None])[0]
    if chosen:
        report.disagreement, report.calls_at, report.mismatch = chosen
    if strong and weak and weak[0][0] < strong[0][0]:
        report.lines_before = weak[0]


def _what_differs(calls):
    """What differs among one number's calls: op, sizes, dtypes, else the line (compared among the calls whose
    line is known: a rank that ended well records its calls without their frames)."""
    calls = list(calls)
    for name, key in (("op", lambda c: c.op), ("sizes", lambda c: c.sizes), ("dtypes", lambda c: c.dtypes)):
        if len({key(c) for c in calls}) > 1:
            return name
    return "line" if len({c.line for c in calls if c.line is not None}) > 1 else ""
