"""Run a script on N local processes under torchrun, and never hang or orphan a process.

Introduced in notebooks/00_start_here.ipynb. ``run_lab(file, nproc=2)`` in a notebook cell and
``python -m ddpcourse run FILE --nproc 2`` in a terminal both:

- write the run's RunSpec into a fresh run folder (ddpcourse.launch.spec) and run FILE under torchrun
  (``python -m ddpcourse.launch.agent``: torch.distributed.run plus a watchdog and failures saved as data),
  which starts every rank as a fresh interpreter (ddpcourse.launch.rank), one rank too; with this
  interpreter, rendezvous, MASTER_ADDR and gloo on the loopback interface, OMP_NUM_THREADS as the user set
  it or else the usable cores divided among the ranks (ddpcourse.launch.cores), output unbuffered;
- stream every rank's output live, tagged by rank (ddpcourse.launch.printing);
- return what the script passed to ``ddpcourse.report(...)``, per rank (ddpcourse.launch.events);
- on failure name the root-cause rank with its traceback (ddpcourse.launch.diagnosis);
- on a timeout, counted from the moment every rank is ready (imports done), show where every rank's
  Python stack was (ddpcourse.launch.stacks), then kill the whole process tree (ddpcourse.launch.processes); the
  Jupyter stop button (KeyboardInterrupt) does the same.

This process never imports torch: each launch already pays for its agent and its ranks importing it.
"""
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ddpcourse.launch import diagnosis
from ddpcourse.launch.api import RunInterrupted, RunResult  # noqa: F401 - RunResult: what run() returns
from ddpcourse.launch.cores import threads_per_rank
from ddpcourse.launch.events import EXCEPTION, READY, SERVE_STORE, WROTE, EventReader, RankFiles, read_failures
from ddpcourse.launch.printing import RunPrinter, verdict
from ddpcourse.launch.processes import kill_run, processes_of_run  # noqa: F401 - processes_of_run: notebook 00
from ddpcourse.launch.spec import RUN_SPEC_ENV, RunSpec
from ddpcourse.launch.collectives import analyse, read_dumps, request_dumps, silent_mismatch
from ddpcourse.launch.stacks import (collective_in, lab_line, ranks_in, stacks_text, where_ranks_are,
                                     where_stopped_ranks_were)
from ddpcourse.paths import COURSE_ROOT, compile_error, display_path

DEFAULT_TIMEOUT = 60.0   # seconds a run may take once every rank is ready
STARTUP_TIMEOUT = 120.0  # seconds the ranks may take to start (interpreters importing torch on a busy laptop)
POLL_SECONDS = 0.1  # how often the live output is refreshed; the end of the run is noticed at once


# ----------------------------------------------------------------------------- the launch
def _loopback_interface():
    return "lo0" if sys.platform == "darwin" else "lo"


def build_command(nproc, args=(), torchrun_args=(), rendezvous=None):
    """The command that starts one node's agent. rendezvous: None for one node (--standalone), else
    (port, run_id, nnodes, serve_store) for one of several agents meeting at 127.0.0.1:port."""
    if rendezvous is None:
        where = ["--standalone"]
    else:
        port, run_id, nnodes, serve_store = rendezvous
        where = ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                 "--rdzv-id", run_id, "--rdzv-conf", "is_host=0", *([SERVE_STORE] if serve_store else [])]
    return [sys.executable, "-m", "ddpcourse.launch.agent", *where,
            "--nproc-per-node", str(nproc), "--local-addr", "127.0.0.1", "--monitor-interval", "0.05",
            *torchrun_args, "-m", "ddpcourse.launch.rank", *map(str, args)]


def _free_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_env(world_size, spec_path, extra=None):
    env = dict(os.environ)
    env.update(extra or {})
    env.update({
        RUN_SPEC_ENV: str(spec_path),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": threads_per_rank(world_size, env),
        # Not what the ranks see: torchrun's agent sets their MASTER_ADDR to rank 0's --local-addr (build_command).
        "MASTER_ADDR": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": _loopback_interface(),
        # With the rendezvous store shared (torch's default), ranks restarted by --max-restarts can read
        # their peers' addresses from the previous attempt and fail to connect (pytorch issue 135712).
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        # The ranks find ddpcourse even without `pip install -e .`.
        "PYTHONPATH": os.pathsep.join(filter(None, [str(COURSE_ROOT), env.get("PYTHONPATH")])),
    })
    return env


