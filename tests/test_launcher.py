"""The launcher against deliberately broken scripts: each must end within its limits with a clear message
and leave no process behind. Launches are the cost here: every run, one rank too, starts torchrun's agent
(an interpreter that imports torch, ~1.4 s of CPU) and each rank as a fresh interpreter. So scripts that do
not need torch avoid it, tests that can share a launch share it (a module fixture, or two runs at once), and
the pure logic (commands, root causes, event files, threads, cleanup) is tested without any launch."""
import builtins
import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from ddpcourse.launch import diagnosis, processes
from ddpcourse.launch.cores import cgroup_cpu_quota, threads_per_rank
from ddpcourse.launch.events import EventReader
from ddpcourse.launch.launcher import STARTUP_TIMEOUT, build_command, build_env, run
from ddpcourse.launch.processes import find_processes, processes_of_run
from ddpcourse.launch.spec import RUN_SPEC_ENV, RunSpec

SLACK = 15.0  # a failure ends within timeout + 15 s


def script(tmp_path, name, body):
    tmp_path.mkdir(exist_ok=True)
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


def run_tmpdir(path):
    """A temporary folder of the run's own (its processes' $TMPDIR) beside the script ``path``: a folder that
    torchrun would leave behind (``torchelastic_*``) shows up there, not among other programs' in /tmp."""
    folder = Path(path).parent / "run_tmpdir"
    folder.mkdir(exist_ok=True)
    return folder


def torchrun_log_folders(tmpdir):
    return sorted(Path(tmpdir).glob("torchelastic_*"))


def launch(path, nproc=2, timeout=30.0, env=None, **kwargs):
    """run() without output, then check what every run must leave: it ended within its limits, no process of
    the run is left, and torchrun left no log folder in the run's $TMPDIR (run_tmpdir)."""
    tmpdir, start = run_tmpdir(path), time.monotonic()
    result = run(path, nproc=nproc, timeout=timeout, show="none", env={"TMPDIR": str(tmpdir), **(env or {})},
                 **kwargs)
    assert time.monotonic() - start < STARTUP_TIMEOUT + timeout + SLACK
    assert processes_of_run(result.run_id) == []
    assert torchrun_log_folders(tmpdir) == []  # torchrun's log folder was in the run's folder, deleted with it
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


def _forbid_proc_reads_from_course_code(monkeypatch):
    """Make /proc unavailable to ddpcourse's own code (psutil, which uses the OS's own interface on each
    platform, still works): the cleanup must not depend on a Linux-only scan."""
    course = str(Path(processes.__file__).parent.parent)

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


# ----------------------------------------------------------------------------- one rank, one launch
OBSERVER = """
    calls = []

    def observe(spec, lab_file):
        calls.append({"spec": spec.path, "file": spec.file, "lab_file": lab_file, "launcher_pid": spec.launcher_pid,
                      "options": spec.observer_options})
    """

ONE_RANK = """
    import sys
    torch_at_start = "torch" in sys.modules  # the script's first line: what the rank brought with it
    import atexit, os, subprocess
    import psutil
    import course_observer  # the module the rank's observer call already imported
    from ddpcourse import report
    atexit.register(report, atexit_ran=True)  # the rank ends through sys.exit, so atexit handlers still run
    sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
    child = subprocess.Popen(sleeper)                           # stays in the rank's process group
    escaped = subprocess.Popen(sleeper, start_new_session=True)  # leaves it (setsid)
    agent = psutil.Process(os.getppid())
    report(torch_at_start=torch_at_start, observer_calls=course_observer.calls, sleepers=[child.pid, escaped.pid],
           course_variables=sorted(k for k in os.environ if k.startswith("DDPCOURSE_")),
           spec_variable=os.environ["DDPCOURSE_RUN_SPEC"], cmdline=psutil.Process().cmdline(),
           parent_cmdline=agent.cmdline(), grandparent=agent.ppid())

    def step():
        # TODO 2: all_reduce the gradients
        raise NotImplementedError("TODO 2: all_reduce the gradients")

    step()
    """


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """One launch of a one-rank script that does not import torch, shared by the tests below: with an
    observer named in the run (a module on PYTHONPATH), with /proc closed to ddpcourse's code in this process
    (see _forbid_proc_reads_from_course_code). The script reports what its process is, leaves two sleeping
    grandchildren behind, then stops at an unfinished TODO. Returns (script path, RunResult, psutil listings)."""
    tmp_path = tmp_path_factory.mktemp("one_rank")
    script(tmp_path, "course_observer.py", OBSERVER)
    path = script(tmp_path, "07_todo_lab.py", ONE_RANK)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
        listed = _forbid_proc_reads_from_course_code(monkeypatch)
        result = launch(path, nproc=1, timeout=30, observer="course_observer:observe",
                        observer_options={"watch": "checkpoints"})
    return path, result, listed


