"""Run a script on N local processes under torchrun, and never hang or orphan a process.

Introduced in notebooks/00_start_here.ipynb. ``run_lab(file, nproc=2)`` in a notebook cell and
``python -m ddpcourse run FILE --nproc 2`` in a terminal both:

- run FILE under ``python -m torch.distributed.run --standalone`` with this interpreter (never some other
  ``torchrun`` on PATH), rendezvous, MASTER_ADDR and gloo on the loopback interface, OMP_NUM_THREADS set to
  cores / nproc, output unbuffered;
- stream every rank's output live, tagged by rank (in Jupyter: a live view; the cell's permanent output
  is then printed grouped by rank, so it is the same on every run);
- return what the script passed to ``ddpcourse.report(...)``, per rank;
- on failure name the root-cause rank with its traceback (an unfinished lab TODO reads as such);
- on a timeout show where every rank's Python stack was, then kill the whole process tree; the Jupyter
  stop button (KeyboardInterrupt) kills the tree too.

This process never imports torch: each launch already pays for every rank importing it.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ddpcourse.paths import COURSE_ROOT, display_path, resolve_lab
from ddpcourse.reporting import RUN_DIR_ENV

RUN_ID_ENV = "DDPCOURSE_RUN_ID"
DEFAULT_TIMEOUT = 60.0
POLL_SECONDS = 0.1  # how often the live output is refreshed; the end of the run is noticed at once
# Errors a rank gets *because another rank went away*: never the root cause while another rank has one.
PEER_GONE = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|"
                       r"ECONNRESET|Socket Timeout|Connection refused|recvBytes", re.I)


@dataclass
class RankFailure:
    rank: int
    summary: str        # one line: what went wrong on this rank
    details: str = ""   # the traceback or the stack, already formatted


@dataclass
class RunResult:
    """What a launch produced. ``ok`` is True only if every rank finished with exit code 0."""
    file: str
    nproc: int
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

    @property
    def world_size(self):
        return self.nproc * self.nnodes

    @property
    def ok(self):
        return self.returncode == 0 and not self.timed_out and not self.interrupted

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


# ----------------------------------------------------------------------------- process tree
def processes_of_run(run_id):
    """PIDs of every live process started by run ``run_id`` (see find_processes)."""
    return find_processes(f"{RUN_ID_ENV}={run_id}")


def find_processes(env_entry):
    """PIDs of live processes whose environment holds ``env_entry`` ("NAME=value").

    Children inherit the environment, so this finds grandchildren even after they left the process
    group (setsid) or were re-parented. Linux only (elsewhere: empty, and killpg does the work).
    """
    marker = env_entry.encode()
    found = []
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in environ.split(b"\0") and state != "Z":  # zombies are already dead
            found.append(int(entry.name))
    return found


def _kill_tree(procs, run_id):
    """SIGKILL the agents' process groups and anything else carrying this run's marker."""
    if os.name == "nt":
        for proc in procs:
            subprocess.run(["taskkill", "/T", "/F", "/PID", str(proc.pid)], capture_output=True)
    else:
        for _ in range(3):  # a dying parent can fork once more: sweep until nothing is left
            for proc in procs:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            for pid in processes_of_run(run_id):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if not processes_of_run(run_id):
                break
            time.sleep(0.05)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


# ----------------------------------------------------------------------------- run directory
class _RankLogs:
    """Follows rank<r>.log files as the ranks write them and yields complete lines."""

    def __init__(self, run_dir):
        self.run_dir = Path(run_dir)
        self.offsets = {}
        self.partial = {}

    def poll(self):
        new = []
        for path in sorted(self.run_dir.glob("rank*.log")):
            rank = int(path.stem[4:])
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets.get(rank, 0))
                    chunk = f.read()
            except OSError:
                continue
            if not chunk:
                continue
            self.offsets[rank] = self.offsets.get(rank, 0) + len(chunk)
            text = self.partial.pop(rank, "") + chunk.decode("utf-8", "replace")
            *lines, rest = text.split("\n")
            if rest:
                self.partial[rank] = rest
            new.extend((rank, line.rstrip("\r")) for line in lines)
        return new

    def flush(self):
        """Everything left, including last lines without a newline."""
        new = self.poll()
        new.extend((rank, rest) for rank, rest in sorted(self.partial.items()))
        self.partial.clear()
        return new


def _read_events(run_dir):
    """rank -> events of that rank's latest start (earlier attempts of a restarted run are history)."""
    events = {}
    for path in Path(run_dir).glob("rank*.events"):
        rank = int(path.stem[4:])
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
        starts = [i for i, row in enumerate(rows) if row["event"] == "started"]
        events[rank] = rows[starts[-1]:] if starts else rows
    return events


