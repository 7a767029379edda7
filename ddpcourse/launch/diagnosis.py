"""Which rank's failure explains a failed run, as data (RankFailure) and as one line a learner can act on.

Inputs are structured: each rank's events (ddpcourse.launch.events) and each rank's exit code as torchrun's
agent saw it (ChildFailedError.failures, saved by ddpcourse.launch.agent). No printed text is parsed, except the one thing only text carries: whether an exception was a
consequence of a peer going away (gloo says so in its message).
"""
import re
import signal
from dataclasses import dataclass
from enum import Enum

from ddpcourse.launch.events import ENDINGS, EXCEPTION, EXIT, FINISHED, INTERRUPTED

class FailureKind(str, Enum):
    """Why a run failed (RankFailure.kind): the one vocabulary the printer and the checks switch on."""
    EXCEPTION = "exception"                    # a Python exception in a rank (a syntax error too)
    EXIT = "exit"                              # sys.exit(non-zero), or an exit code without an exception
    SIGNAL = "signal"                          # a rank killed by a signal
    TODO = "todo"                              # a lab's TODO still raising NotImplementedError
    TIMEOUT = "timeout"                        # not finished within the timeout after every rank was ready
    STARTUP_TIMEOUT = "startup_timeout"        # the ranks did not get ready within the start-up limit
    OPEN_PROCESS_GROUP = "open_process_group"  # the script ended without destroy_process_group()

    __str__ = str.__str__


EXCEPTION_KIND, EXIT_KIND, SIGNAL, TODO = FailureKind.EXCEPTION, FailureKind.EXIT, FailureKind.SIGNAL, FailureKind.TODO
TIMEOUT, STARTUP_TIMEOUT = FailureKind.TIMEOUT, FailureKind.STARTUP_TIMEOUT
OPEN_PROCESS_GROUP = FailureKind.OPEN_PROCESS_GROUP
# Errors a rank gets *because another rank went away*: never the root cause while another rank has one.
PEER_GONE = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|"
                       r"ECONNRESET|Socket Timeout|Connection refused|recvBytes", re.I)


@dataclass
class RankFailure:
    """Why a run failed: the root-cause ``rank`` and what happened to it.

    kind: a FailureKind. exitcode: that rank's exit code (negative: killed by that signal), None if unknown.
    todo: the TODO number when kind is "todo". message: one line a learner can act on. details: the
    traceback or the peers' errors, formatted. error: "Type: first line" of the exception, if any.
    hint: the TODO's hint, if any."""
    rank: int
    kind: str
    exitcode: int = None
    todo: int = None
    message: str = ""
    details: str = ""
    error: str = ""
    hint: str = ""
    unused_parameters: list = None  # [[index, name]] of the parameters DDP says got no gradient on this rank
    group_never_formed: bool = False  # a timeout with every rank still in init_process_group


def not_runnable(display_file, exists, syntax):
    """The script does not exist or does not compile (``syntax``: the formatted error): found before a launch."""
    what = "does not exist" if not exists else "has a syntax error"
    return RankFailure(0, EXCEPTION_KIND, message=f"{display_file} {what}", details=syntax,
                       error=syntax.strip().splitlines()[-1])


def timed_out(events, world_size, display_file, timeout, started, startup_limit, collectives=None, in_init=False):
    """The run ran out of time: a hang once every rank was ready (``started``), or a start-up that did not
    end within ``startup_limit``. Named after the likely cause the flight recorders show (``collectives``, a
    HangReport), else the first rank still running (events: {rank: [event, ...]}). in_init: every rank's stack
    is in init_process_group, and no collective was recorded."""
    running = [r for r in range(world_size) if not any(e["event"] in ENDINGS for e in events.get(r, []))] or [0]
    if started:
        likely = collectives.likely_cause if collectives else None
        why = (f": every rank is still in init_process_group, so the process group never formed. torchrun started "
               f"{world_size} rank(s): a world_size or rank passed to init_process_group other than torchrun's "
               "(WORLD_SIZE, RANK), or another MASTER_ADDR or MASTER_PORT, keeps the ranks waiting for a peer "
               "that never comes") if in_init else ""
        return RankFailure(running[0] if likely is None else likely, TIMEOUT, group_never_formed=in_init,
                           message=f"{display_file} did not finish within {timeout:g} s of every rank being "
                                   f"ready{why}")
    return RankFailure(running[0], STARTUP_TIMEOUT,
                       message=f"{display_file}: the ranks did not start within {startup_limit:g} s")


