"""The verdict names the cause of a hang or a crash in the collectives, from torch's flight recorder
(ddpcourse/launch/collectives.py): the rule on dumps shaped as torch 2.13 writes them, then broken scripts
launched for real: a crash after one rank's extra call (the dumps a rank writes when it raises and when it
finishes), a peer still waiting when a rank fails (the dump the failing rank asks it for) and a parameter no rank
uses. A hang (the dumps the launcher asks for at a timeout) is
tests/test_troubleshooting.py's 3-rank run, whose verdict is checked line by line there."""
import textwrap

from ddpcourse.launch.collectives import analyse, calls_of, silent_mismatch
from ddpcourse.launch.launcher import run

LAB = "/course/train.py"


def entry(seq, op, sizes=((4,),), dtypes=("Float",), line=10, group="0", p2p=False):
    """One flight-recorder entry as _dump_fr_trace() writes it (frames innermost first)."""
    frames = [{"name": op, "filename": "/torch/distributed/distributed_c10d.py", "line": 3245},
              {"name": "<module>", "filename": LAB, "line": line}]
    return {"process_group": (group, "default_pg"), "collective_seq_id": seq, "profiling_name": f"gloo:{op}",
            "input_sizes": [list(s) for s in sizes], "input_dtypes": list(dtypes), "state": "scheduled",
            "frames": frames if line else [], "is_p2p": p2p}


def dump(entries, completed):
    return {"version": "2.10", "pg_status": {"0": {"last_completed_collective": completed}}, "entries": entries}


def test_the_first_call_that_differs_in_op_is_named_with_each_ranks_line():
    ranks = {0: dump([entry(1, "all_reduce"), entry(2, "all_reduce", line=14)], completed=1),
             1: dump([entry(1, "all_reduce"), entry(2, "broadcast", line=17)], completed=1)}
    report = analyse(ranks, LAB, alive={0, 1})
    assert (report.disagreement, report.mismatch) == (2, "op")
    assert {r: (c.op, c.line) for r, c in report.waiting.items()} == {0: ("all_reduce", 14), 1: ("broadcast", 17)}
    assert report.likely_cause == 0 and not report.outside
    first = report.lines("train.py")[0]
    assert first.startswith("The ranks disagree first at collective #2 of the default group (torch's count: the "
                            "collectives of DDP and other libraries count too), different collectives: ")
    assert "rank 0: all_reduce #2 of float32[4] at train.py:14" in first and "rank 1: broadcast #2" in first


def test_sizes_and_dtypes_mismatches_are_named_before_an_earlier_call_from_another_line():
    # ranks may make one collective from two branches of an if (#2): the size mismatch (#3) is the cause
    ranks = {0: dump([entry(1, "all_reduce"), entry(2, "broadcast", line=20), entry(3, "all_reduce", ((4,),))], 2),
             1: dump([entry(1, "all_reduce"), entry(2, "broadcast", line=22), entry(3, "all_reduce", ((6,),))], 2)}
    both = {0, 1}  # both wait in #3: the mismatch is looked for in the group they are stuck in
    assert (analyse(ranks, LAB, both).disagreement, analyse(ranks, LAB, both).mismatch) == (3, "sizes")
    ranks[1]["entries"][2] = entry(3, "all_reduce", dtypes=("Double",))
    report = analyse(ranks, LAB, both)
    assert (report.disagreement, report.mismatch) == (3, "dtypes") and "float64[4]" in report.lines("t.py")[0]