# ----------------------------------------------------------------------------- stacks at a timeout
def _dump_stacks(run_dir, events, wait=2.0):
    """Ask every live rank for its Python stacks (faulthandler on SIGUSR1) and collect them."""
    if not hasattr(signal, "SIGUSR1"):
        return {}
    pids = {rank: rows[0]["pid"] for rank, rows in events.items() if rows and rows[0]["event"] == "started"}
    for rank, pid in pids.items():
        try:
            os.kill(pid, signal.SIGUSR1)
        except (OSError, ProcessLookupError):
            pass
    files = {rank: Path(run_dir) / f"rank{rank}.stacks" for rank in pids}
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and not all(f.stat().st_size for f in files.values()):
        time.sleep(0.05)
    time.sleep(0.2)  # the handler writes thread by thread: let it finish
    stacks = {rank: f.read_text(errors="replace") for rank, f in files.items()}
    return stacks


_FRAME = re.compile(r'^\s*File "(.*)", line (\d+) in (.*)$')


def _short(path):
    """site-packages/torch/x.py -> torch/x.py; course files relative to the course root."""
    marker = "site-packages" + os.sep
    if marker in path:
        return path.split(marker, 1)[1]
    return display_path(path) if os.path.isabs(path) else path


def format_stack(raw, lab_file):
    """The thread that is running the lab, most recent call first, the lab's own lines marked."""
    import linecache

    threads, current = [], None
    for line in raw.splitlines():
        if "(most recent call first)" in line:
            current = []
            threads.append(current)
        elif current is not None:
            match = _FRAME.match(line)
            if match:
                current.append((match.group(1), int(match.group(2)), match.group(3)))
    lab_file = str(Path(lab_file).resolve())
    lab_threads = [t for t in threads if any(os.path.abspath(f) == lab_file for f, _, _ in t)]
    if not lab_threads:
        return raw.strip()
    out = []
    for filename, lineno, func in lab_threads[-1]:
        if "runpy" in filename or filename.endswith("_worker.py"):
            break
        if filename.startswith("<frozen importlib"):  # the import machinery: noise between modules
            continue
        if os.path.abspath(filename) == lab_file:
            code = linecache.getline(filename, lineno).strip()
            out.append(f"  -> {_short(filename)}:{lineno} in {func}:  {code}")
        else:
            out.append(f"     {_short(filename)}:{lineno} in {func}")
    return "\n".join(out)