def run(file, nproc=2, args=(), timeout=DEFAULT_TIMEOUT, show="all", env=None, torchrun_args=(), nnodes=1,
        observer="", observer_options=None, live_view=None):
    """Run ``file`` on ``nproc`` processes; see the module docstring. Returns a RunResult.

    timeout: seconds from the moment every rank is ready (its imports done) to the end of the run.
    show: "all" (every rank's output), "rank0" (only rank 0's; the failure summary names any rank) or
    "none" (print nothing: the caller uses the result, e.g. ``result.message``).
    torchrun_args: extra torchrun options, e.g. ["--max-restarts", "1"].
    nnodes: start this many torchrun agents ("nodes", all on this machine) of ``nproc`` ranks each,
    meeting through a c10d rendezvous on 127.0.0.1; the world size is nnodes * nproc.
    observer, observer_options: a check's observer, called in every rank before the script (see RunSpec).
    live_view: in Jupyter, the live view of the clock and each rank (ddpcourse.launch.live_view); by default
    only when output is shown; True: also with show="none", each rank's state without its lines (a quiet
    cell still shows that it is alive).
    """
    lab_file = Path(file).resolve()
    shown = display_path(lab_file)
    start = time.monotonic()
    result = RunResult(file=str(lab_file), nproc=nproc, returncode=0, duration=0.0, nnodes=nnodes)
    syntax = _syntax_error(lab_file)
    if syntax:  # no need to start N interpreters to find this
        result.returncode = 1
        result.failure = diagnosis.not_runnable(shown, lab_file.exists(), syntax)
        return _say_verdict(result, shown, show)

    world = nproc * nnodes
    printer = RunPrinter(show, world, shown, timeout, live_view=live_view)
    with tempfile.TemporaryDirectory(prefix="ddpcourse-run-") as run_dir:
        spec = RunSpec(str(lab_file), tuple(map(str, args)), run_dir, os.getpid(), observer, observer_options or {})
        result.run_id = spec.path
        agents = _Agents(_commands(lab_file, args, nproc, nnodes, torchrun_args, run_dir),
                         build_env(world, spec.save(), env))
        result.launched = True
        ranks = _RankWatch(run_dir, world, printer)
        try:
            _wait(agents, ranks, printer, start, timeout, result, lab_file, run_dir)
        except KeyboardInterrupt:
            result.interrupted = True
            result.stacks, _ = where_ranks_are(run_dir, ranks.events, lab_file, wait=1.0)  # where were they? then stop them
        finally:
            kill_run(agents.procs, spec.path)  # also ends grandchildren a finished run left behind
            agents.join()
            ranks.close()
            exit_codes = _agent_exit_codes(run_dir)
            if ranks.hang_evidence or exit_codes:  # only a run that failed is explained
                result.collectives = _collectives(run_dir, ranks, lab_file)
            if not (result.collectives or result.interrupted or result.timed_out):  # did the ranks' calls agree?
                result.silent_mismatch = silent_mismatch(read_dumps(run_dir, range(world), wait=0), lab_file)
            if result.timed_out and not result.collectives:  # no collective recorded: did the group ever form?
                ranks.forming = ranks_in(run_dir, range(world), "init_process_group")

    result.duration = time.monotonic() - start
    result.output = ranks.output
    printer.finish(ranks.output)
    if result.interrupted:
        print(f"Interrupted: every process of this run of {shown} was stopped. "  # even if quiet
              f"Where each rank was (most recent call first):\n{_stacks_text(result)}", flush=True)
        raise RunInterrupted("Where each rank was is printed above.") from None
    _judge(result, agents, ranks, exit_codes, shown, timeout, lab_file)
    return _say_verdict(result, shown, show)


