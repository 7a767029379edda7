"""The launcher against deliberately broken scripts: each must end within timeout + 15 s with a clear
message and leave no process behind. Scripts that do not need torch avoid importing it: a launch costs
mostly the interpreters importing torch."""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from ddpcourse.launcher import _agent_exit_codes, _root_cause, find_processes, processes_of_run, run

SLACK = 15.0  # the bound: every failure ends within timeout + 15 s


def script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def launch(path, nproc=2, timeout=30.0, **kwargs):
    start = time.monotonic()
    result = run(path, nproc=nproc, timeout=timeout, **kwargs)
    assert time.monotonic() - start < timeout + SLACK
    assert processes_of_run(result.run_id) == [] if result.run_id else True
    return result


def test_reports_output_per_rank_and_environment(tmp_path, capsys):
    path = script(tmp_path, "env_report.py", """
        import os
        from ddpcourse import report
        rank = int(os.environ["RANK"])
        print(f"hello from {rank}")
        print("second line", flush=True)
        report(rank=rank, omp=os.environ["OMP_NUM_THREADS"], addr=os.environ["MASTER_ADDR"],
               world=int(os.environ["WORLD_SIZE"]), nested={"square": [rank * rank]})
        """)
    result = launch(path, nproc=2, show="rank0")
    printed = capsys.readouterr().out
    assert result.ok, result.message
    assert result.output == {0: ["hello from 0", "second line"], 1: ["hello from 1", "second line"]}
    assert result.values("rank") == [0, 1]
    assert result.values("nested") == [{"square": [0]}, {"square": [1]}]
    assert result.values("world") == [2, 2]
    assert result.values("addr") == ["127.0.0.1"] * 2
    assert result.values("omp") == [str(max(1, os.cpu_count() // 2))] * 2
    # rank-0-only mode shows rank 0's lines live, but the result keeps every rank's
    assert "[rank 0] hello from 0" in printed and "[rank 1]" not in printed
    assert printed.rstrip().splitlines()[-1].startswith("OK: ")


def test_syntax_error_is_reported_without_launching(tmp_path):
    path = script(tmp_path, "broken_syntax.py", "x = 1\nif x == 1\n    print(x)\n")
    result = launch(path, timeout=10)
    assert not result.ok and result.run_id == ""  # nothing was started
    assert "syntax error" in result.message and "line 2" in result.message
    assert "SyntaxError" in result.message and "if x == 1" in result.message


def test_exception_on_one_rank_names_that_rank(tmp_path):
    path = script(tmp_path, "one_rank_fails.py", """
        import os, time
        if os.environ["RANK"] == "1":
            raise ValueError("bad shard on rank 1")
        time.sleep(60)  # rank 0 would wait forever; torchrun stops it once rank 1 fails
        """)
    result = launch(path, timeout=40)
    assert result.failure.rank == 1
    assert result.message.startswith("FAILED: rank 1 raised ValueError: bad shard on rank 1")
    assert 'one_rank_fails.py", line 4' in result.message
    assert "ChildFailedError" not in result.message  # torchrun's wall of text stays hidden


def test_unfinished_todo_reads_as_such(tmp_path):
    path = script(tmp_path, "07_todo_lab.py", """
        def step():
            # TODO 2: all_reduce the gradients
            raise NotImplementedError("TODO 2: all_reduce the gradients")
        step()
        """)
    result = launch(path, timeout=30)
    assert "TODO 2 in" in result.message and "07_todo_lab.py is not done yet" in result.message
    assert "all_reduce the gradients" in result.message


def test_hang_shows_every_rank_stack_then_kills(tmp_path):
    """Mismatched collectives (ranks 0 and 1) and a busy loop (rank 2), stopped by the timeout."""
    path = script(tmp_path, "stuck.py", """
        import torch, torch.distributed as dist
        def spin():
            while True:
                pass
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        if rank == 0:
            dist.all_reduce(torch.ones(1))
        elif rank == 1:
            dist.barrier()
        else:
            spin()
        """)
    result = launch(path, nproc=3, timeout=15)  # generous: on a busy laptop importing torch can take 10 s
    assert result.timed_out and result.returncode == 124
    assert result.message.startswith("TIMEOUT:")
    assert "stuck.py:9 in <module>:  dist.all_reduce(torch.ones(1))" in result.stacks[0]
    assert "stuck.py:11 in <module>:  dist.barrier()" in result.stacks[1]
    # a pure-Python loop holding the GIL still dumps its stack (faulthandler works from the signal handler)
    assert re.search(r"stuck\.py:[45] in spin", result.stacks[2]), result.stacks[2]
    assert "stuck.py:13 in <module>:  spin()" in result.stacks[2]


def test_rank_that_exits_silently_is_the_root_cause(tmp_path):
    path = script(tmp_path, "silent_exit.py", """
        import os, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            os._exit(3)  # no exception, no traceback
        dist.all_reduce(torch.ones(1))
        """)
    result = launch(path, timeout=40)
    assert result.failure.rank == 1
    assert "rank 1 exited with code 3 without a Python exception" in result.message


def test_rank_that_returns_early_breaks_its_peers_collective(tmp_path):
    path = script(tmp_path, "early_return.py", """
        import sys, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            sys.exit(0)  # "done" while rank 0 still waits for it
        dist.all_reduce(torch.ones(1))
        """)
    result = launch(path, timeout=40)
    assert not result.ok
    assert ("rank 0 failed in a collective because rank(s) [1] had already ended" in result.message
            or "rank 1" in result.message.splitlines()[0]), result.message


def test_grandchildren_are_killed(tmp_path):
    path = script(tmp_path, "spawner.py", """
        import subprocess, sys
        from ddpcourse import report
        sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
        child = subprocess.Popen(sleeper)                           # stays in the process group
        escaped = subprocess.Popen(sleeper, start_new_session=True)  # leaves it (setsid)
        report(pids=[child.pid, escaped.pid])
        """)
    result = launch(path, nproc=1, timeout=30)
    assert result.ok, result.message
    for pid in result.values("pids")[0]:
        assert pid not in find_processes(f"DDPCOURSE_RUN_ID={result.run_id}")
        assert not _alive(pid)


def test_interrupt_kills_the_tree(tmp_path):
    path = script(tmp_path, "waits.py", """
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        print("ready", flush=True)
        time.sleep(300)
        """)
    marker = f"DDPCOURSE_TEST_MARKER={uuid.uuid4().hex}"
    env = dict(os.environ, DDPCOURSE_TEST_MARKER=marker.split("=", 1)[1])
    cli = subprocess.Popen([sys.executable, "-m", "ddpcourse", "run", str(path), "--nproc", "2", "--timeout", "120"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    for line in cli.stdout:  # wait until both ranks are really running
        lines.append(line)
        if sum("ready" in seen for seen in lines) == 2:
            break
    assert len(find_processes(marker)) >= 6  # the CLI, torchrun, 2 ranks, 2 grandchildren
    start = time.monotonic()
    cli.send_signal(signal.SIGINT)  # what the Jupyter stop button does to the kernel
    rest, _ = cli.communicate(timeout=SLACK)
    assert time.monotonic() - start < SLACK
    assert cli.returncode == 130
    assert "Interrupted: every process of this run" in rest
    assert "waits.py:5 in <module>:  time.sleep(300)" in rest  # where each rank was when stopped
    assert find_processes(marker) == []


def test_two_runs_at_once_do_not_collide(tmp_path):
    path = script(tmp_path, "allreduce.py", """
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == 2.0
        dist.destroy_process_group()
        """)
    command = [sys.executable, "-m", "ddpcourse", "run", str(path), "--nproc", "2", "--timeout", "60"]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [r.communicate(timeout=60 + SLACK)[0] for r in runs]
    assert [r.returncode for r in runs] == [0, 0], outputs


@pytest.mark.parametrize("table, expected", [
    ("Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : 3 (pid: 12)\n",
     [(1, 3)]),
    ("Failures:\n[1]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 11)\n"
     "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 12)\n",
     [(1, -9), (0, -15)]),
])
def test_torchrun_failure_table_is_parsed_root_cause_first(table, expected):
    assert _agent_exit_codes(table) == expected


def test_crash_after_the_script_finished_is_explained():
    finished = [{"event": "started", "time": 0.0, "pid": 1}, {"event": "finished", "time": 1.0, "pid": 1}]
    table = "Root Cause (first observed failure):\n[0]:\n  rank      : 2 (local_rank: 2)\n  exitcode  : -6 (pid: 9)\n"
    failure = _root_cause({rank: finished for rank in range(3)}, 3, table, "lab.py")
    assert failure.rank == 2
    assert "ran its script to the end, then was killed by SIGABRT" in failure.summary
    assert "dist.destroy_process_group()" in failure.summary


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_two_nodes_on_this_machine_give_global_and_local_ranks(tmp_path):
    path = script(tmp_path, "nodes.py", """
        import os, torch.distributed as dist
        from ddpcourse import report
        dist.init_process_group("gloo")
        report(rank=dist.get_rank(), node=int(os.environ["GROUP_RANK"]), local=int(os.environ["LOCAL_RANK"]))
        dist.destroy_process_group()
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
        if attempt == 0 and dist.get_rank() == 2:
            os._exit(7)  # the first attempt loses rank 2
        dist.all_reduce(torch.ones(1))  # the restarted ranks must reconnect, not reuse old addresses
        report(attempt=attempt)
        dist.destroy_process_group()
        """)
    result = launch(path, nproc=3, timeout=60, torchrun_args=["--max-restarts", "1"])
    assert result.ok, result.message
    assert result.values("attempt") == [1, 1, 1]  # every rank restarted; reports are the last attempt's
    assert "--- torchrun restarted this rank (restart 1) ---" in result.output[2]