# ----------------------------------------------------------------------------- root cause
def _root_cause(events, nproc, agent_output, display_file):
    """The rank whose failure explains the run's failure, with a message a learner can act on."""
    exceptions, exits, finished, silent = [], [], [], []
    for rank in range(nproc):
        rows = events.get(rank, [])
        ends = [row for row in rows if row["event"] in ("exception", "exit", "finished", "interrupted")]
        if not rows:
            continue
        if not ends:
            silent.append(rank)
        for row in ends:
            {"exception": exceptions, "exit": exits, "finished": finished}.get(row["event"], []).append((rank, row))
    own = [(r, e) for r, e in exceptions if not PEER_GONE.search(e["message"])]
    candidates = own + exits
    if candidates:
        rank, row = min(candidates, key=lambda item: item[1]["time"])
    elif silent or exceptions:
        pairs = _agent_exit_codes(agent_output)
        codes = {}
        for r, c in pairs:
            codes.setdefault(r, c)
        # A rank that vanished without a Python exception (killed, os._exit) explains the peers' errors;
        # SIGTERM is torchrun stopping the survivors, so those come last.
        died = sorted((r for r in silent if codes.get(r, 0) != 0),
                      key=lambda r: (codes[r] == -signal.SIGTERM, [p[0] for p in pairs].index(r)))
        if died or (silent and not exceptions):
            rank = (died or silent)[0]
            code = codes.get(rank)
            how = _describe_exit(code) if code is not None else "stopped without a Python exception"
            return RankFailure(rank, f"rank {rank} {how}: the other ranks lost their peer.",
                               _peer_errors(exceptions))
        rank, row = min(exceptions, key=lambda item: item[1]["time"])
        early = [r for r, _ in finished]
        if early:
            return RankFailure(
                rank, f"rank {rank} failed in a collective because rank(s) {early} had already ended. "
                      "Every rank must make the same collective calls in the same order.",
                row["traceback"])
    else:
        codes = dict(reversed(_agent_exit_codes(agent_output)))  # the root cause's code wins
        crashed = [r for r, _ in finished if codes.get(r, 0) not in (0, -signal.SIGTERM)]
        if not crashed:
            return None
        rank = crashed[0]
        return RankFailure(rank, f"rank {rank} ran its script to the end, then {_describe_exit(codes[rank])} "
                                 "while exiting. Often a process group left open: call "
                                 "dist.destroy_process_group() at the end of the script.")
    if row["event"] == "exit":
        return RankFailure(rank, f"rank {rank} called sys.exit({row['message']}).")
    if "todo" in row:
        todo = row["todo"]
        hint = f": {todo['hint']}" if todo["hint"] else ""
        where = f" (line {row['lab_line']})" if "lab_line" in row else ""
        return RankFailure(rank, f"TODO {todo['number']} in {display_file} is not done yet{where}{hint}")
    twins = sorted(r for r, e in exceptions if e["message"] == row["message"] and e["type"] == row["type"])
    if twins and twins[0] != rank:  # the same error on several ranks: name the lowest, whatever came first
        rank, row = twins[0], dict(exceptions)[twins[0]]
    same = sorted(r for r, e in exceptions if e["message"] == row["message"] and r != rank)
    also = f" (ranks {same} raised the same error)" if same else ""
    others = [(r, e) for r, e in exceptions if r != rank and r not in same]
    details = row["traceback"].rstrip()
    if others:
        details += "\nThe other ranks failed as a consequence:\n" + _peer_errors(others)
    return RankFailure(rank, f"rank {rank} raised {row['type']}: {_first_line(row['message'])}{also}", details)


def _first_line(text):
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def _peer_errors(exceptions):
    return "\n".join(f"  rank {r}: {row['type']}: {_first_line(row['message'])[:160]}" for r, row in exceptions)


def _agent_exit_codes(agent_output):
    """(rank, exitcode) pairs from torchrun's failure table, its root cause first."""
    def pairs(text):
        table = re.findall(r"^\s*rank\s*:\s*(\d+).*\n\s*exitcode\s*:\s*(-?\d+)", text, re.M)
        return [(int(r), int(c)) for r, c in table]

    root = agent_output.find("Root Cause")
    if root < 0:
        return pairs(agent_output)
    return pairs(agent_output[root:]) + pairs(agent_output[:root])


def _describe_exit(code):
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        extra = " (SIGKILL often means out of memory)" if name == "SIGKILL" else ""
        return f"was killed by {name}{extra}"
    return f"exited with code {code} without a Python exception (os._exit or a crash)"


