"""Run a script on N local processes under torchrun, and never hang or orphan a process.

Introduced in notebooks/00_start_here.ipynb. ``run_lab(file, nproc=2)`` in a notebook cell and
``python -m ddpcourse run FILE --nproc 2`` in a terminal both:

- run FILE under torchrun (``python -m ddpcourse.agent``: torch.distributed.run plus failures saved as
  data and a watchdog) with this interpreter, rendezvous, MASTER_ADDR and gloo on the loopback interface,
  OMP_NUM_THREADS as the user set it or else the usable cores divided among the ranks, output unbuffered;
  on Linux torchrun forks the ranks from its agent, which has imported torch already (see forks_ranks);
  one rank on one node without torchrun options skips the agent: the worker is started directly;
- stream every rank's output live, tagged by rank (ddpcourse.printing);
- return what the script passed to ``ddpcourse.report(...)``, per rank (ddpcourse.events);
- on failure name the root-cause rank with its traceback (ddpcourse.diagnosis);
- on a timeout, counted from the moment every rank is ready (imports done), show where every rank's
  Python stack was (ddpcourse.stacks), then kill the whole process tree (ddpcourse.processes); the
  Jupyter stop button (KeyboardInterrupt) does the same.

This process never imports torch: each launch already pays for its agent (or its one rank) importing it.
"""
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ddpcourse import diagnosis
from ddpcourse.agent import read_failures
from ddpcourse.diagnosis import RankFailure  # noqa: F401 - part of this module's API
from ddpcourse.events import ENDINGS, READY, RUN_DIR_ENV, STARTED, WROTE, EventReader, RankFiles
from ddpcourse.paths import COURSE_ROOT, compile_error, display_path
from ddpcourse.printing import RunPrinter, verdict
from ddpcourse.processes import (LAUNCHER_PID_ENV, RUN_ID_ENV, find_processes, kill_run,  # noqa: F401
                                 processes_of_run)
from ddpcourse.stacks import dump_stacks, format_stack

DEFAULT_TIMEOUT = 60.0   # seconds a run may take once every rank is ready
STARTUP_TIMEOUT = 120.0  # seconds the ranks may take to start (interpreters importing torch on a busy laptop)
FORK_RANKS_ENV = "DDPCOURSE_FORK_RANKS"  # "0": every rank a fresh interpreter, as on macOS (see forks_ranks)
WORKER_FILE = Path(__file__).with_name("_worker.py")
POLL_SECONDS = 0.1  # how often the live output is refreshed; the end of the run is noticed at once


@dataclass
class RunResult:
    """What a launch produced. ``ok``: every rank finished with exit code 0 and nothing went wrong."""
    file: str
    nproc: int                  # ranks per node
    returncode: int
    duration: float
    reports: dict = field(default_factory=dict)  # rank -> {name: value}
    output: dict = field(default_factory=dict)   # rank -> [lines]
    timed_out: bool = False
    interrupted: bool = False
    failure: RankFailure = None
    stacks: dict = field(default_factory=dict)   # rank -> formatted stack at the timeout
    writes: dict = field(default_factory=dict)   # rank -> files written under $DDPCOURSE_WATCH_WRITES
    message: str = ""
    run_id: str = ""
    agent_output: str = ""
    nnodes: int = 1
    launched: bool = False      # False when nothing was started (a syntax error, a missing file)

    @property
    def world_size(self):
        return self.nproc * self.nnodes

    @property
    def ok(self):
        return self.returncode == 0 and not self.timed_out and not self.interrupted and self.failure is None

    def values(self, name):
        """``name`` as reported by every rank, in rank order (a clear error if the run failed)."""
        missing = [r for r in range(self.world_size) if name not in self.reports.get(r, {})]
        if missing:
            why = "the run failed (see the message above)" if not self.ok else "the script never reported it"
            raise KeyError(f"ranks {missing} did not report {name!r}: {why}")
        return [self.reports[r][name] for r in range(self.world_size)]

    def __repr__(self):
        state = "ok" if self.ok else ("timed out" if self.timed_out else "failed")
        return f"RunResult({Path(self.file).name}, nproc={self.nproc}, {state})"


