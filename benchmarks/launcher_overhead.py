"""What does the course's launcher add over a bare torchrun? Prints a table; not a timed test.

    python benchmarks/launcher_overhead.py [--repeats 10] [--nproc 2]

Both rows run the same trivial script (join the process group, one all_reduce, leave), in turns so that a
slow moment of the machine hits both. Both start every rank the same way, torchrun's default: a fresh
interpreter. The target: `ddpcourse run` takes at most 1.10x the time of
`python -m torch.distributed.run --standalone --nproc-per-node N script.py`.
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
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--nproc", type=int, default=2)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "trivial.py"
        script.write_text(TRIVIAL)
        rows = {
            "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone",
                         "--nproc-per-node", str(options.nproc), str(script)],
            "ddpcourse run": [sys.executable, "-m", "ddpcourse", "run", str(script), "--nproc", str(options.nproc)],
        }
        # the launcher with torch's flight recorder off: it is on by default (torch's, for torchrun too); the
        # launcher reads it at the end of every rank (ddpcourse/launch/collectives.py)
        rows["  recorder off"] = rows["ddpcourse run"]
        envs = {"  recorder off": dict(os.environ, TORCH_FR_BUFFER_SIZE="0")}
        for name, command in rows.items():  # warm the file cache for each
            timed(command, envs.get(name))
        times = {name: [] for name in rows}
        for _ in range(options.repeats):
            for name, command in rows.items():
                times[name].append(timed(command, envs.get(name)))
    print(f"{options.nproc}-rank trivial script, {options.repeats} runs each, {sys.platform}, "
          f"Python {sys.version.split()[0]}")
    print(f"{'launcher':<16}{'median s':>10}{'min s':>8}{'max s':>8}")
    for name, values in times.items():
        print(f"{name:<16}{statistics.median(values):>10.2f}{min(values):>8.2f}{max(values):>8.2f}")
    ratio = statistics.median(times["ddpcourse run"]) / statistics.median(times["torchrun"])
    print(f"ddpcourse run / torchrun: {ratio:.2f} (target: at most 1.10, the flight recorder's evidence included)")
    recorder = statistics.median(times["ddpcourse run"]) / statistics.median(times["  recorder off"])
    print(f"ddpcourse run, recorder on / off: {recorder:.2f}")


if __name__ == "__main__":
    main()
