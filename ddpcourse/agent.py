"""torchrun's agent for a course run: ``python -m ddpcourse.agent TORCHRUN_OPTIONS... WORKER FILE``.

It is ``python -m torch.distributed.run`` with three additions:
- the failures torchrun collects (``ChildFailedError.failures``: each failed rank's exit code, pid,
  local rank) are saved as JSON in the run folder, so the launcher reads exit codes as data; for ranks
  torchrun forked (``--start-method fork``) that report names only the first rank that failed, so the
  others' exit codes are read from torch's ProcessContext (see _remember_forked_ranks);
- a watchdog: if the process that started this agent dies (a kernel or a CLI killed, even with SIGKILL),
  the agent ends the run's processes and itself (ddpcourse.processes.watch_parent);
- the rendezvous store listens on 127.0.0.1 only (ddpcourse.stores): ``--standalone`` becomes a c10d
  rendezvous at a loopback store this agent serves; with several agents the one started with
  $DDPCOURSE_HOST_STORE=1 serves the store at its ``--rdzv-endpoint`` port.
"""
import json
import os
import sys
import uuid

from ddpcourse.events import RUN_DIR_ENV
from ddpcourse.processes import watch_parent
from ddpcourse.stores import serve_store_on_loopback

HOST_STORE_ENV = "DDPCOURSE_HOST_STORE"


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


def _with_loopback_store(argv):
    """The torchrun options, with the rendezvous store this agent must serve already listening on loopback.
    Returns (options, store): the store must stay referenced while torchrun runs."""
    argv = list(argv)
    if "--standalone" in argv:
        store, port = serve_store_on_loopback(0)
        index = argv.index("--standalone")
        argv[index:index + 1] = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                                 "--rdzv-id", uuid.uuid4().hex]
        return argv, store
    if os.environ.get(HOST_STORE_ENV) == "1" and "--rdzv-endpoint" in argv:
        port = int(argv[argv.index("--rdzv-endpoint") + 1].rsplit(":", 1)[1])
        return argv, serve_store_on_loopback(port)[0]
    return argv, None


def _remember_forked_ranks():
    """[ProcessContext] of every attempt whose ranks torchrun forks (--start-method fork): its failure report
    names only the first rank that failed, and the others' exit codes are read from these."""
    import torch.multiprocessing

    contexts, start = [], torch.multiprocessing.start_processes

    def start_and_remember(*args, **kwargs):
        contexts.append(start(*args, **kwargs))
        return contexts[-1]

    torch.multiprocessing.start_processes = start_and_remember
    return contexts


def _failures(exc, contexts):
    """{rank: {exitcode, local_rank, pid}} of every rank of the last attempt that ended with a non-zero code."""
    failures = {rank: {"exitcode": f.exitcode, "local_rank": f.local_rank, "pid": f.pid}
                for rank, f in exc.failures.items()}
    if contexts and failures:
        first = next(iter(failures))
        node_offset = first - failures[first]["local_rank"]  # this node's first global rank
        for local_rank, process in enumerate(contexts[-1].processes):
            if process.exitcode:
                failures.setdefault(node_offset + local_rank, {
                    "exitcode": process.exitcode, "local_rank": local_rank, "pid": process.pid})
    return failures


def main():
    watch_parent()
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    argv, store = _with_loopback_store(sys.argv[1:])  # noqa: F841 - store: kept alive until torchrun ends
    # torchrun's own files (per-attempt folders) go into the run folder, which the launcher deletes: by
    # default each run would leave a torchelastic_* folder in the system's temporary folder for good
    argv = ["--log-dir", os.path.join(os.environ[RUN_DIR_ENV], "torchrun"), *argv]
    contexts = _remember_forked_ranks()
    try:
        run(parse_args(argv))
    except ChildFailedError as exc:
        failures = _failures(exc, contexts)
        path = failures_file(os.environ[RUN_DIR_ENV], os.getpid())
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(failures, f)
        os.replace(path + ".tmp", path)
        codes = ", ".join(f"rank {rank}: exit code {row['exitcode']}" for rank, row in sorted(failures.items()))
        print(f"torchrun: the workers failed ({codes})", file=sys.stderr, flush=True)
        _end(1)
    _end(0)


def _end(code):
    """End the agent once torchrun has returned and its result is saved, without the interpreter's
    finalization: with torch loaded that takes about 0.4 s here (every launch waits for it), and the agent has
    nothing left to finalize (its ranks have ended, its files are written; only the store's thread remains)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