def describe_exit(code, in_script=False):
    """How a process ended, said for a learner. in_script: it died while running the script (not while
    exiting after it), where a crash in native code has a likely cause in the script's own tensors."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        likely = {"SIGKILL": " (SIGKILL often means out of memory)"}
        if in_script:
            likely["SIGSEGV"] = (" (a crash in torch's C++ code: often a tensor read after its memory was freed or "
                                 "resized to 0, or written by a collective still in flight)")
        extra = likely.get(name, "")
        return f"was killed by {name}{extra}"
    return f"exited with code {code} without a Python exception (os._exit or a crash)"


def _exit_kind(code):
    return SIGNAL if code is not None and code < 0 else EXIT_KIND


def _first_line(text):
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def _error(row):
    return f"{row['type']}: {_first_line(row['message'])}"


def _peer_errors(exceptions):
    return "\n".join(f"  rank {r}: {row['type']}: {_first_line(row['message'])[:160]}" for r, row in exceptions)


def aborted_after_finishing(events, world_size, exit_codes):
    """The ranks killed by SIGABRT while exiting when that is all that went wrong: every rank ran its script
    to the end and left its process group, and no exit code says more than that abort (or torchrun's SIGTERM
    to the peers that followed it). torch 2.13 does this now and then at interpreter exit: a C++ thread takes
    the GIL while Python shuts down (pytorch#38228; benchmarks/exit_after_destroy.py counts it). The run's
    results are complete, so it is not the learner's failure; the launcher says so and the run counts as ok."""
    codes = {rank: code for rank, code in exit_codes.items() if code}
    for rank in range(world_size):
        ends = [row for row in events.get(rank, []) if row["event"] in (EXCEPTION, EXIT, FINISHED, INTERRUPTED)]
        if [row["event"] for row in ends] != [FINISHED] or ends[0].get("process_group_open"):
            return []
    if any(code not in (-signal.SIGABRT, -signal.SIGTERM) for code in codes.values()):
        return []
    return sorted(rank for rank, code in codes.items() if code == -signal.SIGABRT)


def root_cause(events, world_size, exit_codes, display_file, last_lines=None, died_in=None):
    """The RankFailure that explains the run, or None when every rank ended well.

    events: {rank: [event, ...]} of each rank's latest attempt; exit_codes: {rank: code} of the ranks
    whose process ended with a non-zero code (others: absent or 0); last_lines: {rank: (line, code)} of the
    script's line in the stack a rank's fatal signal left in its log (faulthandler), when it left one;
    died_in: {rank: the torch.distributed collective that stack was in} (stacks.collective_in)."""
    if aborted_after_finishing(events, world_size, exit_codes):
        return None
    exceptions, exits, finished, silent = [], [], [], []
    for rank in range(world_size):
        rows = events.get(rank, [])
        ends = [row for row in rows if row["event"] in (EXCEPTION, EXIT, FINISHED, INTERRUPTED)]
        if not ends:
            silent.append(rank)
        for row in ends:
            {EXCEPTION: exceptions, EXIT: exits, FINISHED: finished}.get(row["event"], []).append((rank, row))
    codes = {rank: code for rank, code in exit_codes.items() if code}
    silent = [r for r in silent if events.get(r) or r in codes]  # a rank that never started says nothing

    own = [(r, e) for r, e in exceptions if not PEER_GONE.search(e["message"])]
    if own or exits:
        rank, row = min(own + exits, key=lambda item: item[1]["time"])
        if row["event"] == EXIT:
            at = f" at {display_file}:{row['lab_line']} ({row.get('lab_code', '')})" if row.get("lab_line") else ""
            return RankFailure(rank, EXIT_KIND, codes.get(rank, row["code"]),
                               message=f"rank {rank} called sys.exit({row['message']}){at}.")
        return _exception_failure(rank, row, exceptions, codes, display_file)

    if silent or exceptions:
        # A rank that vanished without a Python exception (killed, os._exit) explains the peers' errors;
        # SIGTERM is torchrun stopping the survivors, so those come last.
        died = sorted((r for r in silent if codes.get(r)), key=lambda r: (codes[r] == -signal.SIGTERM, r))
        if died or (silent and not exceptions):
            rank = (died or silent)[0]
            code = codes.get(rank)
            op = (died_in or {}).get(rank)
            how = ("stopped without a Python exception" if code is None else
                   describe_exit(code, in_script=op is None))  # in a collective: said below, not a freed tensor
            others_finished = all(any(row["event"] == FINISHED for row in events.get(r, []))
                                  for r in range(world_size) if r != rank)
            lost = "." if others_finished else ": the other ranks lost their peer."
            line, text = (last_lines or {}).get(rank) or (None, "")
            at = (f" in {op}" if op else "") + (f" at {display_file}:{line} ({text})" if line else "")
            if op and code == -signal.SIGABRT:  # gloo's receiver checks the byte count it gets against its own call
                lost += (f" gloo aborts a rank whose {op} receives another number of bytes than its own call "
                         "expects: the ranks' calls differ in size or dtype.")
            return RankFailure(rank, _exit_kind(code), code, details=_peer_errors(exceptions),
                               message=f"rank {rank} {how}{at}{lost}")
        rank, row = min(exceptions, key=lambda item: item[1]["time"])
        early = [r for r, _ in finished]
        if early:
            return RankFailure(
                rank, EXCEPTION_KIND, codes.get(rank), details=row["traceback"], error=_error(row),
                message=f"rank {rank} failed in a collective because rank(s) {early} had already ended. "
                        "Every rank must make the same collective calls in the same order.")
        return _exception_failure(rank, row, exceptions, codes, display_file)

    open_group = [r for r, row in finished if row.get("process_group_open")]
    crashed = [r for r, _ in finished if codes.get(r, 0) not in (0, -signal.SIGTERM)]
    if open_group:
        rank = open_group[0]
        then = f", then {describe_exit(codes[rank])} while exiting" if rank in crashed else ""
        also = f" (ranks {open_group[1:]} too)" if open_group[1:] else ""
        return RankFailure(rank, OPEN_PROCESS_GROUP, codes.get(rank, 0),
                           message=f"rank {rank} ended with its process group open{also}{then}: call "
                                   "dist.destroy_process_group() at the end of the script.")
    if crashed:
        rank = crashed[0]
        return RankFailure(rank, _exit_kind(codes[rank]), codes[rank],
                           message=f"rank {rank} ran its script to the end, then {describe_exit(codes[rank])} "
                                   "while exiting.")
    return None


def _same_error(one, other):
    """Whether two ranks raised the same error: torch writes the raising rank's number into some messages (DDP's
    "did not receive grad for rank 1"), which makes them no less the same."""
    def without_rank(row):
        return _RANK_NUMBER.sub("rank #", row["message"])
    return one["type"] == other["type"] and without_rank(one) == without_rank(other)


_RANK_NUMBER = re.compile(r"\b([Rr]ank) \d+")


def _exception_failure(rank, row, exceptions, codes, display_file):
    todo = row.get("todo")
    if todo:
        hint = f": {todo['hint']}" if todo["hint"] else ""
        where = f" (line {row['lab_line']})" if "lab_line" in row else ""
        return RankFailure(rank, TODO, codes.get(rank), todo=todo["number"], hint=todo["hint"],
                           error=_error(row), details=row["traceback"].rstrip(),
                           message=f"TODO {todo['number']} in {display_file} is not done yet{where}{hint}")
    twins = sorted(r for r, e in exceptions if _same_error(e, row))
    if twins and twins[0] != rank:  # the same error on several ranks: name the lowest, whatever came first
        rank, row = twins[0], dict(exceptions)[twins[0]]
    same = sorted(r for r, e in exceptions if _same_error(e, row) and r != rank)
    also = f" (ranks {same} raised the same error)" if same else ""
    others = [(r, e) for r, e in exceptions if r != rank and r not in same]
    details = row["traceback"].rstrip()
    if others:
        details += "\nThe other ranks failed as a consequence:\n" + _peer_errors(others)
    return RankFailure(rank, EXCEPTION_KIND, codes.get(rank), error=_error(row), details=details,
                       message=f"rank {rank} raised {row['type']}: {_first_line(row['message'])}{also}",
                       unused_parameters=row.get("unused_parameters"))
