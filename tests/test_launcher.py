"""The launcher against deliberately broken scripts: each must end within its limits with a clear message
and leave no process behind. Launches are the cost here (every interpreter that imports torch takes
~1.4 s of CPU): scripts that do not need torch avoid it, one-rank runs skip torchrun's agent, and the
pure logic (root causes, event files, threads, cleanup) is tested without any launch."""
import builtins
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from ddpcourse import diagnosis, launcher, processes
from ddpcourse.launch.events import EventReader
from ddpcourse.launch.launcher import (RUN_ID_ENV, STARTUP_TIMEOUT, build_env, cgroup_cpu_quota, find_processes,
                                processes_of_run, run, threads_per_rank)

SLACK = 15.0  # a failure ends within timeout + 15 s


def script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def line_of(path, text):
    """The line number of the first line of ``path`` that contains ``text``."""
    lines = Path(path).read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if text in line)


def line_is(path, text):
    """The line number of the line of ``path`` that is exactly ``text`` (leading spaces aside)."""
    lines = Path(path).read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if line.strip() == text)


def torchrun_log_folders():
    return set(Path(tempfile.gettempdir()).glob("torchelastic_*"))


def launch(path, nproc=2, timeout=30.0, **kwargs):
    start, folders = time.monotonic(), torchrun_log_folders()
    result = run(path, nproc=nproc, timeout=timeout, show="none", **kwargs)
    assert time.monotonic() - start < STARTUP_TIMEOUT + timeout + SLACK
    assert processes_of_run(result.run_id) == []
    assert torchrun_log_folders() == folders  # torchrun's log folder was in the run's folder, deleted with it
    return result


def test_syntax_error_is_reported_without_launching(tmp_path):
    path = script(tmp_path, "broken_syntax.py", "x = 1\nif x == 1\n    print(x)\n")
    result = launch(path, timeout=10)
    assert not result.ok and not result.launched and result.run_id == ""
    assert result.failure.kind == "exception" and result.failure.error.startswith("SyntaxError")
    assert "syntax error" in result.message and "line 2" in result.message
    assert "SyntaxError" in result.message and "if x == 1" in result.message
    missing = launch(tmp_path / "no_such_lab.py", timeout=10)
    assert not missing.launched and missing.message.startswith(f"FAILED: {tmp_path / 'no_such_lab.py'} does not exist")


def test_exception_on_one_rank_names_that_rank(tmp_path):
    path = script(tmp_path, "one_rank_fails.py", """
        import os, time
        if os.environ["RANK"] == "1":
            raise ValueError("bad shard on rank 1")
        time.sleep(60)  # rank 0 would wait forever; torchrun stops it once rank 1 fails
        """)
    result = launch(path, timeout=40)
    failure = result.failure
    assert (failure.rank, failure.kind, failure.exitcode) == (1, "exception", 1)
    assert failure.error == "ValueError: bad shard on rank 1"
    assert result.message.startswith("FAILED: rank 1 raised ValueError: bad shard on rank 1")
    assert f'one_rank_fails.py", line {line_of(path, "raise ValueError")}' in result.message
    assert "ChildFailedError" not in result.message  # torchrun's wall of text stays hidden


def test_unfinished_todo_reads_as_such_on_one_rank_without_torchrun(tmp_path, monkeypatch):
    """Also a worker hook (how a check watches a script): called with the script's path before it runs."""
    script(tmp_path, "my_hook.py", """
        from ddpcourse import report
        def before(lab_file):
            report(hooked=lab_file)
        """)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    path = script(tmp_path, "07_todo_lab.py", """
        import os
        def step():
            # TODO 2: all_reduce the gradients
            raise NotImplementedError("TODO 2: all_reduce the gradients")
        print("parent", os.getppid())
        step()
        """)
    result = launch(path, nproc=1, timeout=30, env={"DDPCOURSE_WORKER_HOOKS": "my_hook:before"})
    assert result.reports[0]["hooked"] == str(path)
    failure = result.failure
    assert (failure.kind, failure.todo, failure.rank, failure.exitcode) == ("todo", 2, 0, 1)
    assert failure.hint == "all_reduce the gradients"
    assert "TODO 2 in" in result.message and "07_todo_lab.py is not done yet" in result.message
    # one rank, no torchrun options: the worker is this process's own child, no agent in between
    assert result.output[0][0] == f"parent {os.getpid()}"