def test_even_one_rank_is_a_fresh_interpreter_started_by_torchruns_agent(one_rank):
    """No fork and no direct start: the rank's parent is torchrun's agent (whose parent is this launcher), the
    rank runs `python -m ddpcourse.launch.rank FILE`, and torch, which the agent imported, is not in the
    rank's sys.modules when a script that does not import it starts."""
    _, result, _ = one_rank
    facts = result.reports[0]
    assert facts["parent_cmdline"][1:3] == ["-m", "ddpcourse.launch.agent"], facts["parent_cmdline"]
    assert facts["grandparent"] == os.getpid()
    assert facts["cmdline"][-3:] == ["-m", "ddpcourse.launch.rank", result.file], facts["cmdline"]
    assert facts["torch_at_start"] is False


def test_the_observer_named_in_the_run_is_called_with_its_spec_before_the_script(one_rank):
    """run(observer="module:function") writes it into run.json; the rank calls it once with the RunSpec it
    read back (options included) and the script's path, and the script finds that call already made."""
    _, result, _ = one_rank
    assert result.reports[0]["observer_calls"] == [{
        "spec": result.run_id, "file": result.file, "lab_file": result.file, "launcher_pid": os.getpid(),
        "options": {"watch": "checkpoints"}}]


def test_the_only_course_variable_a_rank_gets_is_its_run_spec(one_rank):
    """The launcher hands the run to its processes as a file (RunSpec); only that file's path crosses the
    process boundary. Course variables this test's own environment has (e.g. DDPCOURSE_LAB_SOURCE, where a
    user set it) are inherited and allowed."""
    _, result, _ = one_rank
    inherited = {name for name in os.environ if name.startswith("DDPCOURSE_")}
    assert RUN_SPEC_ENV not in inherited
    assert set(result.reports[0]["course_variables"]) - inherited == {RUN_SPEC_ENV}
    assert result.reports[0]["spec_variable"] == result.run_id and result.run_id.endswith("run.json")


def test_an_unfinished_todo_reads_as_such(one_rank):
    path, result, _ = one_rank
    failure = result.failure
    assert (failure.kind, failure.todo, failure.rank, failure.exitcode) == ("todo", 2, 0, 1)
    assert failure.hint == "all_reduce the gradients"
    assert "TODO 2 in" in result.message and "07_todo_lab.py is not done yet" in result.message
    assert f"(line {line_of(path, 'raise NotImplementedError')})" in result.message
    assert result.reports[0]["atexit_ran"] is True  # sys.exit(1) after the recorded exception, not os._exit


def test_grandchildren_are_killed_without_reading_proc(one_rank):
    """The rank started a child in its process group and one in a session of its own, then ended: both are
    gone after the run, found through psutil (launch() also found no process of the run left)."""
    _, result, listed = one_rank
    assert listed, "the run's processes were looked up through psutil"
    for pid in result.values("sleepers")[0]:
        assert _gone(pid)


# ----------------------------------------------------------------------------- more launches
def test_a_process_group_left_open_fails_the_run(tmp_path):
    """A script that forgets destroy_process_group() is told so, by rank. Without the call torch may also
    abort while the rank's interpreter shuts down (docs/troubleshooting.md, "terminate called ..."); the
    verdict then says so after the same advice."""
    path = script(tmp_path, "forgets_destroy.py", """
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        dist.all_reduce(torch.ones(1))
        """)
    result = launch(path, nproc=1, timeout=30)
    assert not result.ok and result.failure.kind == "open_process_group" and result.failure.rank == 0
    code = result.failure.exitcode
    assert code in (0, -signal.SIGABRT), result.message
    then = f", then {diagnosis.describe_exit(code)} while exiting" if code else ""
    assert result.message == (f"FAILED: rank 0 ended with its process group open{then}: call "
                              "dist.destroy_process_group() at the end of the script.")