# ----------------------------------------------------------------------------- output
class _Printer:
    """Terminal: print tagged lines as they come. Jupyter: a live view, then the lines grouped by rank."""

    def __init__(self, show, nproc, label, timeout):
        self.show = show
        self.view = None
        if show != "none" and _in_jupyter():
            from ddpcourse.display import LiveRunView
            self.view = LiveRunView(label, nproc, timeout)

    def line(self, rank, text):
        if self.show == "none" or (self.show == "rank0" and rank != 0):
            return
        if self.view is not None:
            self.view.add(rank, text)
        else:
            print(f"[rank {rank}] {text}", flush=True)

    def tick(self, elapsed):
        if self.view is not None:
            self.view.tick(elapsed)

    def finish(self, output):
        if self.view is None:
            return
        self.view.close()
        for rank in sorted(output):
            if self.show == "rank0" and rank != 0:
                continue
            for text in output[rank]:
                print(f"[rank {rank}] {text}")


def _in_jupyter():
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


# ----------------------------------------------------------------------------- the launch
def _loopback_interface():
    return "lo0" if sys.platform == "darwin" else "lo"


def build_command(file, nproc, args=(), torchrun_args=(), rendezvous=None):
    """The torchrun command line. rendezvous: None for one node (--standalone), else
    (port, run_id, nnodes) for one of several agents meeting at 127.0.0.1:port."""
    if rendezvous is None:
        where = ["--standalone"]
    else:
        port, run_id, nnodes = rendezvous
        where = ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                 "--rdzv-id", run_id]
    return [sys.executable, "-m", "torch.distributed.run", *where,
            "--nproc-per-node", str(nproc), "--local-addr", "127.0.0.1", "--monitor-interval", "0.05",
            *torchrun_args, "-m", "ddpcourse._worker", str(file), *map(str, args)]


def _free_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_env(nproc, run_dir, run_id, extra=None):
    env = dict(os.environ)
    env.update({
        RUN_DIR_ENV: str(run_dir),
        RUN_ID_ENV: run_id,
        "PYTHONUNBUFFERED": "1",
        # nproc ranks share the cores: more threads each would only fight over them.
        "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc)),
        "MASTER_ADDR": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": _loopback_interface(),
        # With the rendezvous store shared (torch's default), ranks restarted by --max-restarts can read
        # their peers' addresses from the previous attempt and fail to connect (pytorch issue 135712).
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        # The workers find ddpcourse (for the bootstrap) even without `pip install -e .`.
        "PYTHONPATH": os.pathsep.join(filter(None, [str(COURSE_ROOT), os.environ.get("PYTHONPATH")])),
    })
    env.update(extra or {})
    return env