def test_an_extra_call_on_one_rank_shows_as_the_same_op_from_another_line():
    # both ranks hang (alive), their lines recorded: #2 is made from another line on each
    ranks = {0: dump([entry(1, "all_reduce", line=9), entry(2, "all_reduce", line=16), entry(3, "all_reduce", line=9)],
                     completed=2),
             1: dump([entry(1, "all_reduce", line=9), entry(2, "all_reduce", line=9), entry(3, "barrier", (), (),
                                                                                         line=30)], completed=2)}
    report = analyse(ranks, LAB, alive={0, 1})
    assert (report.disagreement, report.mismatch) == (3, "op")  # a strong mismatch first
    ranks[1]["entries"][2] = entry(3, "all_reduce", line=9)
    report = analyse(ranks, LAB, alive={0, 1})
    assert (report.disagreement, report.mismatch) == (2, "line")


def test_a_rank_that_ended_with_fewer_calls_is_named_and_its_missing_lines_are_no_disagreement():
    # rank 1 finished well: its record has no frames; rank 0 made one more call and waits in it
    ranks = {0: dump([entry(1, "all_reduce", line=9), entry(2, "all_reduce", line=16), entry(3, "all_reduce", line=9)],
                     completed=2),
             1: dump([entry(1, "all_reduce", line=None), entry(2, "all_reduce", line=None)], completed=2)}
    report = analyse(ranks, LAB, alive={0})
    assert report.disagreement is None and not report.outside and report.waiting[0].seq == 3
    assert {r: c.seq for r, c in report.ended_after.items()} == {1: 2}
    # the same, rank 0 having raised in its third call: the recorder counts that call completed
    ranks[0]["pg_status"]["0"]["last_completed_collective"] = 3
    report = analyse(ranks, LAB, raised={0: 9})
    assert not report.waiting and report.failed_in[0].seq == 3 and report.ended_after[1].seq == 2
    assert "  rank 0 failed in all_reduce #3 of float32[4] at t.py:9" in report.lines("t.py")
    assert not analyse(ranks, LAB, raised={0: 12}).failed_in  # raised elsewhere: not in that call


def test_a_rank_in_no_collective_while_others_wait_is_the_likely_cause_with_its_line():
    ranks = {0: dump([entry(1, "all_reduce"), entry(2, "all_reduce", line=26)], completed=1),
             1: dump([entry(1, "all_reduce")], completed=1),
             2: dump([entry(1, "all_reduce"), entry(2, "all_reduce", line=26)], completed=1)}
    report = analyse(ranks, LAB, alive={0, 1, 2}, stack_lines={1: (25, "time.sleep(60)")})
    assert report.outside == [1] and report.likely_cause == 1 and report.disagreement is None
    assert report.lines("train.py")[0] == ("Likely cause: rank 1 is in no collective (its stack is at train.py:25: "
                                           "time.sleep(60)) while rank(s) [0, 2] wait in one.")


def test_point_to_point_entries_and_other_groups_are_kept_apart():
    entries = [entry(1, "all_reduce"), entry(1, "send", p2p=True), entry(1, "all_gather", group="1")]
    calls = calls_of(dump(entries, completed=1), LAB)
    assert [(c.group, c.seq, c.op, c.completed) for c in calls] == [("0", 1, "all_reduce", True),
                                                                   ("1", 1, "all_gather", False)]


def _script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_a_crash_after_one_ranks_extra_call_names_the_call_from_the_finished_peers_record(tmp_path):
    path = _script(tmp_path, "extra.py", """\
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        for step in range(3):
            dist.all_reduce(torch.ones(4))
            if dist.get_rank() == 0 and step == 1:
                dist.all_reduce(torch.ones(4))  # a logging all-reduce only rank 0 makes
        dist.destroy_process_group()
        """)
    result = run(path, nproc=2, timeout=30, show="none")
    assert not result.ok and not result.timed_out and result.failure.rank == 0, result.message
    report = result.collectives  # rank 1 finished: its record has the calls, not their lines (too costly)
    assert report.disagreement is None and report.failed_in[0].seq == 4 and report.ended_after[1].seq == 3
    assert result.message.splitlines()[1:4] == [
        "Rank 1 ended after collective #3 while rank(s) [0] went on to more: they made a collective that rank 1 "
        "never made.",
        f"  rank 0's calls in the default group came from {path}:6 (3), {path}:8 (1)",  # the extra one stands out
        f"  rank 0 failed in all_reduce #4 of float32[4] at {path}:6 (dist.all_reduce(torch.ones(4)))"]