def test_every_run_starts_its_ranks_through_torchruns_agent(tmp_path):
    """The commands and environment the launcher builds (nothing is launched here): one node or several, one
    rank or more, with restarts or not, the same agent starts each rank as `-m ddpcourse.launch.rank FILE ARGS`
    on the loopback interface, and the environment adds one course variable, the run spec's path."""
    rank_command = ["-m", "ddpcourse.launch.rank", "x.py", "--epochs", "1"]
    for nproc, options in [(1, []), (2, []), (2, ["--max-restarts", "1"])]:
        command = build_command(nproc, ["x.py", "--epochs", "1"], torchrun_args=options)
        assert command[:3] == [sys.executable, "-m", "ddpcourse.launch.agent"] and "--standalone" in command
        assert command[-5:] == rank_command and command[command.index("--nproc-per-node") + 1] == str(nproc)
        assert command[command.index("--local-addr") + 1] == "127.0.0.1"
        assert all(option in command for option in options)
    for node in (0, 1):  # two agents meet at a rendezvous on 127.0.0.1; the first serves its store
        command = build_command(2, ["x.py"], rendezvous=(29400, "run-id", 2, node == 0))
        assert command[command.index("--rdzv-endpoint") + 1] == "127.0.0.1:29400" and "--standalone" not in command
        assert ("--serve-store" in command) is (node == 0) and command[-3:] == ["-m", "ddpcourse.launch.rank", "x.py"]
    spec_path = str(tmp_path / "run.json")
    env = build_env(2, spec_path)
    added = {name for name in env if name.startswith("DDPCOURSE_")} - {name for name in os.environ
                                                                      if name.startswith("DDPCOURSE_")}
    assert added == {RUN_SPEC_ENV} and env[RUN_SPEC_ENV] == spec_path
    assert (env["MASTER_ADDR"], env["PYTHONUNBUFFERED"]) == ("127.0.0.1", "1")