def _commands(lab_file, args, nproc, nnodes, torchrun_args, run_dir):
    """One torchrun command per "node"; several meet through a c10d rendezvous on a free loopback port."""
    rank_args = [str(lab_file), *args]
    if nnodes == 1:
        return [build_command(nproc, rank_args, torchrun_args)]
    port = _free_port()
    return [build_command(nproc, rank_args, torchrun_args, (port, os.path.basename(run_dir), nnodes, node == 0))
            for node in range(nnodes)]


class _Agents:
    """The run's torchrun agents, each in a session of its own (so the stop button reaches only this
    process, which then ends the whole tree), their output read by a thread each."""

    def __init__(self, commands, environ):
        self.procs = [subprocess.Popen(
            command, env=environ, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=(os.name != "nt"),
            creationflags=getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)) for command in commands]
        self.chunks = [[] for _ in self.procs]
        self.readers = [threading.Thread(target=lambda p=p, c=c: c.extend(iter(p.stdout.readline, b"")), daemon=True)
                        for p, c in zip(self.procs, self.chunks)]
        for reader in self.readers:
            reader.start()

    def running(self):
        return [proc for proc in self.procs if proc.poll() is None]

    def join(self):
        for reader in self.readers:
            reader.join(timeout=5)

    def output(self):
        return "\n".join(b"".join(chunks).decode("utf-8", "replace") for chunks in self.chunks)

    def returncode(self):
        return next((proc.returncode for proc in self.procs if proc.returncode), 0)


class _RankWatch:
    """What the ranks write as the run goes: their output lines (to the printer as they come) and their
    events (which ranks are ready)."""

    def __init__(self, run_dir, world, printer):
        self.logs, self.events, self.printer = _RankLogs(run_dir), EventReader(run_dir), printer
        self.forming = []  # at a timeout with no collective recorded: the ranks still in init_process_group
        self.output = {rank: [] for rank in range(world)}
        self.ready = set()
        self.world = world
        self.hang_evidence = None  # at a timeout: ({rank: flight recorder dump}, {rank: (line, code) or None})

    def poll(self):
        """Read what is new; returns True when the last rank has just become ready."""
        self._show(self.logs.poll())
        before = len(self.ready)
        self.ready.update(rank for rank, event in self.events.poll() if event["event"] == READY)
        return len(self.ready) == len(self.output) > before

    def _show(self, lines):
        for rank, text in lines:
            self.output.setdefault(rank, []).append(text)
            self.printer.line(rank, text)

    def close(self):
        self._show(self.logs.flush())
        self.events.close()


def _wait(agents, ranks, printer, start, timeout, result, lab_file, run_dir):
    """Until every agent has ended, or the start-up limit or (once every rank is ready) the timeout runs out;
    on a timeout, record where each rank was. The agents are stopped by the caller either way."""
    deadline, all_ready_at = start + STARTUP_TIMEOUT, None
    while agents.running():
        if ranks.poll():  # the run's own clock starts now
            all_ready_at = time.monotonic()
            deadline = all_ready_at + timeout
        now = time.monotonic()
        if now > deadline:
            result.timed_out = True
            request_dumps(run_dir)  # the ranks' flight recorders, written while the stacks are taken
            result.stacks, lines = where_ranks_are(run_dir, ranks.events, lab_file)
            # a rank writes its record with the lines of its calls: a second the first time on an idle machine
            # (torch's symbolizer imports torch._inductor), 3-5 s seen on a loaded 2-core one
            ranks.hang_evidence = (read_dumps(run_dir, lines, wait=10.0), lines)
            return
        # the view shows the clock the timeout counts: from the moment every rank is ready
        printer.tick(now - start, None if all_ready_at is None else now - all_ready_at, ranks.ready)
        try:
            agents.running()[0].wait(timeout=max(0.01, min(POLL_SECONDS, deadline - now)))
        except (subprocess.TimeoutExpired, IndexError):
            pass