def test_a_peer_stopped_by_torchrun_after_a_rank_failed_still_has_its_call_named(tmp_path):
    # rank 0 raises at once in torch.distributed while rank 1 waits in a collective. torchrun stops rank 1 as soon
    # as rank 0 exits: without rank 0 asking for rank 1's record first, the verdict named rank 0's side only
    path = _script(tmp_path, "peer.py", """\
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        if dist.get_rank() == 0:
            dist.broadcast(torch.ones(3), src=5)  # no rank 5: raises at once
        else:
            dist.all_reduce(torch.ones(3))
        """)
    result = run(path, nproc=2, timeout=30, show="none")
    assert not result.ok and not result.timed_out and result.failure.rank == 0, result.message
    stuck = {**result.collectives.waiting, **result.collectives.failed_in}
    assert (stuck[1].op, stuck[1].line) == ("all_reduce", 8), result.message
    assert f"in all_reduce #1 of float32[3] at {path}:8" in result.message  # rank 1's side, said in the verdict


def test_parameters_that_got_no_gradient_are_named_not_only_numbered(tmp_path):
    """DDP's error lists indices (names need TORCH_DISTRIBUTED_DEBUG); the verdict names them from the model."""
    path = _script(tmp_path, "unused.py", """\
        import torch
        import torch.distributed as dist
        import torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.body, self.spare, self.head = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 1)
                self.scale = nn.Parameter(torch.ones(1))  # the model's own parameter: torch names it ".scale"

            def forward(self, x):
                return self.head(self.body(x))  # spare and scale are never used


        dist.init_process_group("gloo")
        ddp = DistributedDataParallel(Net())
        for step in range(2):  # the second step finds the first one's reduction unfinished
            ddp(torch.randn(2, 4)).sum().backward()
        dist.destroy_process_group()
        """)
    result = run(path, nproc=1, timeout=30, show="none")
    unused = [[0, "scale"], [3, "spare.weight"], [4, "spare.bias"]]  # the model's own first, as torch orders them
    assert not result.ok and result.failure.unused_parameters == unused, result.message
    assert result.message.splitlines()[1] == ("Parameters that got no gradient on rank 0: scale, spare.weight, "
                                              "spare.bias (DDP's indices 0 3 4).")


def test_the_group_the_ranks_are_stuck_in_comes_before_an_older_groups_mismatch():
    # group 1's mismatch ended long ago (its timeout raised and was caught); the ranks now wait in group 0
    ranks = {r: dump([entry(1, "all_reduce" if r == 0 else "barrier", group="1", line=38),
                      entry(1, "all_reduce" if r == 0 else "barrier", line=50 + r)], completed=0) for r in (0, 1)}
    for r in (0, 1):
        ranks[r]["pg_status"]["1"] = {"last_completed_collective": 1}
    report = analyse(ranks, LAB, alive={0, 1}, stack_lines={0: (50, ""), 1: (51, "")})
    assert (report.disagreement, report.calls_at[0].group, report.mismatch) == (1, "0", "op")
    assert {r: (c.group, c.line) for r, c in report.waiting.items()} == {0: ("0", 50), 1: ("0", 51)}
    # nothing stuck (group 0's calls done): group 1's old mismatch, a timeout caught long ago, is not named
    for r in (0, 1):
        ranks[r]["pg_status"]["0"] = {"last_completed_collective": 1}
    assert analyse(ranks, LAB, alive={0, 1}).disagreement is None
    del ranks[0]["entries"][1], ranks[1]["entries"][1]  # stuck in group 1 now: its mismatch is named, with its group
    for r in (0, 1):
        ranks[r]["pg_status"]["1"] = {"last_completed_collective": 0}
    lines = analyse(ranks, LAB, alive={0, 1}).lines("t.py")
    assert lines[0].startswith("The ranks disagree first at collective #1 of group 1 ")