def test_torchrun_ranks_and_their_children_are_killed_at_a_timeout_without_reading_proc(tmp_path, monkeypatch):
    """Two ranks under torchrun's agent hang with a child in their process group and one that left it
    (setsid): the timeout (3 s from every rank being ready) ends them all. torchrun starts each rank in a
    session of its own, so killing the agent's process group alone would miss the ranks and their children."""
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
    assert result.values("own_session") == [True, True]
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
    """SIGINT to the CLI (KeyboardInterrupt, as the Jupyter stop button raises in a kernel): it shows where the
    rank was, ends the agent (in a session of its own, so it never saw the signal), the rank and its
    grandchild, and exits with 130."""
    path = script(tmp_path, "waits.py", WAITS)
    marker = uuid.uuid4().hex
    cli, _ = _start_cli(path, marker, nproc=1)
    assert len(find_processes(f"DDPCOURSE_TEST_MARKER={marker}")) >= 4  # the CLI, the agent, the rank, its grandchild
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
    from ddpcourse.launch.processes import listening_sockets, processes_of_run
    from ddpcourse.launch.spec import RUN_SPEC_ENV
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 0:  # every process of this run is up: the agent, both ranks
        report(listening=listening_sockets(processes_of_run(os.environ[RUN_SPEC_ENV])), pid=os.getpid(),
               store_port=int(os.environ["MASTER_PORT"]))
    dist.barrier()
    dist.destroy_process_group()
    """


ENV_REPORT = """
    import atexit, os
    from ddpcourse import report
    atexit.register(report, atexit_ran=True)  # a rank that finished still runs the script's atexit handlers
    rank = int(os.environ["RANK"])
    print(f"hello from {rank}")
    print("second line", flush=True)
    report(rank=rank, node=int(os.environ["GROUP_RANK"]), local=int(os.environ["LOCAL_RANK"]),
           omp=os.environ["OMP_NUM_THREADS"], addr=os.environ["MASTER_ADDR"], world=int(os.environ["WORLD_SIZE"]),
           nested={"square": [rank * rank]})
    """


def test_two_runs_at_once_report_per_rank_and_list_their_sockets(tmp_path, capsys, monkeypatch):
    """Two runs at the same time (they must not collide): one, on two torchrun agents ("nodes") of two ranks
    each, reports its output and environment per rank, global and local; the other lists the sockets its
    processes listen on."""
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # set by the user: kept (torchrun's default would be 1)
    reporter, env_report = {}, script(tmp_path / "nodes", "env_report.py", ENV_REPORT)
    other = threading.Thread(target=lambda: reporter.update(result=run(
        env_report, nproc=2, nnodes=2, timeout=60, show="rank0", env={"TMPDIR": str(run_tmpdir(env_report))})))
    other.start()
    sockets = launch(script(tmp_path, "sockets.py", SOCKETS), nproc=2, timeout=60)
    other.join(timeout=STARTUP_TIMEOUT + 60 + SLACK)
    printed = capsys.readouterr().out

    result = reporter["result"]
    assert result.ok and result.launched and result.nproc == 2, result.message
    assert result.world_size == 4 and "4 ranks (2 nodes of 2)" in result.message
    assert processes_of_run(result.run_id) == [] and torchrun_log_folders(run_tmpdir(env_report)) == []
    assert result.output == {rank: [f"hello from {rank}", "second line"] for rank in range(4)}
    by_rank = [(r["rank"], r["node"], r["local"]) for r in (result.reports[i] for i in range(4))]
    assert by_rank == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert result.values("nested") == [{"square": [rank * rank]} for rank in range(4)]
    assert result.values("world") == [4] * 4
    assert result.values("addr") == ["127.0.0.1"] * 4
    assert result.values("omp") == ["3"] * 4
    assert result.values("atexit_ran") == [True] * 4
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
    assert result.ok, f"{result.message}\ntorchrun's agent said:\n{result.agent_output[-6000:]}"  # which attempt failed
    assert result.values("attempt") == [1, 1]  # every rank restarted; reports are the last attempt's
    assert "--- torchrun restarted this rank (restart 1) ---" in result.output[1]


# ----------------------------------------------------------------------------- no launch
def _events(*kinds, **fields):
    return [{"event": kind, "time": float(i), "pid": 1, **fields} for i, kind in enumerate(kinds)]


def test_a_crash_after_the_script_finished_is_explained_from_exit_codes():
    finished = _events("started", "ready", "finished", process_group_open=False)
    failure = diagnosis.root_cause({rank: finished for rank in range(3)}, 3, {2: -11, 0: -15}, "lab.py")
    assert (failure.rank, failure.kind, failure.exitcode) == (2, "signal", -11)
    assert failure.message == "rank 2 ran its script to the end, then was killed by SIGSEGV while exiting."


def test_torchs_exit_abort_after_a_complete_run_is_said_and_not_the_learners_failure():
    """Every rank finished and left its group, then torch aborted one at exit (its exit race): the run is
    ok and its verdict says what happened; the same abort after anything less is still a failure."""
    from ddpcourse.launch.launcher import RunResult
    from ddpcourse.launch.printing import verdict

    finished = _events("started", "ready", "finished", process_group_open=False)
    events = {rank: finished for rank in range(3)}
    assert diagnosis.aborted_after_finishing(events, 3, {1: -6, 0: -15}) == [1]
    assert diagnosis.root_cause(events, 3, {1: -6, 0: -15}, "lab.py") is None
    result = RunResult(file="lab.py", nproc=3, returncode=0, duration=1.0, aborted_at_exit=[1])
    assert result.ok and verdict(result, "lab.py").splitlines() == [
        "OK: lab.py finished on 3 ranks in 1.0 s.",
        "(after the script ended, torch aborted rank(s) [1] while exiting: its exit race, "
        "docs/troubleshooting.md; the run's results are complete)"]
    unfinished = {**events, 2: _events("started", "ready")}  # rank 2 was still running
    assert diagnosis.aborted_after_finishing(unfinished, 3, {1: -6, 2: -15}) == []
    open_group = {rank: _events("started", "ready", "finished", process_group_open=True) for rank in range(3)}
    assert diagnosis.aborted_after_finishing(open_group, 3, {1: -6}) == []
    assert diagnosis.root_cause(open_group, 3, {1: -6}, "lab.py").kind == "open_process_group"


def test_a_rank_that_vanished_is_the_root_cause_not_the_peer_it_left():
    peer = _events("started", "ready") + [{"event": "exception", "time": 9.0, "pid": 2, "type": "RuntimeError",
                                           "message": "Connection reset by peer", "traceback": "..."}]
    failure = diagnosis.root_cause({0: peer, 1: _events("started", "ready")}, 2, {1: 3, 0: -15}, "lab.py")
    assert (failure.rank, failure.kind, failure.exitcode) == (1, "exit", 3)
    assert "rank 1 exited with code 3 without a Python exception" in failure.message
    assert failure.kind in set(diagnosis.FailureKind)


def test_a_lone_rank_killed_by_a_signal_names_it_and_no_peers():
    """One rank, killed by SIGSEGV (lab 07 without its unit.state line): the likely cause, and no "other
    ranks" that do not exist."""
    failure = diagnosis.root_cause({0: _events("started", "ready")}, 1, {0: -11}, "lab.py")
    assert (failure.rank, failure.kind, failure.exitcode) == (0, "signal", -11)
    assert failure.message.startswith("rank 0 was killed by SIGSEGV (a crash in torch's C++ code: often a tensor ")
    assert "other ranks" not in failure.message and failure.message.endswith(").")


