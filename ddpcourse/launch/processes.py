"""The processes of a run: find them, end them, and make them end themselves when nobody is left to.

Every process of a run carries ``DDPCOURSE_RUN_SPEC=<its run's spec>`` in its environment (children inherit
it), so a grandchild that left its session (setsid) or was re-parented is still found. Listing uses psutil, which
works on Linux, macOS and Windows (no /proc scan).

Two layers, so that no process outlives its run:
- the launcher collects the run's whole tree (children of the processes it started, plus every process
  with the run's marker) *before* killing any of it, then kills it;
- the agent wrapper and every worker run ``watch_parent``: when the process that started them is gone
  (the kernel or the CLI was killed, even with SIGKILL), they end their own descendants and exit.

``leftover_runs`` / ``end_leftover_runs`` serve ``python -m ddpcourse cleanup``.
"""
import os
import signal
import threading
import time
from dataclasses import dataclass, field

from ddpcourse.launch.spec import RUN_SPEC_ENV, RunSpec

WATCH_INTERVAL = 0.2  # seconds between two looks at the parent: well within the 5 s a run may outlive its parent


def _psutil():
    import psutil  # imported on first use: a rank that never needs it does not pay for it

    return psutil


def _environ(proc):
    psutil = _psutil()
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:  # already dead, only waiting for its parent
            return None
        return proc.environ()
    except (psutil.Error, OSError):  # gone, another user's, or not readable on this OS
        return None


def find_processes(env_entry):
    """PIDs of live processes of this user whose environment holds ``env_entry`` ("NAME=value")."""
    name, _, value = env_entry.partition("=")
    found = []
    for proc in _psutil().process_iter():
        environ = _environ(proc)
        if environ is not None and environ.get(name) == value:
            found.append(proc.pid)
    return found


def processes_of_run(spec_path):
    """PIDs of every live process of the run whose spec is ``spec_path``."""
    return find_processes(f"{RUN_SPEC_ENV}={spec_path}") if spec_path else []


def collect_tree(root_pids, spec_path):
    """psutil.Process objects of the run: the roots, all their descendants, every process with its marker.

    Collected before anything is killed: a killed parent's children are re-parented and lose their link."""
    psutil = _psutil()
    tree = {}
    for pid in root_pids:
        try:
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                tree[proc.pid] = proc
        except psutil.Error:
            pass
    try:
        for pid in processes_of_run(spec_path):
            if pid not in tree:
                tree[pid] = psutil.Process(pid)
    except (psutil.Error, OSError):
        pass  # listing unavailable: the roots' trees, the process groups and the watchdogs remain
    tree.pop(os.getpid(), None)
    return list(tree.values())


def _kill_all(procs, wait=None):
    """SIGKILL each psutil process (those already gone are skipped); then wait up to ``wait`` s for them."""
    psutil = _psutil()
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    if wait:
        psutil.wait_procs(procs, timeout=wait)


def kill_run(popens, spec_path):
    """SIGKILL every process of the run (see collect_tree), then reap the ones this process started."""
    psutil = _psutil()
    for _ in range(3):  # a dying parent can fork once more: sweep until nothing is left
        try:
            procs = collect_tree([p.pid for p in popens if p.poll() is None], spec_path)
        except (psutil.Error, OSError):
            procs = []
        for popen in popens:
            _kill_group(popen)
        _kill_all(procs, wait=2)
        if not procs:
            break
    for popen in popens:
        try:
            popen.wait(timeout=10)
        except Exception:  # noqa: BLE001 - never hang here; the watchdogs end what is left
            pass


def _kill_group(popen):
    """The agent's own process group (it was started in a new session): a cheap sweep even without listing."""
    if os.name == "nt" or popen.poll() is not None:
        return
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def end_own_tree():
    """Kill this process's descendants and every other process of its run, then this process."""
    psutil = _psutil()
    me = psutil.Process()
    try:
        procs = collect_tree([me.pid], os.environ.get(RUN_SPEC_ENV, ""))
    except (psutil.Error, OSError):
        procs = []
    _kill_all(procs)
    os._exit(1)  # nobody is left to read anything this process would still do


def watch_parent():
    """End this process and its tree (end_own_tree, from a daemon thread) as soon as its parent is gone.

    Portable: a process whose parent died is re-parented, so its parent pid changes (no prctl needed)."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(WATCH_INTERVAL)
        end_own_tree()

    threading.Thread(target=watch, name="ddpcourse-watchdog", daemon=True).start()


def listening_sockets(pids):
    """[(address, port, pid)] of every TCP socket the processes ``pids`` listen on."""
    psutil = _psutil()
    found = []
    for pid in pids:
        try:
            connections = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        found += [(c.laddr.ip, c.laddr.port, pid) for c in connections if c.status == psutil.CONN_LISTEN]
    return sorted(found)


# ----------------------------------------------------------------------------- left-over runs
@dataclass
class LeftoverRun:
    spec_path: str    # its RunSpec, which names the launcher
    launcher_pid: int
    processes: list = field(default_factory=list)  # [(pid, command line)]


def leftover_runs(include_active=False):
    """This user's course runs whose launcher (a kernel, a CLI) is gone, or every run if include_active.

    A run is left over only when its spec names its launcher and that process is provably gone: a run whose
    spec cannot be read is left alone."""
    psutil = _psutil()
    me = psutil.Process()
    user = me.username()
    runs = {}
    for proc in psutil.process_iter(["username", "cmdline"]):
        if proc.pid == me.pid or proc.info["username"] != user:
            continue
        environ = _environ(proc)
        spec_path = (environ or {}).get(RUN_SPEC_ENV)
        if not spec_path:
            continue
        if spec_path not in runs:
            runs[spec_path] = LeftoverRun(spec_path, _launcher_pid(spec_path))
        run = runs[spec_path]
        run.processes.append((proc.pid, " ".join(proc.info["cmdline"] or [proc.name()])))
    return [run for run in runs.values() if include_active or (run.launcher_pid and not _alive_launcher(run))]


def _launcher_pid(spec_path):
    try:
        return RunSpec.load(spec_path).launcher_pid
    except (OSError, ValueError, TypeError):
        return 0


def _alive_launcher(run):
    """True while the launcher of ``run`` still runs (a reused pid started later does not count)."""
    psutil = _psutil()
    try:
        launcher = psutil.Process(run.launcher_pid)
        started = min(psutil.Process(pid).create_time() for pid, _ in run.processes)
    except (psutil.Error, ValueError):
        return False
    return launcher.create_time() <= started


def end_leftover_runs(include_active=False, say=print):
    """End this user's left-over runs (see leftover_runs), saying what was ended; returns the runs."""
    psutil = _psutil()
    runs = leftover_runs(include_active)
    for run in runs:
        procs = []
        for pid, _ in run.processes:
            try:
                procs.append(psutil.Process(pid))
            except psutil.Error:
                continue
        _kill_all(procs, wait=5)
        say(f"ended the run of {os.path.dirname(run.spec_path)}: {len(run.processes)} process(es)")
        for pid, command in run.processes:
            say(f"  {pid}  {command[:150]}")
    if not runs:
        say("no left-over course runs" + ("" if include_active else " (runs whose notebook or terminal still "
                                               "waits for them are left alone; --all ends them too)"))
    return runs