def run(file, nproc=2, args=(), timeout=DEFAULT_TIMEOUT, show="all", env=None, torchrun_args=(), nnodes=1):
    """Run ``file`` on ``nproc`` processes; see the module docstring. Returns a RunResult.

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
        result.returncode, result.failure = 1, RankFailure(0, f"{shown} has a syntax error", syntax)
        result.message = _summary(result, shown)
        if show != "none":
            print(result.message, flush=True)
        return result

    run_id = uuid.uuid4().hex
    result.run_id = run_id
    printer = _Printer(show, world, shown, timeout)
    with tempfile.TemporaryDirectory(prefix="ddpcourse-run-") as run_dir:
        logs = _RankLogs(run_dir)
        output = {rank: [] for rank in range(world)}
        if nnodes == 1:
            commands = [build_command(lab_file, nproc, args, torchrun_args)]
        else:
            rendezvous = (_free_port(), run_id, nnodes)
            commands = [build_command(lab_file, nproc, args, torchrun_args, rendezvous)] * nnodes
        procs = [subprocess.Popen(
            command, env=build_env(nproc, run_dir, run_id, env),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=(os.name != "nt"),
            creationflags=getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)) for command in commands]
        agent_chunks = [[] for _ in procs]
        readers = [threading.Thread(target=lambda p=p, c=c: c.extend(iter(p.stdout.readline, b"")), daemon=True)
                   for p, c in zip(procs, agent_chunks)]
        for reader in readers:
            reader.start()

        def drain(lines):
            for rank, text in lines:
                output.setdefault(rank, []).append(text)
                printer.line(rank, text)

        try:
            while any(proc.poll() is None for proc in procs):
                elapsed = time.monotonic() - start
                if elapsed > timeout:
                    drain(logs.poll())
                    result.timed_out = True
                    raw = _dump_stacks(run_dir, _read_events(run_dir))
                    result.stacks = {rank: format_stack(text, lab_file) for rank, text in sorted(raw.items())}
                    break
                drain(logs.poll())
                printer.tick(elapsed)
                try:
                    running = next(proc for proc in procs if proc.poll() is None)
                    running.wait(timeout=min(POLL_SECONDS, max(0.0, timeout - elapsed)) or POLL_SECONDS)
                except (subprocess.TimeoutExpired, StopIteration):
                    pass
        except KeyboardInterrupt:
            result.interrupted = True
            raw = _dump_stacks(run_dir, _read_events(run_dir), wait=1.0)  # where were they? then stop them
            result.stacks = {rank: format_stack(text, lab_file) for rank, text in sorted(raw.items())}
            _kill_tree(procs, run_id)
            printer.finish(output)
            print(f"Interrupted: every process of this run of {shown} was stopped. "  # even if quiet
                  f"Where each rank was (most recent call first):\n{_stacks_text(result)}", flush=True)
            raise
        finally:
            _kill_tree(procs, run_id)  # also ends grandchildren a finished run left behind
            for reader in readers:
                reader.join(timeout=5)
            drain(logs.flush())
            events = _read_events(run_dir)

    result.duration = time.monotonic() - start
    codes = [proc.returncode for proc in procs]
    result.returncode = 124 if result.timed_out else next((c for c in codes if c), 0)
    result.output = output
    result.agent_output = "\n".join(b"".join(chunks).decode("utf-8", "replace") for chunks in agent_chunks)
    for rank in range(world):
        rows, merged = events.get(rank, []), {}
        for row in rows:
            if row["event"] == "report":
                merged.update(row["values"])
        result.reports[rank] = merged
        result.writes[rank] = [row["path"] for row in rows if row["event"] == "wrote"]
    if not result.ok and not result.timed_out:
        result.failure = _root_cause(events, world, result.agent_output, shown)
    printer.finish(output)
    result.message = _summary(result, shown)
    if show != "none":
        print(result.message, flush=True)
    return result


def _syntax_error(path):
    try:
        compile(Path(path).read_bytes(), str(path), "exec")
    except SyntaxError as exc:
        where = f"{display_path(path)}, line {exc.lineno}"
        code = (exc.text or "").rstrip()
        return f"  {where}\n    {code}\nSyntaxError: {exc.msg}"
    except FileNotFoundError:
        return f"FileNotFoundError: {path}"
    return None


def _stacks_text(result):
    parts = []
    for rank in range(result.world_size):
        stack = result.stacks.get(rank)
        parts.append(f"rank {rank}:\n{stack}" if stack else f"rank {rank}: no stack (not running yet, or already gone)")
    return "\n".join(parts)


def _summary(result, shown):
    took = f" in {result.duration:.1f} s" if result.duration else ""
    if result.ok:
        nodes = f" ({result.nnodes} nodes of {result.nproc})" if result.nnodes > 1 else ""
        return f"OK: {shown} finished on {result.world_size} rank{'s' if result.world_size > 1 else ''}{nodes}{took}."
    if result.timed_out:
        parts = [f"TIMEOUT: {shown} did not finish{took}; all its processes were killed. "
                 "Where each rank was (most recent call first):"]
        parts.append(_stacks_text(result))
        parts.append("A rank waiting in a collective usually means another rank never made the matching call.")
        return "\n".join(parts)
    failure = result.failure
    if failure is None:
        tail = "\n".join(result.agent_output.strip().splitlines()[-15:])
        return f"FAILED: {shown} (exit code {result.returncode}); torchrun said:\n{tail}"
    text = f"FAILED: {failure.summary}"
    if failure.details:
        text += "\n" + failure.details.rstrip()
    return text