def test_a_rank_that_returned_early_explains_its_peers_failed_collective():
    """Rank 1 ended (sys.exit(0), its group still open) while rank 0 waited in a collective for it."""
    ended = _events("started", "ready", "finished", process_group_open=True)
    waiting = _events("started", "ready") + [{"event": "exception", "time": 9.0, "pid": 2, "type": "RuntimeError",
                                              "message": "Connection closed by peer", "traceback": "tb"}]
    failure = diagnosis.root_cause({0: waiting, 1: ended}, 2, {0: 1}, "lab.py")
    assert (failure.rank, failure.kind, failure.exitcode) == (0, "exception", 1)
    assert failure.message.startswith("rank 0 failed in a collective because rank(s) [1] had already ended")


def test_ranks_that_left_their_group_open_are_named_once():
    """Every rank finished with its process group open: the lowest is named, the others in one parenthesis;
    a rank that torch then aborted at exit is said to have been killed while exiting."""
    open_group = _events("started", "ready", "finished", process_group_open=True)
    failure = diagnosis.root_cause({rank: open_group for rank in range(3)}, 3, {}, "lab.py")
    assert (failure.rank, failure.kind, failure.exitcode) == (0, "open_process_group", 0)
    assert failure.message == ("rank 0 ended with its process group open (ranks [1, 2] too): call "
                               "dist.destroy_process_group() at the end of the script.")
    aborted = diagnosis.root_cause({rank: open_group for rank in range(2)}, 2, {0: -6}, "lab.py")
    assert aborted.message.startswith("rank 0 ended with its process group open (ranks [1] too), then was "
                                      "killed by SIGABRT while exiting: call dist.destroy_process_group()")


def test_a_partial_event_line_never_crashes_the_reader(tmp_path):
    whole = json.dumps({"event": "report", "time": 1.0, "pid": 1, "values": {"x": 1}})
    (tmp_path / "rank0.events").write_text(whole + "\n" + whole[:17])  # read mid-write
    reader = EventReader(tmp_path)
    assert [e["values"] for _, e in reader.poll()] == [{"x": 1}]
    with open(tmp_path / "rank0.events", "a") as f:  # the rest of the line arrives
        f.write(whole[17:].replace('"x": 1', '"x": 2') + "\n" + '{"event": "rep')  # then a rank killed mid-write
    assert reader.reports(0) == {"x": 1} and [e["values"] for _, e in reader.poll()] == [{"x": 2}]
    reader.close()
    assert reader.reports(0) == {"x": 2} and len(reader.events(0)) == 2  # the cut line was dropped


def test_threads_divide_the_usable_cores_unless_the_user_chose(monkeypatch, tmp_path):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr("ddpcourse.launch.cores.cgroup_cpu_quota", lambda: None)
    assert threads_per_rank(2) == "4" and threads_per_rank(3) == "2" and threads_per_rank(16) == "1"
    spec_path = tmp_path / "run.json"
    assert build_env(2, spec_path)["OMP_NUM_THREADS"] == "4"  # the launcher sets it, torchrun would say 1
    monkeypatch.setattr("ddpcourse.launch.cores.cgroup_cpu_quota", lambda: 2.5)  # a container granted 2.5 CPUs
    assert threads_per_rank(2) == "1" and threads_per_rank(1) == "2"
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    assert build_env(2, spec_path)["OMP_NUM_THREADS"] == "6"


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


