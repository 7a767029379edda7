"""What does the course's launcher add over a bare torchrun? Prints a table; not a timed test.

    python benchmarks/launcher_overhead.py [--repeats 7] [--nproc 2]

Both sides run the same trivial script (join the process group, one all_reduce, leave), alternately so
that a slow moment of the machine hits both. The target: the launcher takes at most 1.10x the time of
`python -m torch.distributed.run --standalone --nproc-per-node 2 script.py`. With --nproc 1 the launcher
starts the worker without torchrun's agent, so it should take well under the bare torchrun's time.
"""
import argparse
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
                "--nproc-per-node", str(options.nproc), str(script)]
        ours = [sys.executable, "-m", "ddpcourse", "run", str(script), "--nproc", str(options.nproc)]
        timed(bare), timed(ours)  # warm the file cache for both
        times = {"torchrun": [], "ddpcourse run": []}
        for _ in range(options.repeats):
            times["torchrun"].append(timed(bare))
            times["ddpcourse run"].append(timed(ours))
    base = statistics.median(times["torchrun"])
    print(f"{options.nproc}-rank trivial script, {options.repeats} runs each, {sys.platform}, Python {sys.version.split()[0]}")
    print(f"{'launcher':<16}{'median s':>10}{'min s':>8}{'max s':>8}{'ratio':>8}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<16}{median:>10.2f}{min(values):>8.2f}{max(values):>8.2f}{median / base:>8.2f}")


if __name__ == "__main__":
    main()
