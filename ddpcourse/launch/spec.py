"""The run specification: everything a run's processes need to know, written once as JSON into the run folder.

The launcher writes ``run.json``; torchrun's agent and every rank read it. The only thing that crosses the
process boundary besides torchrun's own variables is its path, in $DDPCOURSE_RUN_SPEC. Children inherit
that variable, so it also marks every process of the run (ddpcourse.launch.processes finds them by it).

This module never imports torch: the launcher process reads it too.
"""
import json
import os
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

RUN_SPEC_ENV = "DDPCOURSE_RUN_SPEC"
SPEC_NAME = "run.json"


@dataclass(frozen=True)
class RunSpec:
    file: str                 # the script every rank runs
    args: tuple = ()          # its command-line arguments
    run_dir: str = ""         # the run folder: this file, events, logs, stacks, the agents' failures
    launcher_pid: int = 0     # the process that waits for the run (a kernel, a CLI): gone means left over
    # A check's observer, called in every rank with this spec before the script runs ("module:function"),
    # and its settings (lab 05's check watches its checkpoint folder: ddpcourse.checks.write_observer).
    observer: str = ""
    observer_options: dict = field(default_factory=dict)

    @property
    def path(self):
        return os.path.join(self.run_dir, SPEC_NAME)

    def save(self):
        """Write the spec into its run folder; returns the path to hand to the run's processes."""
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump(asdict(self), f)
        return self.path

    @classmethod
    def load(cls, path):
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(**{**data, "args": tuple(data.get("args", ()))})


@lru_cache(maxsize=None)
def _load(path):
    return RunSpec.load(path)


def current_spec():
    """The spec of the run this process belongs to, or None outside the launcher (``python lab.py``)."""
    path = os.environ.get(RUN_SPEC_ENV)
    return _load(path) if path else None