def test_cleanup_ends_left_over_runs_and_says_what_it_ended(capsys, tmp_path, monkeypatch):
    """A run whose spec names a launcher that is gone (here: a pid that ended) is left over; cleanup ends it.
    A run whose launcher still runs (this process) and one whose spec cannot be read are not left over. Only
    this test's own runs are looked at: other runs on this machine are not the test's to end."""
    def sleeper(spec_path):
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                env=dict(os.environ, **{RUN_SPEC_ENV: str(spec_path)}))

    def spec_of(name, launcher_pid):
        (tmp_path / name).mkdir()
        return RunSpec("lab.py", run_dir=str(tmp_path / name), launcher_pid=launcher_pid).save()

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    left_over, active = spec_of("left_over", gone.pid), spec_of("active", os.getpid())
    unreadable = str(tmp_path / "removed" / "run.json")
    started = [sleeper(left_over), sleeper(active), sleeper(unreadable)]
    orphan = started[0]
    # cleanup sees this test's sleepers only: other runs on this machine are not the test's to end
    every_process, mine = psutil.process_iter, {process.pid for process in started}
    monkeypatch.setattr(psutil, "process_iter",
                        lambda *args, **kwargs: [p for p in every_process(*args, **kwargs) if p.pid in mine])
    try:
        deadline = time.monotonic() + 10
        while sum(bool(processes_of_run(path)) for path in (left_over, active, unreadable)) < 3:
            assert time.monotonic() < deadline, "the test's sleepers did not show up"
            time.sleep(0.05)
        found = processes.leftover_runs()
        assert [(r.spec_path, r.launcher_pid, r.processes[0][0]) for r in found] == [(left_over, gone.pid, orphan.pid)]
        ended = processes.end_leftover_runs()
        printed = capsys.readouterr().out
        assert [r.spec_path for r in ended] == [left_over]
        assert f"ended the run of {tmp_path / 'left_over'}: 1 process(es)" in printed and str(orphan.pid) in printed
        assert not psutil.pid_exists(orphan.pid)  # killed and reaped
        assert processes.end_leftover_runs() == [] and "no left-over course runs" in capsys.readouterr().out
        everything = processes.leftover_runs(include_active=True)
        assert sorted((r.spec_path, r.launcher_pid) for r in everything) == sorted([(active, os.getpid()),
                                                                                    (unreadable, 0)])
    finally:
        for process in started:
            process.kill()
            process.wait()


def test_a_start_up_timeout_says_the_ranks_did_not_start(tmp_path, monkeypatch):
    """A run whose ranks cannot be ready in time (a start-up limit shorter than importing torch): the verdict,
    the launcher's own, names the limit that ran out and each rank still starting, so it does not read as a hang."""
    from ddpcourse.launch import launcher
    from ddpcourse.launch.launcher import RunResult
    from ddpcourse.launch.printing import verdict
    from ddpcourse.launch.stacks import STILL_STARTING
    monkeypatch.setattr(launcher, "STARTUP_TIMEOUT", 0.5)
    path = script(tmp_path, "x.py", "import torch\nprint('never here')\n")
    result = run(path, nproc=2, timeout=60, show="none")
    text = result.message
    assert result.timed_out and result.returncode == 124
    assert text.startswith(f"TIMEOUT: {result.failure.message.split(':')[0]}: the ranks did not start within 0.5 s")
    assert "had not begun" in text and "matching call" not in text and "never here" not in text
    assert all(f"rank {r}: {STILL_STARTING}" in text or f"rank {r}: no stack" in text for r in (0, 1)), text
    hang = RunResult("x.py", nproc=2, returncode=124, duration=10.4, timed_out=True, failure=diagnosis.RankFailure(
        0, diagnosis.TIMEOUT, message="x.py did not finish within 10 s of every rank being ready"))
    text = verdict(hang, "x.py")
    assert text.startswith("TIMEOUT: x.py did not finish within 10 s of every rank being ready (stopped after 10.4 s, "
                           "start-up included); ") and "matching call" in text
    # one rank has no peer to wait for (seen on one GPU: a rank stuck in its own code after nccl all_reduces)
    alone = dataclasses.replace(hang, nproc=1)
    assert "matching call" not in verdict(alone, "x.py")
    # two ranks spinning in their own code (their flight recorders: every call completed) wait for no peer
    spinning = {rank: "  -> x.py:6 in <module>:  while True:" for rank in (0, 1)}
    assert "matching call" not in verdict(dataclasses.replace(hang, stacks=spinning), "x.py")
    waiting = {**spinning, 1: "     torch/distributed/distributed_c10d.py:3252 in all_reduce\n"
                              "  -> x.py:5 in <module>:  dist.all_reduce(t)"}
    assert "matching call" in verdict(dataclasses.replace(hang, stacks=waiting), "x.py")