def test_an_async_wait_names_the_oldest_open_call_and_finished_ranks_never_wait():
    # rank 0 waits on works[0].wait() (line 30): its three async calls are open, the first is the one it waits on
    ranks = {0: dump([entry(1, "all_reduce", line=21), entry(2, "all_reduce", line=22), entry(3, "all_reduce", line=23)],
                     completed=0),
             1: dump([entry(1, "all_reduce", line=21)], completed=0)}
    report = analyse(ranks, LAB, alive={0}, stack_lines={0: (30, "works[0].wait()")})
    assert report.waiting[0].seq == 1 and 1 not in report.waiting  # rank 1 is not running: its lag is no wait


def test_ranks_waiting_in_different_groups_are_said_unless_a_rank_in_no_collective_explains_it():
    ranks = {0: dump([entry(1, "all_reduce", group="1", line=12)], completed=0),
             1: dump([entry(1, "all_reduce", line=14)], completed=0),
             2: dump([], completed=0)}
    ranks[0]["pg_status"]["1"] = {"last_completed_collective": 0}
    said = ("The ranks wait in different process groups (rank 0 in group 1, rank 1 in the default group): every "
            "rank of a group must make that group's collectives.")
    assert said in analyse(ranks, LAB, alive={0, 1}).lines("t.py")
    assert said not in analyse(ranks, LAB, alive={0, 1, 2}).lines("t.py")  # rank 2, in none, is named instead


def test_completion_is_read_by_the_groups_id_not_its_name():
    done = entry(1, "all_reduce", group="4a2ad14e", line=12)  # a hashed name (use_local_synchronization=True)
    done["pg_id"] = 1  # pg_status is keyed by the group's id in this process
    status = {"0": {"last_completed_collective": 0}, "1": {"last_completed_collective": 1}}
    calls = calls_of({"pg_status": status, "entries": [entry(1, "all_reduce", line=14), done]}, LAB)
    assert [(c.group, c.completed) for c in calls] == [("0", False), ("4a2ad14e", True)]


def test_the_rank_waits_on_its_oldest_open_call_from_the_line_its_stack_is_at():
    # DDP launches each bucket's all-reduce from one backward() line (40) and waits on the oldest first
    buckets = [entry(s, "all_reduce", line=40) for s in (9, 10)]
    ranks = {0: dump([entry(8, "broadcast", line=30), *buckets], completed=8)}
    report = analyse(ranks, LAB, alive={0}, stack_lines={0: (40, "loss.backward()")})
    assert report.waiting[0].seq == 9


def test_calls_from_different_lines_before_a_mismatch_are_said_with_it():
    # rank 0's extra call at #3 (line 16), then an op mismatch at #4: both ranks still running
    ranks = {0: dump([entry(1, "all_reduce", line=9), entry(2, "all_reduce", line=9), entry(3, "all_reduce", line=16),
                      entry(4, "all_reduce", line=9)], completed=3),
             1: dump([entry(1, "all_reduce", line=9), entry(2, "all_reduce", line=9), entry(3, "all_reduce", line=9),
                      entry(4, "barrier", (), (), line=17)], completed=3)}
    report = analyse(ranks, LAB, alive={0, 1})
    assert (report.disagreement, report.mismatch, report.lines_before[0]) == (4, "op", 3)
    assert any(line.startswith("  Before that, at #3, the ranks made it from different lines (rank 0: all_reduce #3 "
                               "of float32[4] at t.py:16") for line in report.lines("t.py"))