def _judge(result, agents, ranks, exit_codes, shown, timeout, lab_file):
    """The run's outcome from structured evidence: exit codes, each rank's events and reports."""
    world = len(ranks.output)
    result.returncode = 124 if result.timed_out else agents.returncode()
    result.agent_output = agents.output()
    by_rank = {rank: ranks.events.events(rank) for rank in range(world)}
    for rank in range(world):
        result.reports[rank] = ranks.events.reports(rank)
        result.writes[rank] = [e["path"] for e in by_rank[rank] if e["event"] == WROTE]
    if result.timed_out:
        result.failure = diagnosis.timed_out(by_rank, world, shown, timeout, len(ranks.ready) == world,
                                             STARTUP_TIMEOUT, result.collectives, in_init=len(ranks.forming) == world)
        return
    # a rank killed by a signal: where its faulthandler stack (in its log) was in the script
    logs = {rank: "\n".join(ranks.output.get(rank, [])) for rank, code in exit_codes.items() if code and code < 0}
    last_lines = {rank: lab_line(text, lab_file) for rank, text in logs.items()}
    died_in = {rank: collective_in(text) for rank, text in logs.items()}
    result.failure = diagnosis.root_cause(by_rank, world, exit_codes, shown, last_lines, died_in)
    result.aborted_at_exit = diagnosis.aborted_after_finishing(by_rank, world, exit_codes)
    if result.aborted_at_exit:  # torch's exit race, after a complete run: see aborted_after_finishing
        result.returncode = 0


def _say_verdict(result, shown, show):
    result.message = verdict(result, shown)
    if show != "none":
        print(result.message, flush=True)
    return result


def _agent_exit_codes(run_dir):
    """{rank: exit code} of the ranks that failed, as torchrun's agents saved them (ddpcourse.launch.agent)."""
    return {rank: row["exitcode"] for rank, row in read_failures(run_dir).items()}


def _collectives(run_dir, ranks, lab_file):
    """The HangReport of the ranks' flight recorders: those asked for at a timeout, or those the ranks wrote
    when they raised. None when no rank was in a collective that matters (most failures)."""
    # at a timeout: where the launcher found each rank; after a failure: the ranks that were still running, whose
    # stacks the failing rank asked for before torchrun stopped them
    dumps, lines = ranks.hang_evidence or (read_dumps(run_dir, range(ranks.world), wait=0),
                                           where_stopped_ranks_were(run_dir, ranks.events, lab_file))
    if not dumps:
        return None
    raised = {}
    for rank in range(ranks.world):
        exception = ranks.events.first(rank, EXCEPTION)
        if exception is not None:
            raised[rank] = exception.get("lab_line")
    report = analyse(dumps, lab_file, alive=set(lines), raised=raised,
                     stack_lines={r: line for r, line in lines.items() if line})
    return report if report.waiting or report.failed_in or report.disagreement is not None else None


def _stacks_text(result):
    return stacks_text(result.stacks, result.world_size)


def _syntax_error(path):
    """The formatted syntax error of ``path`` (ddpcourse.paths.compile_error), a missing file, or None."""
    try:
        exc = compile_error(path)
    except FileNotFoundError:
        return f"FileNotFoundError: {path}"
    if exc is None:
        return None
    if not isinstance(exc, SyntaxError):  # e.g. a null byte
        return f"  {display_path(path)}\n{type(exc).__name__}: {exc}"
    code = (exc.text or "").rstrip()
    return f"  {display_path(path)}, line {exc.lineno}\n    {code}\nSyntaxError: {exc.msg}"


class _RankLogs:
    """Follows rank<r>.log files as the ranks write them and yields complete lines as text."""

    def __init__(self, run_dir):
        self.files = RankFiles(run_dir, ".log")

    def poll(self):
        # decoded per line, so a character split across two reads is never mangled
        return [(rank, line.decode("utf-8", "replace").rstrip("\r")) for rank, line in self.files.poll()]

    def flush(self):
        """Everything left, including last lines without a newline."""
        new = self.poll()
        new.extend((rank, rest.decode("utf-8", "replace")) for rank, rest in self.files.remainders())
        return new
