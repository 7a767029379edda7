"""torchrun's agent for a course run: ``python -m ddpcourse.launch.agent [--serve-store] TORCHRUN_OPTIONS...``.

It is ``python -m torch.distributed.run``, which starts every rank as a fresh interpreter, with what torch
lacks for a run started from a notebook:
- the run dies with its kernel: if the process that started this agent dies (even by SIGKILL), the agent
  ends the run's processes and itself (ddpcourse.launch.processes.watch_parent);
- the rendezvous store listens on 127.0.0.1 only (ddpcourse.launch.stores): ``--standalone`` becomes a c10d
  rendezvous at a loopback store this agent serves; with several agents, the one given ``--serve-store``
  serves the store at its ``--rdzv-endpoint`` port.
What torch reports is kept as data: ``ChildFailedError.failures`` (each failed rank's exit code, pid, error
file) is saved as JSON in the run folder for the launcher, and torchrun's own logs go there too.
"""
import json
import os
import sys
import uuid

from ddpcourse.launch.events import SERVE_STORE, failures_file
from ddpcourse.launch.processes import watch_parent
from ddpcourse.launch.spec import current_spec
from ddpcourse.launch.stores import serve_store_on_loopback

def _with_loopback_store(argv):
    """The torchrun options, with the rendezvous store this agent must serve already listening on loopback.
    Returns (options, store): the store must stay referenced while torchrun runs."""
    argv = list(argv)
    serve = SERVE_STORE in argv
    if serve:
        argv.remove(SERVE_STORE)
    if "--standalone" in argv:
        store, port = serve_store_on_loopback(0)
        index = argv.index("--standalone")
        argv[index:index + 1] = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                                 "--rdzv-id", uuid.uuid4().hex]
        return argv, store
    if serve and "--rdzv-endpoint" in argv:
        port = int(argv[argv.index("--rdzv-endpoint") + 1].rsplit(":", 1)[1])
        return argv, serve_store_on_loopback(port)[0]
    return argv, None


def _save_failures(run_dir, exc):
    failures = {rank: {"exitcode": f.exitcode, "local_rank": f.local_rank, "pid": f.pid, "message": f.message}
                for rank, f in exc.failures.items()}
    path = failures_file(run_dir, os.getpid())
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(failures, f)
    os.replace(path + ".tmp", path)
    return failures


def main():
    watch_parent()
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    argv, store = _with_loopback_store(sys.argv[1:])  # noqa: F841 - store: kept alive until torchrun ends
    run_dir = current_spec().run_dir
    # torchrun's per-attempt folders go into the run folder, which the launcher deletes (by default each run
    # would leave a torchelastic_* folder in the system's temporary folder for good)
    argv = ["--log-dir", os.path.join(run_dir, "torchrun"), *argv]
    try:
        run(parse_args(argv))
    except ChildFailedError as exc:
        failures = _save_failures(run_dir, exc)
        codes = ", ".join(f"rank {rank}: exit code {row['exitcode']}" for rank, row in sorted(failures.items()))
        sys.exit(f"torchrun: the workers failed ({codes})")


if __name__ == "__main__":
    main()
