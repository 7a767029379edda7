"""What a run prints: every rank's lines as they come, and the one-paragraph verdict at the end.

Terminal: tagged lines ``[rank r] text`` printed live. Jupyter: a live view (ddpcourse.launch.live_view), then the
lines grouped by rank, so a cell's permanent output is the same on every run.
"""
import sys

from ddpcourse.launch.collectives import group_name
from ddpcourse.launch.diagnosis import FailureKind
from ddpcourse.launch.stacks import C10D, stacks_text


class RunPrinter:
    def __init__(self, show, world_size, label, timeout, live_view=None):
        self.show = show
        self.view = None
        if (show != "none" if live_view is None else live_view) and in_jupyter():
            from ddpcourse.launch.live_view import LiveRunView
            self.view = LiveRunView(label, world_size, timeout, lines=show != "none")

    def line(self, rank, text):
        if self.show == "none" or (self.show == "rank0" and rank != 0):
            return
        if self.view is not None:
            self.view.add(rank, text)
        else:
            print(f"[rank {rank}] {text}", flush=True)

    def tick(self, since_launch, since_ready, ready):
        """since_ready: seconds since every rank was ready (the timeout's clock), None before; ready: those ranks."""
        if self.view is not None:
            self.view.tick(since_launch, since_ready, ready)

    def finish(self, output):
        if self.view is None:
            return
        self.view.close()
        if self.show == "none":  # a quiet run's view showed only each rank's state: its lines stay unprinted
            return
        for rank in sorted(output):
            if self.show == "rank0" and rank != 0:
                continue
            for text in output[rank]:
                print(f"[rank {rank}] {text}")


def in_jupyter():
    if "IPython" not in sys.modules:  # a kernel has imported it long before; a terminal need not (0.4 s)
        return False
    from IPython import get_ipython

    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def verdict(result, shown):
    """The run's verdict: OK, TIMEOUT with every rank's stack, or FAILED with the root cause."""
    took = f" in {result.duration:.1f} s" if result.duration else ""
    if result.ok:
        nodes = f" ({result.nnodes} nodes of {result.nproc})" if result.nnodes > 1 else ""
        text = f"OK: {shown} finished on {result.world_size} rank{'s' if result.world_size > 1 else ''}{nodes}{took}."
        if result.silent_mismatch:  # finished, and wrong: gloo moved the bytes it was given
            text += "\n" + _mismatch_line(result.silent_mismatch, shown, lead="But the")
        if result.aborted_at_exit:
            text += (f"\n(after the script ended, torch aborted rank(s) {result.aborted_at_exit} while exiting: its "
                     "exit race, docs/troubleshooting.md; the run's results are complete)")
        return text
    if result.timed_out:
        why = result.failure.message if result.failure else ""
        if result.failure and result.failure.kind == FailureKind.STARTUP_TIMEOUT:  # no hang: say which limit ran out
            return "\n".join([f"TIMEOUT: {why} (stopped after {result.duration:.1f} s); all its processes were killed. "
                              "Where each rank was (most recent call first):",
                              stacks_text(result.stacks, result.world_size),
                              "The ranks were still starting (torchrun's rendezvous, or imports on a busy "
                              "machine): the script itself had not begun."])
        # the timeout counts from every rank being ready; the time since the launch, start-up included, is longer
        stopped = f" (stopped after {result.duration:.1f} s, start-up included)" if result.duration else ""
        return "\n".join([f"TIMEOUT: {why or shown + ' did not finish'}{stopped}; all its processes were killed.",
                          *_collectives_lines(result, shown),
                          "Where each rank was (most recent call first):",
                          stacks_text(result.stacks, result.world_size),
                          *(["A rank waiting in a collective usually means another rank never made the matching "
                             "call."] if _may_wait_for_a_peer(result) else [])])
    failure = result.failure
    if failure is None:
        tail = "\n".join(result.agent_output.strip().splitlines()[-15:])
        return f"FAILED: {shown} (exit code {result.returncode}); torchrun said:\n{tail}"
    mismatch = [_mismatch_line(result.silent_mismatch, shown)] if result.silent_mismatch else []
    text = "\n".join([f"FAILED: {failure.message}", *_unused_lines(failure), *_collectives_lines(result, shown),
                      *mismatch])
    if failure.details:
        text += "\n" + failure.details.rstrip()
    return text


def _may_wait_for_a_peer(result):
    """Whether a timeout can be a rank waiting in a collective for a peer: not with one rank (seen on one GPU:
    a rank stuck in its own code), nor a group that never formed, nor when no rank's stack is in a collective
    (ranks spinning in their own code)."""
    if result.world_size == 1 or (result.failure and result.failure.group_never_formed):
        return False
    if result.collectives is not None and result.collectives.waiting:
        return True
    if result.stacks:  # the flight recorders named no waiting rank: do the stacks show one in a collective?
        return any(C10D in text for text in result.stacks.values())
    return result.collectives is None  # neither stacks nor a record: it may be


def _collectives_lines(result, shown):
    """What the ranks' flight recorders say (ddpcourse.launch.collectives), ahead of the stacks or traceback."""
    return result.collectives.lines(shown) if result.collectives else []


def _mismatch_line(found, shown, lead="The"):
    """A call of the same op whose sizes or dtypes differed across ranks, in a run no collective stopped
    (ddpcourse.launch.collectives.silent_mismatch); ``lead`` opens the sentence ("But the" after an OK)."""
    calls = "; ".join(f"rank {r}: {c.describe(shown)}" for r, c in sorted(found.calls_at.items()))
    group = group_name(next(iter(found.calls_at.values())).group)
    return (f"{lead} ranks' calls differ at collective #{found.disagreement} of {group} (different {found.mismatch}: "
            f"{calls}): gloo moved the bytes without an error, and that call's result is garbage.")


def _unused_lines(failure):
    """The parameters DDP says got no gradient, by name (ddpcourse.launch.rank reads them from the model)."""
    if not failure.unused_parameters:
        return []
    names = ", ".join(name for _, name in failure.unused_parameters)
    indices = " ".join(str(index) for index, _ in failure.unused_parameters)
    return [f"Parameters that got no gradient on rank {failure.rank}: {names} (DDP's indices {indices})."]