# ----------------------------------------------------------------------------- threads per rank
def usable_cores():
    """The cores this process may really use: its CPU affinity, capped by its container's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota:
        cores = min(cores, max(1, math.floor(quota)))
    return max(1, cores)


def cgroup_cpu_quota(root="/sys/fs/cgroup", self_cgroup="/proc/self/cgroup"):
    """CPUs granted by the tightest cgroup quota on this process's own cgroup path, None when unlimited.

    v2: cpu.max of its cgroup (``0::/path`` in /proc/self/cgroup) and of every parent up to ``root`` (a
    limit set on a parent, e.g. a systemd slice, binds too); v1: cfs_quota/cfs_period of its cpu cgroup
    and parents. A path missing under ``root`` (a container's own cgroup mount) only drops that level."""
    v2, v1 = "/", "/"
    try:
        for line in Path(self_cgroup).read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                v2 = path
            elif "cpu" in controllers.split(","):
                v1 = path
    except (OSError, ValueError):
        pass

    def up_to_root(base, path):
        folder = Path(base, path.strip("/"))
        while True:
            yield folder
            if folder == Path(base):
                return
            folder = folder.parent

    found, quotas = False, []
    for folder in up_to_root(root, v2):
        try:
            quota, period = Path(folder, "cpu.max").read_text().split()[:2]
            found = True
            if quota != "max":
                quotas.append(int(quota) / int(period))
        except (OSError, ValueError):
            continue
    if not found:  # no v2 cpu controller: cgroup v1
        for folder in up_to_root(Path(root, "cpu"), v1):
            try:
                quota = int(Path(folder, "cpu.cfs_quota_us").read_text())
                period = int(Path(folder, "cpu.cfs_period_us").read_text())
            except (OSError, ValueError):
                continue
            if quota > 0 and period > 0:
                quotas.append(quota / period)
    return min(quotas) if quotas else None


def threads_per_rank(ranks, environ=None):
    """OMP_NUM_THREADS for each of ``ranks`` processes on this machine: the user's value if set, else the
    usable cores divided among the ranks (more threads each would only fight over the cores)."""
    environ = os.environ if environ is None else environ
    if environ.get("OMP_NUM_THREADS"):
        return environ["OMP_NUM_THREADS"]
    return str(max(1, usable_cores() // ranks))


# ----------------------------------------------------------------------------- the launch
def _loopback_interface():
    return "lo0" if sys.platform == "darwin" else "lo"


def build_command(file, nproc, args=(), torchrun_args=(), rendezvous=None):
    """The command that starts one node. rendezvous: None for one node (--standalone), else
    (port, run_id, nnodes) for one of several agents meeting at 127.0.0.1:port."""
    if rendezvous is None:
        where = ["--standalone"]
    else:
        port, run_id, nnodes = rendezvous
        # the agent with $DDPCOURSE_HOST_STORE=1 serves the rendezvous store (on loopback), the others connect
        where = ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                 "--rdzv-id", run_id, "--rdzv-conf", "is_host=0"]
    return [sys.executable, "-m", "ddpcourse.agent", *where,
            "--nproc-per-node", str(nproc), "--local-addr", "127.0.0.1", "--monitor-interval", "0.05",
            *torchrun_args, *_worker_command(file, args, forks_ranks(torchrun_args))]


def forks_ranks(torchrun_args=()):
    """Whether torchrun forks the ranks from its agent (``--run-path --start-method fork``, torch's own options)
    instead of starting a fresh interpreter per rank. The agent has imported torch already, so a forked rank
    skips that import (about 1.7 s of CPU a rank here). Not on macOS (forking a process that loaded system
    frameworks is unsafe: fresh interpreters, as ``multiprocessing`` does there), not with $DDPCOURSE_FORK_RANKS=0,
    and not when torchrun may restart the ranks: measured here, ranks forked for a restart that skipped the last
    ``dist.barrier()`` deadlocked at exit in 3 of 16 runs (the main thread, holding the GIL, destroys the gloo
    group and joins its worker thread, which waits for the GIL to free a work item), against 0 of 16 forked
    without a restart and 0 of 22 fresh interpreters with one. It is the deadlock class of pytorch issue 56297
    (https://github.com/pytorch/pytorch/issues/56297: ~ProcessGroupGloo blocks while the GIL is held); what makes
    a restart hit it is not found. For the same reason the agent does not import torch._dynamo before forking
    (DDP's constructor imports it, 1.2 s a rank): that saved 40% of the CPU, but 2 of 12 runs of solutions/02 hung."""
    if not sys.platform.startswith("linux") or os.environ.get(FORK_RANKS_ENV, "1") == "0":
        return False
    return _max_restarts(torchrun_args) == 0


def _max_restarts(torchrun_args):
    args = [str(a) for a in torchrun_args]
    for i, arg in enumerate(args):
        name, _, value = arg.partition("=")
        if name in ("--max-restarts", "--max_restarts"):
            value = value or (args[i + 1] if i + 1 < len(args) else "0")
            return int(value) if value.isdigit() else 1
    return 0


def _worker_command(file, args, forked):
    """The worker part of torchrun's command: the worker file run by path inside each forked rank, else a
    module in a fresh interpreter per rank."""
    worker = ["--run-path", "--start-method", "fork", str(WORKER_FILE)] if forked else ["-m", "ddpcourse._worker"]
    return [*worker, str(file), *map(str, args)]


def _free_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_env(world_size, run_dir, run_id, extra=None):
    env = dict(os.environ)
    env.update(extra or {})
    env.update({
        RUN_DIR_ENV: str(run_dir),
        RUN_ID_ENV: run_id,
        LAUNCHER_PID_ENV: str(os.getpid()),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": threads_per_rank(world_size, env),
        "MASTER_ADDR": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": _loopback_interface(),
        # With the rendezvous store shared (torch's default), ranks restarted by --max-restarts can read
        # their peers' addresses from the previous attempt and fail to connect (pytorch issue 135712).
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        # The workers find ddpcourse (for the bootstrap) even without `pip install -e .`.
        "PYTHONPATH": os.pathsep.join(filter(None, [str(COURSE_ROOT), os.environ.get("PYTHONPATH")])),
    })
    return env


def one_process_env(run_id):
    """What torchrun would set for a single rank, for the run that starts its worker directly."""
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
            "ROLE_RANK": "0", "ROLE_WORLD_SIZE": "1", "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default",
            "MASTER_PORT": str(_free_port()), "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": run_id}


def run(file, nproc=2, args=(), timeout=DEFAULT_TIMEOUT, show="all", env=None, torchrun_args=(), nnodes=1):
    """Run ``file`` on ``nproc`` processes; see the module docstring. Returns a RunResult.

    timeout: seconds from the moment every rank is ready (its imports done) to the end of the run.
    show: "all" (every rank's output), "rank0" (only rank 0's; the failure summary names any rank) or
    "none" (print nothing: the caller uses the result, e.g. ``result.message``).
    torchrun_args: extra torchrun options, e.g. ["--max-restarts", "1"].
    nnodes: start this many torchrun agents ("nodes", all on this machine) of ``nproc`` ranks each,
    meeting through a c10d rendezvous on 127.0.0.1; the world size is nnodes * nproc.
    """
    lab_file = Path(file).resolve()
    shown = display_path(lab_file)
    start = time.monotonic()
    result = RunResult(file=str(lab_file), nproc=nproc, returncode=0, duration=0.0, nnodes=nnodes)
    world = nproc * nnodes
    syntax = _syntax_error(lab_file)
    if syntax:  # no need to start N interpreters to find this
        result.returncode = 1
        what = "does not exist" if not lab_file.exists() else "has a syntax error"
        result.failure = RankFailure(0, diagnosis.EXCEPTION_KIND, message=f"{shown} {what}",
                                     details=syntax, error=syntax.strip().splitlines()[-1])
        result.message = verdict(result, shown)
        if show != "none":
            print(result.message, flush=True)
        return result

    run_id = uuid.uuid4().hex
    result.run_id = run_id
    printer = RunPrinter(show, world, shown, timeout)
    with tempfile.TemporaryDirectory(prefix="ddpcourse-run-") as run_dir:
        logs = _RankLogs(run_dir)
        events = EventReader(run_dir)
        output = {rank: [] for rank in range(world)}
        extra = dict(env or {})
        direct = world == 1 and not torchrun_args
        if direct:  # no agent needed: the script's one-process path, half the cost
            extra.update(one_process_env(run_id))
            commands = [[sys.executable, "-m", "ddpcourse._worker", str(lab_file), *map(str, args)]]
        elif nnodes == 1:
            commands = [build_command(lab_file, nproc, args, torchrun_args)]
        else:
            rendezvous = (_free_port(), run_id, nnodes)
            commands = [build_command(lab_file, nproc, args, torchrun_args, rendezvous)] * nnodes
        hosts = [{"DDPCOURSE_HOST_STORE": "1" if node == 0 else "0"} for node in range(len(commands))]
        procs = [subprocess.Popen(
            command, env=build_env(world, run_dir, run_id, {**extra, **host}),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=(os.name != "nt"),
            creationflags=getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)) for command, host in zip(commands, hosts)]
        result.launched = True
        agent_chunks = [[] for _ in procs]
        readers = [threading.Thread(target=lambda p=p, c=c: c.extend(iter(p.stdout.readline, b"")), daemon=True)
                   for p, c in zip(procs, agent_chunks)]
        for reader in readers:
            reader.start()

        def drain(lines):
            for rank, text in lines:
                output.setdefault(rank, []).append(text)
                printer.line(rank, text)

        ready, deadline = set(), start + STARTUP_TIMEOUT
        try:
            while any(proc.poll() is None for proc in procs):
                drain(logs.poll())
                for rank, event in events.poll():
                    if event["event"] == READY and rank not in ready:
                        ready.add(rank)
                        if len(ready) == world:  # the run's own clock starts now
                            deadline = time.monotonic() + timeout
                now = time.monotonic()
                if now > deadline:
                    result.timed_out = True
                    result.stacks = _stacks(run_dir, events, lab_file)
                    break
                printer.tick(now - start)
                try:
                    running = next(proc for proc in procs if proc.poll() is None)
                    running.wait(timeout=max(0.01, min(POLL_SECONDS, deadline - now)))
                except (subprocess.TimeoutExpired, StopIteration):
                    pass
        except KeyboardInterrupt:
            result.interrupted = True
            result.stacks = _stacks(run_dir, events, lab_file, wait=1.0)  # where were they? then stop them
            kill_run(procs, run_id)
            printer.finish(output)
            print(f"Interrupted: every process of this run of {shown} was stopped. "  # even if quiet
                  f"Where each rank was (most recent call first):\n{_stacks_text(result)}", flush=True)
            raise
        finally:
            kill_run(procs, run_id)  # also ends grandchildren a finished run left behind
            for reader in readers:
                reader.join(timeout=5)
            drain(logs.flush())
            events.close()
            exit_codes = {0: procs[0].returncode} if direct else _agent_exit_codes(run_dir)

    result.duration = time.monotonic() - start
    result.returncode = 124 if result.timed_out else next((p.returncode for p in procs if p.returncode), 0)
    result.output = output
    result.agent_output = "\n".join(b"".join(chunks).decode("utf-8", "replace") for chunks in agent_chunks)
    for rank in range(world):
        result.reports[rank] = events.reports(rank)
        result.writes[rank] = [e["path"] for e in events.events(rank) if e["event"] == WROTE]
    by_rank = {rank: events.events(rank) for rank in range(world)}
    if result.timed_out:
        running = [r for r in range(world) if not any(e["event"] in ENDINGS for e in by_rank[r])] or [0]
        result.failure = RankFailure(running[0], diagnosis.TIMEOUT, message=(
            f"{shown} did not finish within {timeout:g} s of every rank being ready"
            if len(ready) == world else f"{shown}: the ranks did not start within {STARTUP_TIMEOUT:g} s"))
    elif not result.interrupted:
        result.failure = diagnosis.root_cause(by_rank, world, exit_codes, shown)
    printer.finish(output)
    result.message = verdict(result, shown)
    if show != "none":
        print(result.message, flush=True)
    return result


def _agent_exit_codes(run_dir):
    """{rank: exit code} of the ranks that failed, as torchrun's agents saved them (ddpcourse.agent)."""
    return {rank: row["exitcode"] for rank, row in read_failures(run_dir).items()}


def _stacks(run_dir, events, lab_file, wait=2.0):
    events.poll()  # what the ranks wrote since the last look (an interrupt can come before the loop read it)
    pids = {rank: events.first(rank, STARTED)["pid"] for rank in events.ranks() if events.first(rank, STARTED)}
    live = {rank: pid for rank, pid in pids.items() if not any(e["event"] in ENDINGS for e in events.events(rank))}
    raw = dump_stacks(run_dir, live, wait=wait)
    return {rank: format_stack(text, lab_file) for rank, text in sorted(raw.items())}


def _stacks_text(result):
    from ddpcourse.stacks import stacks_text

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