def test_a_process_group_left_open_fails_the_run(tmp_path):
    """No os._exit shortcut: a script that forgets destroy_process_group() is told so, by rank."""
    path = script(tmp_path, "forgets_destroy.py", """
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        dist.all_reduce(torch.ones(1))
        """)
    result = launch(path, nproc=1, timeout=30)
    assert not result.ok and result.failure.kind == "open_process_group" and result.failure.rank == 0
    assert result.message == ("FAILED: rank 0 ended with its process group open: call "
                              "dist.destroy_process_group() at the end of the script.")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ranks are forked on Linux only")
def test_forked_ranks_skip_the_import_yet_start_as_fresh_processes(tmp_path):
    """torchrun forks the ranks from its agent (torch already imported there), but what a fresh `python`
    would have is restored: default SIGTERM (the agent's raises an exception), no atexit handlers of the
    agent's, and the script's own atexit handlers still run; a rank that ends with its group open is named."""
    path = script(tmp_path, "fresh.py", """
        import atexit, os, signal, sys
        from ddpcourse import report
        atexit.register(report, atexit_ran=True)
        report(torch_loaded="torch" in sys.modules, parent=os.getppid(), pid=os.getpid(),
               sigterm_default=signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
        import torch.distributed as dist
        dist.init_process_group("gloo")
        """)
    result = launch(path, nproc=2)
    assert result.values("torch_loaded") == [True, True]  # forked from the agent: no second import
    assert len(set(result.values("parent"))) == 1 and result.values("parent")[0] not in result.values("pid")
    assert result.values("sigterm_default") == [True, True]
    assert result.values("atexit_ran") == [True, True]
    assert not result.ok and result.failure.kind == "open_process_group" and result.failure.rank == 0
    assert result.failure.message.startswith("rank 0 ended with its process group open (ranks [1] too)")


def test_runs_torchrun_may_restart_are_built_with_fresh_interpreter_ranks(monkeypatch):
    """The launcher's choice and the command it builds (nothing is launched here)."""
    monkeypatch.delenv(launcher.FORK_RANKS_ENV, raising=False)
    on_linux = sys.platform.startswith("linux")
    assert launcher.forks_ranks([]) is on_linux
    assert launcher.forks_ranks(["--max-restarts", "0"]) is on_linux
    for options in (["--max-restarts", "1"], ["--max_restarts=3"]):
        assert launcher.forks_ranks(options) is False
        assert launcher.build_command("x.py", 2, torchrun_args=options)[-3:] == ["-m", "ddpcourse.launch.rank", "x.py"]
    monkeypatch.setenv(launcher.FORK_RANKS_ENV, "0")
    assert launcher.forks_ranks([]) is False