def test_a_rank_still_starting_is_one_line_not_its_import_stack(tmp_path):
    """Without a launch: a rank that has started but is not ready (importing torch) is named in one line and
    is not asked for its stack (kilobytes of imports); a rank that has ended is not asked either."""
    from ddpcourse.launch.stacks import where_ranks_are
    from ddpcourse.launch.stacks import STILL_STARTING, stacks_text
    events = [(0, {"event": "started", "pid": os.getpid()}),
              (1, {"event": "started", "pid": os.getpid()}), (1, {"event": "ready"}), (1, {"event": "finished"})]
    for rank, event in events:
        with open(tmp_path / f"rank{rank}.events", "a") as f:
            f.write(json.dumps({"time": 0.0, "pid": os.getpid(), **event}) + "\n")
    reader = EventReader(tmp_path)
    where, lines = where_ranks_are(tmp_path, reader, tmp_path / "lab.py", wait=0.1)
    assert where == {0: STILL_STARTING} and lines == {}
    assert not list(tmp_path.glob("*.stacks"))  # this process was never signalled for a stack
    assert stacks_text(where, 2).splitlines() == [f"rank 0: {STILL_STARTING}",
                                                  "rank 1: no stack (not running yet, or already gone)"]


def test_the_live_view_shows_the_clock_the_timeout_counts():
    """Before every rank is ready the timeout has not started: the view says so, its bar empty; then it counts
    from that moment. A quiet run (show="none") shows each rank's state, never its lines."""
    from ddpcourse.launch.live_view import LiveRunView
    view = LiveRunView("x.py", 2, timeout=6)
    view.tick(9.7, None, {0})
    assert "starting" in view.header.value and "1 of 2 ranks ready after 9.7 s" in view.header.value
    assert view.bar.value == 0.0
    view.tick(12.0, 2.3, {0, 1})
    assert "2.3 s of a 6 s timeout" in view.header.value and view.bar.value == pytest.approx(2.3)
    view.add(0, "loss 0.25")
    view.tick(12.5, 2.8, {0, 1})
    assert "loss 0.25" in view.body.value
    quiet = LiveRunView("x.py", 2, timeout=6, lines=False)
    quiet.add(0, "loss 0.25")
    quiet.tick(3.0, None, {1})
    assert "loss" not in quiet.body.value
    assert "rank 0</b>: starting" in quiet.body.value and "rank 1</b>: running" in quiet.body.value


def test_a_stop_in_a_notebook_ends_with_the_summary_not_a_traceback(tmp_path):
    """The stop button in a kernel, during a quiet run_lab (show="none"): the cell showed the live view while
    it ran, prints where each rank was, and its error is one line; it still ends as an error, so Run All stops."""
    from jupyter_client.manager import start_new_kernel
    path = script(tmp_path, "waits.py", WAITS)
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        client.execute(f"from ddpcourse import run_lab\nrun_lab({str(path)!r}, nproc=1, show='none', timeout=120)")
        shown, errors, stream = [], [], []
        began = time.monotonic()
        interrupted = False
        while time.monotonic() - began < 90:
            try:
                message = client.get_iopub_msg(timeout=1)
            except Exception:  # queue.Empty: nothing new this second
                message = None
            if message is not None:
                kind, content = message["msg_type"], message["content"]
                if kind == "display_data":
                    shown.append(content["data"].get("text/plain", ""))
                elif kind == "stream":
                    stream.append(content["text"])
                elif kind == "error":
                    errors.append(content["traceback"])
                elif kind == "status" and content["execution_state"] == "idle" and interrupted:
                    break
            # the rank is in its script (it printed "ready" to its log) well before this: stop the cell
            if not interrupted and shown and time.monotonic() - began > 12:
                manager.interrupt_kernel()
                interrupted = True
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    text = "".join(stream)
    assert len(shown) == 1 and shown[0].startswith("[live view of") and "waits.py while it runs" in shown[0]
    assert "[rank 0] ready" not in text  # a quiet run prints none of its lines, stopped or not
    assert "Interrupted: every process of this run" in text, text
    assert f"waits.py:{line_is(path, 'time.sleep(300)')} in <module>:  time.sleep(300)" in text  # where it was
    assert errors == [["Stopped. Where each rank was is printed above."]], errors