def test_a_finished_rank_is_compared_in_the_group_the_other_rank_is_stuck_in():
    # rank 1's last call was in group 1; rank 0 failed in the default group's #4, beyond rank 1's #3 there
    ranks = {0: dump([entry(s, "all_reduce", line=6) for s in (1, 2, 3, 4)], completed=4),
             1: dump([entry(s, "all_reduce", line=None) for s in (1, 2, 3)] + [entry(1, "barrier", (), (), group="1",
                                                                                      line=None)], completed=3)}
    report = analyse(ranks, LAB, raised={0: 6})
    assert report.failed_in[0].seq == 4 and report.ended_after[1].seq == 3 and report.call_sites[0] == {6: 4}


def test_the_odd_one_out_of_three_is_named_and_is_the_likely_cause():
    calls = {r: dump([entry(1, "all_gather", line=8)], completed=0) for r in (0, 1)}
    calls[2] = dump([entry(1, "barrier", (), (), line=17)], completed=0)
    report = analyse(calls, LAB, alive={0, 1, 2})
    assert report.odd_one_out == 2 and report.likely_cause == 2
    assert "  Rank 2 is the odd one out: ranks [0, 1] agree on their call there." in report.lines("t.py")
    two = analyse({r: calls[r] for r in (0, 2)}, LAB, alive={0, 2})  # two ranks: neither is odder
    assert two.odd_one_out is None and two.likely_cause == 0


def test_a_rank_in_no_collective_is_named_when_the_groups_timeout_fires_first(tmp_path):
    # rank 1 starves in its own Python while rank 0 waits; the group's 3 s timeout raises on rank 0 long before
    # the launcher's: rank 0 asks rank 1 for its stack before torchrun stops it
    path = _script(tmp_path, "starved.py", """\
        import datetime, queue
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
        batches = queue.Queue()
        if dist.get_rank() == 1:
            batches.get()  # nothing ever comes
        dist.all_reduce(torch.ones(4))
        """)
    result = run(path, nproc=2, timeout=60, show="none")
    assert not result.ok and not result.timed_out and result.failure.rank == 0, result.message
    assert result.collectives.outside == [1] and 0 in result.collectives.failed_in, result.message
    assert (f"Likely cause: rank 1 is in no collective (its stack is at {path}:8: batches.get()  # nothing ever "
            "comes) while rank(s) [0] waited in one.") in result.message.splitlines()


def test_a_run_whose_calls_differed_in_dtype_is_told_though_no_rank_raised():
    """int32 and float32 all_reduces of 4 numbers move the same bytes: gloo raises nothing (probe p17b)."""
    from ddpcourse.launch.launcher import RunResult
    from ddpcourse.launch.printing import verdict

    ranks = {0: dump([entry(1, "all_reduce", line=0), entry(2, "all_reduce", dtypes=("Int",), line=0)], 2),
             1: dump([entry(1, "all_reduce", line=0), entry(2, "all_reduce", line=0)], 2)}
    found = silent_mismatch(ranks, LAB)
    assert (found.disagreement, found.mismatch) == (2, "dtypes")
    result = RunResult(file=LAB, nproc=2, returncode=0, duration=1.0, silent_mismatch=found)
    assert result.ok and verdict(result, "t.py").splitlines()[1] == (
        "But the ranks' calls differ at collective #2 of the default group (different dtypes: rank 0: all_reduce "
        "#2 of int32[4]; rank 1: all_reduce #2 of float32[4]): gloo moved the bytes without an error, and that "
        "call's result is garbage.")
    # ops whose ranks pass different tensors by design (scatter's list lives on its source only) are not compared
    scatter = {0: dump([entry(1, "scatter", sizes=((4,), (4,)), dtypes=("Float", "Float"), line=0)], 1),
               1: dump([entry(1, "scatter", sizes=(), dtypes=(), line=0)], 1)}
    assert silent_mismatch(scatter, LAB) is None
    ranks[0]["entries"][1] = entry(2, "all_reduce", line=0)  # the same calls: nothing to say
    assert silent_mismatch(ranks, LAB) is None

