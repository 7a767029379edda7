"""What does the course's launcher add over a bare torchrun? Prints a table; not a timed test.

    python benchmarks/launcher_overhead.py [--repeats 7] [--nproc 2]

Every row runs the same trivial script (join the process group, one all_reduce, leave), in turns so that
a slow moment of the machine hits all of them. The target: the launcher takes at most 1.10x the time of
`python -m torch.distributed.run --standalone --nproc-per-node 2 script.py`. On Linux the launcher has
torchrun fork the ranks from its agent (ddpcourse.launcher.forks_ranks), so it is compared with a bare
torchrun started both ways: by default (a fresh interpreter per rank) and with the same options
(`--run-path --start-method fork`); the launcher with fresh ranks ($DDPCOURSE_FORK_RANKS=0, as on macOS) is
compared with the default. With --nproc 1 the launcher starts the worker without torchrun's agent.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRIVIAL = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
dist.destroy_process_group()
"""


def timed(command, env=None):
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--nproc", type=int, default=2)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "trivial.py"
        script.write_text(TRIVIAL)
        bare = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(options.nproc)]
        ours = [sys.executable, "-m", "ddpcourse", "run", str(script), "--nproc", str(options.nproc)]
        fresh = dict(os.environ, DDPCOURSE_FORK_RANKS="0")
        rows = {  # name: (command, environment, the row it is compared with)
            "torchrun": (bare + [str(script)], None, "torchrun"),
            "torchrun, forked": (bare + ["--run-path", "--start-method", "fork", str(script)], None,
                                 "torchrun, forked"),
            "ddpcourse run": (ours, None, "torchrun, forked" if sys.platform.startswith("linux") else "torchrun"),
            "ddpcourse, fresh": (ours, fresh, "torchrun"),
        }
        for command, env, _ in rows.values():  # warm the file cache for all
            timed(command, env)
        times = {name: [] for name in rows}
        for _ in range(options.repeats):
            for name, (command, env, _) in rows.items():
                times[name].append(timed(command, env))
    print(f"{options.nproc}-rank trivial script, {options.repeats} runs each, {sys.platform}, Python {sys.version.split()[0]}")
    print(f"{'launcher':<18}{'median s':>10}{'min s':>8}{'max s':>8}  ratio to the median of")
    for name, values in times.items():
        median, base = statistics.median(values), rows[name][2]
        ratio = "" if base == name else f"{median / statistics.median(times[base]):.2f}  {base}"
        print(f"{name:<18}{median:>10.2f}{min(values):>8.2f}{max(values):>8.2f}  {ratio}")
    print(f"ddpcourse run / torchrun: {statistics.median(times['ddpcourse run']) / statistics.median(times['torchrun']):.2f}")

if __name__ == "__main__":
    main()
