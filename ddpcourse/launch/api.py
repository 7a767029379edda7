"""The launcher's contract types: what a run returns (RunResult) and how a stopped run ends (RunInterrupted).

As torch.distributed.elastic keeps each sub-package's types in an ``api.py``: the checks, the learner's
functions and the tests read these, and never the launcher's internals.
"""
from dataclasses import dataclass, field
from pathlib import Path

from ddpcourse.launch.collectives import HangReport
from ddpcourse.launch.diagnosis import RankFailure


class RunInterrupted(KeyboardInterrupt):
    """The stop button (or Ctrl+C) during a run, after its summary is printed. Still a KeyboardInterrupt, so
    Run All stops at this cell and a terminal exits with 130; in a notebook it renders as one line instead of
    a traceback through the launcher, which would push the summary of where each rank was off screen."""

    def _render_traceback_(self):  # IPython's hook for an exception's own rendering
        return [f"Stopped. {self.args[0] if self.args else ''}".rstrip()]


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
    collectives: HangReport = None  # what the ranks' flight recorders say, when a run hung or crashed in them
    silent_mismatch: HangReport = None  # a run that finished: a call whose sizes or dtypes differed across ranks
    writes: dict = field(default_factory=dict)   # rank -> files its observer saw it write (checks/write_observer.py)
    message: str = ""
    aborted_at_exit: list = field(default_factory=list)  # ranks torch aborted after a complete run (diagnosis)
    run_id: str = ""            # its RunSpec's path: every process of the run carries it (processes_of_run)
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