def test_the_same_error_on_several_ranks_is_one_error_whatever_rank_torch_wrote_into_it():
    """DDP's unused-parameter error names the raising rank ("... for rank 1: 2 3"): a parameter unused on every
    rank raises it on every rank, which is one cause, not one rank's error and the others' consequences."""
    def raised(rank):
        return _events("started", "ready") + [{"event": "exception", "time": 5.0 + rank, "pid": 2 + rank,
                                               "type": "RuntimeError", "traceback": "tb",
                                               "message": f"Expected to have finished reduction ... for rank {rank}: 2 3"}]
    failure = diagnosis.root_cause({0: raised(0), 1: raised(1)}, 2, {0: 1, 1: 1}, "lab.py")
    assert failure.rank == 0 and failure.message.endswith("(ranks [1] raised the same error)")
    assert "as a consequence" not in failure.details
    other = raised(1)
    other[-1] = {**other[-1], "type": "ValueError"}  # another type is another error, rank number or not
    assert "as a consequence" in diagnosis.root_cause({0: raised(0), 1: other}, 2, {0: 1, 1: 1}, "lab.py").details


def test_sys_exit_is_named_with_the_line_that_called_it():
    exited = _events("started", "ready") + [{"event": "exit", "time": 4.0, "pid": 3, "code": 3, "message": "3",
                                             "lab_line": 12, "lab_code": "sys.exit(3)"}]
    failure = diagnosis.root_cause({0: _events("started", "ready"), 1: exited}, 2, {1: 3, 0: -15}, "lab.py")
    assert (failure.rank, failure.kind) == (1, "exit")
    assert failure.message == "rank 1 called sys.exit(3) at lab.py:12 (sys.exit(3))."


def test_a_rank_aborted_inside_a_collective_is_said_to_be_a_size_or_dtype_mismatch_and_peers_that_finished_lost_nothing():
    finished = _events("started", "ready", "finished", process_group_open=False)
    failure = diagnosis.root_cause({0: _events("started", "ready"), 1: finished}, 2, {0: -6}, "lab.py",
                                   last_lines={0: (20, "dist.all_reduce(preds)")}, died_in={0: "all_reduce"})
    assert failure.message == ("rank 0 was killed by SIGABRT in all_reduce at lab.py:20 (dist.all_reduce(preds)). "
                               "gloo aborts a rank whose all_reduce receives another number of bytes than its own "
                               "call expects: the ranks' calls differ in size or dtype.")


def test_a_timeout_with_every_rank_in_init_process_group_says_the_group_never_formed(tmp_path):
    """A wrong world_size: every rank waits in init_process_group for peers that never come; no collective is
    recorded. Read from the stacks faulthandler wrote (torch's frames by function name)."""
    from ddpcourse.launch.printing import verdict
    from ddpcourse.launch.stacks import ranks_in

    frames = ('Thread 0x1 (most recent call first):\n'
              '  File "/venv/site-packages/torch/distributed/rendezvous.py", line 190 in _create_c10d_store\n'
              '  File "/venv/site-packages/torch/distributed/distributed_c10d.py", line 1710 in init_process_group\n'
              '  File "/course/train.py", line 6 in <module>\n')
    (tmp_path / "rank0.stacks").write_text(frames)
    (tmp_path / "rank1.stacks").write_text(frames.replace("init_process_group", "all_reduce"))
    assert ranks_in(tmp_path, range(2), "init_process_group") == [0]
    events = {rank: _events("started", "ready") for rank in range(2)}
    failure = diagnosis.timed_out(events, 2, "train.py", 8, True, 60, None, in_init=True)
    assert "every rank is still in init_process_group, so the process group never formed. torchrun started 2 " \
           "rank(s)" in failure.message and failure.group_never_formed
    from ddpcourse.launch.launcher import RunResult
    result = RunResult(file="train.py", nproc=2, returncode=124, duration=9.0, timed_out=True, failure=failure)
    assert "usually means another rank never made" not in verdict(result, "train.py")
    ordinary = diagnosis.timed_out(events, 2, "train.py", 8, True, 60, None)
    assert "init_process_group" not in ordinary.message and not ordinary.group_never_formed
