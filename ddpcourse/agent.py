"""torchrun's agent for a course run: ``python -m ddpcourse.agent TORCHRUN_OPTIONS... -m ddpcourse._worker FILE``.

It is ``python -m torch.distributed.run`` with two additions:
- the failures torchrun collects (``ChildFailedError.failures``: each failed rank's exit code, pid,
  local rank) are saved as JSON in the run folder, so the launcher reads exit codes as data;
- a watchdog: if the process that started this agent dies (a kernel or a CLI killed, even with SIGKILL),
  the agent ends the run's processes and itself (ddpcourse.processes.watch_parent).
"""
import json
import os
import sys

from ddpcourse.events import RUN_DIR_ENV
from ddpcourse.processes import watch_parent


def failures_file(run_dir, pid):
    return os.path.join(run_dir, f"agent-{pid}.failures.json")


def read_failures(run_dir):
    """{rank: {exitcode, local_rank, pid}} of every failed rank, from every agent of the run."""
    found = {}
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("agent-") and name.endswith(".failures.json"):
            with open(os.path.join(run_dir, name), encoding="utf-8") as f:
                found.update({int(rank): row for rank, row in json.load(f).items()})
    return found


def main():
    watch_parent()
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(sys.argv[1:]))
    except ChildFailedError as exc:
        failures = {rank: {"exitcode": f.exitcode, "local_rank": f.local_rank, "pid": f.pid}
                    for rank, f in exc.failures.items()}
        path = failures_file(os.environ[RUN_DIR_ENV], os.getpid())
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(failures, f)
        os.replace(path + ".tmp", path)
        codes = ", ".join(f"rank {rank}: exit code {row['exitcode']}" for rank, row in sorted(failures.items()))
        print(f"torchrun: the workers failed ({codes})", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