def _forbid_proc_reads_from_course_code(monkeypatch):
    """Make /proc unavailable to ddpcourse's own code (psutil, which uses the OS's own interface on each
    platform, still works): the cleanup must not depend on a Linux-only scan."""
    course = str(Path(processes.__file__).parent)

    def guarded(original):
        def call(path, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if str(path).startswith("/proc") and caller.startswith(course):
                raise FileNotFoundError(path)
            return original(path, *args, **kwargs)
        return call

    for module, name in [(builtins, "open"), (os, "open"), (os, "listdir"), (os, "scandir"), (os, "stat")]:
        monkeypatch.setattr(module, name, guarded(getattr(module, name)))
    monkeypatch.setattr(Path, "iterdir", lambda self: (_ for _ in ()).throw(FileNotFoundError(self))
                        if str(self).startswith("/proc") else Path.__dict__["iterdir"](self))
    listed = []
    real_iter = psutil.process_iter
    monkeypatch.setattr(psutil, "process_iter", lambda *a, **k: listed.append(1) or real_iter(*a, **k))
    return listed


def _gone(pid):
    """Ended: no such process, or a zombie waiting for its parent to read its exit code."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_grandchildren_are_killed_without_reading_proc(tmp_path, monkeypatch):
    listed = _forbid_proc_reads_from_course_code(monkeypatch)
    path = script(tmp_path, "spawner.py", """
        import atexit, subprocess, sys
        from ddpcourse import report
        atexit.register(report, atexit_ran=True)  # the rank's teardown still runs its atexit handlers
        sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
        child = subprocess.Popen(sleeper)                           # stays in the process group
        escaped = subprocess.Popen(sleeper, start_new_session=True)  # leaves it (setsid)
        report(pids=[child.pid, escaped.pid])
        """)
    result = launch(path, nproc=1, timeout=30)
    assert result.ok, result.message
    assert listed, "the run's processes were looked up through psutil"
    assert result.reports[0]["atexit_ran"] is True
    for pid in result.values("pids")[0]:
        assert _gone(pid)



@pytest.mark.parametrize("forked", [True, False], ids=["forked ranks", "fresh interpreters"])
def test_torchrun_ranks_and_their_children_are_killed_at_a_timeout_without_reading_proc(tmp_path, monkeypatch, forked):
    """Two ranks under torchrun's agent hang with a child in their process group and one that left it
    (setsid): the timeout (3 s from every rank being ready) ends them all. Ranks started as fresh
    interpreters (macOS) are each in a session of their own, so killing the agent's group misses them."""
    monkeypatch.setenv(launcher.FORK_RANKS_ENV, "1" if forked else "0")
    listed = _forbid_proc_reads_from_course_code(monkeypatch)
    path = script(tmp_path, "hangs.py", """
        import os, subprocess, sys, time
        from ddpcourse import report
        sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
        child = subprocess.Popen(sleeper)
        escaped = subprocess.Popen(sleeper, start_new_session=True)
        report(pids=[os.getpid(), child.pid, escaped.pid], own_session=os.getsid(0) == os.getpid())
        time.sleep(300)
        """)
    result = launch(path, nproc=2, timeout=3)
    assert result.timed_out and result.failure.kind == "timeout", result.message
    assert listed, "the run's processes were looked up through psutil"
    assert result.values("own_session") == [not forked] * 2
    for pid in [pid for pids in result.values("pids") for pid in pids]:
        assert _gone(pid)

WAITS = """
    import subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    print("ready", flush=True)
    time.sleep(300)
    """


def _start_cli(path, marker, nproc=2):
    env = dict(os.environ, DDPCOURSE_TEST_MARKER=marker)
    # SIGINT back to its default: a pytest started in the background by a shell inherits it ignored, and
    # Python then installs no KeyboardInterrupt handler, so the interrupt test would wait for the timeout
    cli = subprocess.Popen([sys.executable, "-m", "ddpcourse", "run", str(path), "--nproc", str(nproc),
                            "--timeout", "120"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    for line in cli.stdout:  # wait until every rank is really running
        lines.append(line)
        if sum("ready" in seen for seen in lines) == nproc:
            break
    return cli, lines


def test_interrupt_kills_the_tree(tmp_path):
    path = script(tmp_path, "waits.py", WAITS)
    marker = uuid.uuid4().hex
    cli, _ = _start_cli(path, marker, nproc=1)
    assert len(find_processes(f"DDPCOURSE_TEST_MARKER={marker}")) >= 3  # the CLI, the rank, its grandchild
    start = time.monotonic()
    cli.send_signal(signal.SIGINT)  # what the Jupyter stop button does to the kernel
    rest, _ = cli.communicate(timeout=SLACK)
    assert time.monotonic() - start < SLACK
    assert cli.returncode == 130
    assert "Interrupted: every process of this run" in rest
    assert f"waits.py:{line_is(path, 'time.sleep(300)')} in <module>:  time.sleep(300)" in rest  # where it was
    assert find_processes(f"DDPCOURSE_TEST_MARKER={marker}") == []


def test_a_killed_launcher_takes_its_run_with_it(tmp_path):
    """The kernel or the CLI killed with SIGKILL (no chance to clean up): the agent's and the workers'
    watchdogs see their parent gone and end the run, grandchildren included, within 5 s."""
    path = script(tmp_path, "waits.py", WAITS)
    marker = uuid.uuid4().hex
    cli, _ = _start_cli(path, marker)
    run_procs = [pid for pid in find_processes(f"DDPCOURSE_TEST_MARKER={marker}") if pid != cli.pid]
    assert len(run_procs) >= 5  # agent, 2 ranks, 2 grandchildren (in their own sessions)
    cli.kill()
    cli.communicate(timeout=SLACK)
    deadline = time.monotonic() + 5.0
    while find_processes(f"DDPCOURSE_TEST_MARKER={marker}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert find_processes(f"DDPCOURSE_TEST_MARKER={marker}") == []


SOCKETS = """
    import os, torch, torch.distributed as dist
    from ddpcourse import report
    from ddpcourse.launch.processes import RUN_ID_ENV, listening_sockets, processes_of_run
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 0:  # every process of this run is up: the agent, both ranks
        report(listening=listening_sockets(processes_of_run(os.environ[RUN_ID_ENV])), pid=os.getpid(),
               store_port=int(os.environ["MASTER_PORT"]))
    dist.barrier()
    dist.destroy_process_group()
    """


ENV_REPORT = """
    import os
    from ddpcourse import report
    rank = int(os.environ["RANK"])
    print(f"hello from {rank}")
    print("second line", flush=True)
    report(rank=rank, omp=os.environ["OMP_NUM_THREADS"], addr=os.environ["MASTER_ADDR"],
           world=int(os.environ["WORLD_SIZE"]), nested={"square": [rank * rank]})
    """


def test_two_runs_at_once_report_per_rank_and_list_their_sockets(tmp_path, capsys, monkeypatch):
    """Two runs at the same time (they must not collide): one reports its output and environment per rank,
    the other lists the sockets its processes listen on."""
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # set by the user: kept (torchrun's default would be 1)
    reporter = {}
    other = threading.Thread(target=lambda: reporter.update(
        result=run(script(tmp_path, "env_report.py", ENV_REPORT), nproc=2, timeout=60, show="rank0")))
    other.start()
    sockets = launch(script(tmp_path, "sockets.py", SOCKETS), nproc=2, timeout=60)
    other.join(timeout=STARTUP_TIMEOUT + 60 + SLACK)
    printed = capsys.readouterr().out

    result = reporter["result"]
    assert result.ok and result.launched and result.nproc == 2, result.message
    assert processes_of_run(result.run_id) == []
    assert result.output == {0: ["hello from 0", "second line"], 1: ["hello from 1", "second line"]}
    assert result.values("rank") == [0, 1]
    assert result.values("nested") == [{"square": [0]}, {"square": [1]}]
    assert result.values("world") == [2, 2]
    assert result.values("addr") == ["127.0.0.1"] * 2
    assert result.values("omp") == ["3", "3"]
    # rank-0-only mode shows rank 0's lines live, but the result keeps every rank's
    assert "[rank 0] hello from 0" in printed and "[rank 1]" not in printed
    assert any(line.startswith("OK: ") and "env_report.py" in line for line in printed.splitlines())

    assert sockets.ok, sockets.message
    listening = sockets.reports[0]["listening"]
    assert listening, "the run's stores listen somewhere"
    exposed = [(port, pid) for address, port, pid in listening if address not in ("127.0.0.1", "::1")]
    print("listening:", listening)
    # The agent's rendezvous store is on loopback; the one socket beyond it is torch's own store for
    # init_process_group, served by rank 0 on the run's port (docs/troubleshooting.md, the firewall row).
    rank0 = sockets.reports[0]
    assert exposed == [(rank0["store_port"], rank0["pid"])]


def test_two_nodes_on_this_machine_give_global_and_local_ranks(tmp_path):
    path = script(tmp_path, "nodes.py", """
        import os
        from ddpcourse import report
        report(rank=int(os.environ["RANK"]), node=int(os.environ["GROUP_RANK"]), local=int(os.environ["LOCAL_RANK"]))
        """)
    result = launch(path, nproc=2, nnodes=2, timeout=60)
    assert result.ok, result.message
    assert result.world_size == 4 and "4 ranks (2 nodes of 2)" in result.message
    by_rank = [(r["rank"], r["node"], r["local"]) for r in (result.reports[i] for i in range(4))]
    assert by_rank == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]


def test_max_restarts_restarts_every_rank_after_one_dies(tmp_path):
    path = script(tmp_path, "dies_once.py", """
        import os, torch, torch.distributed as dist
        from ddpcourse import report
        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        dist.init_process_group("gloo")
        dist.all_reduce(torch.ones(1))  # every rank is connected to every other
        if attempt == 0 and dist.get_rank() == 1:
            os._exit(7)  # the first attempt loses rank 1
        dist.all_reduce(torch.ones(1))  # the restarted ranks must reconnect, not reuse old addresses
        report(attempt=attempt)
        dist.destroy_process_group()
        """)
    result = launch(path, nproc=2, timeout=60, torchrun_args=["--max-restarts", "1"])
    assert result.ok, result.message
    assert result.values("attempt") == [1, 1]  # every rank restarted; reports are the last attempt's
    assert "--- torchrun restarted this rank (restart 1) ---" in result.output[1]


# ----------------------------------------------------------------------------- no launch
def _events(*kinds, **fields):
    return [{"event": kind, "time": float(i), "pid": 1, **fields} for i, kind in enumerate(kinds)]


def test_a_crash_after_the_script_finished_is_explained_from_exit_codes():
    finished = _events("started", "ready", "finished", process_group_open=False)
    failure = diagnosis.root_cause({rank: finished for rank in range(3)}, 3, {2: -6, 0: -15}, "lab.py")
    assert (failure.rank, failure.kind, failure.exitcode) == (2, "signal", -6)
    assert failure.message == "rank 2 ran its script to the end, then was killed by SIGABRT while exiting."


def test_a_rank_that_vanished_is_the_root_cause_not_the_peer_it_left():
    peer = _events("started", "ready") + [{"event": "exception", "time": 9.0, "pid": 2, "type": "RuntimeError",
                                           "message": "Connection reset by peer", "traceback": "..."}]
    failure = diagnosis.root_cause({0: peer, 1: _events("started", "ready")}, 2, {1: 3, 0: -15}, "lab.py")
    assert (failure.rank, failure.kind, failure.exitcode) == (1, "exit", 3)
    assert "rank 1 exited with code 3 without a Python exception" in failure.message
    assert failure.kind in diagnosis.KINDS


def test_a_rank_that_returned_early_explains_its_peers_failed_collective():
    """Rank 1 ended (sys.exit(0), its group still open) while rank 0 waited in a collective for it."""
    ended = _events("started", "ready", "finished", process_group_open=True)
    waiting = _events("started", "ready") + [{"event": "exception", "time": 9.0, "pid": 2, "type": "RuntimeError",
                                              "message": "Connection closed by peer", "traceback": "tb"}]
    failure = diagnosis.root_cause({0: waiting, 1: ended}, 2, {0: 1}, "lab.py")
    assert (failure.rank, failure.kind, failure.exitcode) == (0, "exception", 1)
    assert failure.message.startswith("rank 0 failed in a collective because rank(s) [1] had already ended")


def test_a_partial_event_line_never_crashes_the_reader(tmp_path):
    whole = json.dumps({"event": "report", "time": 1.0, "pid": 1, "values": {"x": 1}})
    (tmp_path / "rank0.events").write_text(whole + "\n" + whole[:17])  # read mid-write
    reader = EventReader(tmp_path)
    assert [e["values"] for _, e in reader.poll()] == [{"x": 1}]
    with open(tmp_path / "rank0.events", "a") as f:  # the rest of the line arrives
        f.write(whole[17:].replace('"x": 1', '"x": 2') + "\n" + '{"event": "rep')  # then a rank killed mid-write
    assert reader.reports(0) == {"x": 1} and [e["values"] for _, e in reader.poll()] == [{"x": 2}]
    reader.close()
    assert reader.reports(0) == {"x": 2} and reader.damaged == 1


def test_threads_divide_the_usable_cores_unless_the_user_chose(monkeypatch, tmp_path):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr("ddpcourse.launch.launcher.cgroup_cpu_quota", lambda: None)
    assert threads_per_rank(2) == "4" and threads_per_rank(3) == "2" and threads_per_rank(16) == "1"
    assert build_env(2, tmp_path, "id")["OMP_NUM_THREADS"] == "4"  # the launcher sets it, torchrun would say 1
    monkeypatch.setattr("ddpcourse.launch.launcher.cgroup_cpu_quota", lambda: 2.5)  # a container granted 2.5 CPUs
    assert threads_per_rank(2) == "1" and threads_per_rank(1) == "2"
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    assert build_env(2, tmp_path, "id")["OMP_NUM_THREADS"] == "6"


def test_cgroup_quota_is_read_from_v2_and_v1_files(tmp_path):
    at_root = tmp_path / "self_cgroup"
    at_root.write_text("0::/\n")
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert cgroup_cpu_quota(tmp_path, at_root) == 2.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(tmp_path, at_root) is None
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(tmp_path, at_root) == 3.0


def test_cgroup_quota_follows_this_process_cgroup_up_to_the_root(tmp_path):
    """A fake /sys/fs/cgroup and /proc/self/cgroup: the quota of the process's own cgroup and its parents
    counts, the tightest one wins; a sibling's quota does not."""
    fs, self_cgroup = tmp_path / "fs", tmp_path / "self_cgroup"
    for folder, limit in [("", "max"), ("user.slice", "300000 100000"), ("user.slice/job", "max"),
                          ("user.slice/job/leaf", "max"), ("other", "50000 100000")]:
        (fs / folder).mkdir(parents=True, exist_ok=True)
        (fs / folder / "cpu.max").write_text(limit + "\n")
    self_cgroup.write_text("0::/user.slice/job/leaf\n")
    assert cgroup_cpu_quota(fs, self_cgroup) == 3.0  # from the parent slice, not the unlimited root
    (fs / "user.slice/job/leaf/cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(fs, self_cgroup) == 1.5  # the tighter own limit wins
    self_cgroup.write_text("0::/not/mounted/here\n")  # a path that this mount does not show: the root only
    assert cgroup_cpu_quota(fs, self_cgroup) is None
    # cgroup v1: the cpu controller's line names the path under the cpu mount
    v1 = tmp_path / "v1"
    (v1 / "cpu" / "docker" / "abc").mkdir(parents=True)
    for folder, quota in [("cpu", "-1"), ("cpu/docker", "200000"), ("cpu/docker/abc", "-1")]:
        (v1 / folder / "cpu.cfs_quota_us").write_text(quota + "\n")
        (v1 / folder / "cpu.cfs_period_us").write_text("100000\n")
    self_cgroup.write_text("4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/\n")
    assert cgroup_cpu_quota(v1, self_cgroup) == 2.0


def test_cleanup_ends_left_over_runs_and_says_what_it_ended(capsys):
    """A run whose launcher is gone (here: a pid that ended) is left over; cleanup ends it. Only this test's
    own run is looked at: other runs on this machine are not the test's to end."""
    run_id = uuid.uuid4().hex
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    env = dict(os.environ, **{RUN_ID_ENV: run_id, processes.LAUNCHER_PID_ENV: str(gone.pid)})
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env)
    mine = lambda found: found.run_id == run_id  # noqa: E731
    try:
        deadline = time.monotonic() + 10
        while not processes_of_run(run_id) and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = dict(env, **{processes.LAUNCHER_PID_ENV: str(os.getpid())})
        assert processes.leftover_runs(select=lambda found: found.run_id == run_id)[0].processes[0][0] == orphan.pid
        ended = processes.end_leftover_runs(select=mine)
        printed = capsys.readouterr().out
        assert [r.run_id for r in ended] == [run_id]
        assert f"ended run {run_id[:12]}: 1 process(es)" in printed and str(orphan.pid) in printed
        assert not psutil.pid_exists(orphan.pid)  # killed and reaped
        assert processes.end_leftover_runs(select=mine) == [] and "no left-over course runs" in capsys.readouterr().out
        # a run whose launcher still runs (this process) is not left over
        active = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=alive)
        try:
            assert processes.leftover_runs(select=mine) == []
            assert len(processes.leftover_runs(include_active=True, select=mine)) == 1
        finally:
            active.kill()
            active.wait()
    finally:
        orphan.kill()


def test_a_start_up_timeout_says_the_ranks_did_not_start():
    """Without a launch: the verdict names the limit that ran out, so a slow start-up does not read as a hang."""
    from ddpcourse.launch.launcher import RunResult
    from ddpcourse.launch.printing import verdict
    startup = RunResult("x.py", nproc=2, returncode=124, duration=121.3, timed_out=True, failure=diagnosis.RankFailure(
        0, diagnosis.TIMEOUT, message=f"x.py: the ranks did not start within {STARTUP_TIMEOUT:g} s"))
    text = verdict(startup, "x.py")
    assert text.startswith(f"TIMEOUT: x.py: the ranks did not start within {STARTUP_TIMEOUT:g} s (stopped after 121.3 s); ")
    assert "had not begun" in text and "matching call" not in text
    hang = RunResult("x.py", nproc=2, returncode=124, duration=10.4, timed_out=True, failure=diagnosis.RankFailure(
        0, diagnosis.TIMEOUT, message="x.py did not finish within 10 s of every rank being ready"))
    text = verdict(hang, "x.py")
    assert text.startswith("TIMEOUT: x.py did not finish in 10.4 s; ") and "matching call" in text
