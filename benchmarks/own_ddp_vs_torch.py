"""Step time of the hand-built data-parallel versions of notebook 06 against torch's DDP, on 2 ranks.

NaiveDDP and OverlappedDDP (notebooks/demos/06_handwritten_ddp.py), BucketedDDP (solutions/06_*.py, the
lab's solution) and torch's DistributedDataParallel train the two models of the notebook (many small
layers; few large ones) on the same data. The variants take turns, round after round, so a slow moment of
the machine hits them alike; each prints the median step time and its ratio to torch's DDP. Goal:
BucketedDDP within 1.10x of torch's DDP on both models. A measurement, not a test:

    python benchmarks/own_ddp_vs_torch.py [--rounds 8] [--steps 10]
"""
import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RANK_ENV = "OWN_DDP_BENCHMARK_RANK"  # set for the ranks: they measure instead of launching


def measure(rounds, steps):
    import importlib.util

    import torch
    import torch.distributed as dist

    from ddpcourse import init_distributed, report

    spec = importlib.util.spec_from_file_location("inside_ddp", ROOT / "notebooks" / "demos" / "06_inside_ddp.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    rank, world_size, device = init_distributed()
    seconds = {}
    for model_name, (build, width) in demo.MODELS.items():
        x, y = demo.data(width, rank, device)
        runners = {}
        for variant in demo.VARIANTS:
            wrapped = demo.wrap(variant, build().to(device), None)
            optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.01)
            for _ in range(3):
                demo.step(wrapped, optimizer, x, y)
            runners[variant] = (wrapped, optimizer)
        for _ in range(rounds):
            for variant, (wrapped, optimizer) in runners.items():
                seconds.setdefault(f"{variant} | {model_name}", []).append(
                    demo.timed(lambda: demo.step(wrapped, optimizer, x, y), steps, device, group=dist.group.WORLD))
    report(seconds={k: statistics.median(v) for k, v in seconds.items()}, threads=torch.get_num_threads(),
           backend=dist.get_backend())
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="turns each variant takes (the median is printed)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per turn (their median is one sample)")
    options = parser.parse_args()
    if os.environ.get(RANK_ENV):
        return measure(options.rounds, options.steps)

    from ddpcourse.launch.launcher import run

    result = run(__file__, nproc=2, args=["--rounds", str(options.rounds), "--steps", str(options.steps)],
                 env={RANK_ENV: "1"}, timeout=600, show="none")
    if not result.ok:
        print(result.message)
        return 1
    seconds = result.values("seconds")[0]
    print(f"2 ranks, {result.values('backend')[0]}, {result.values('threads')[0]} thread(s) per rank; "
          f"median over {options.rounds} turns of {options.steps} steps each")
    print(f"{'variant':<12} {'model':<14} {'step':>9} {'vs torch DDP':>13}")
    for key, value in seconds.items():
        variant, model = key.split(" | ")
        ratio = value / seconds[f"torch | {model}"]
        print(f"{variant:<12} {model:<14} {value * 1e3:7.2f} ms {ratio:12.2f}x")
    ratios = [seconds[f"bucketed | {m}"] / seconds[f"torch | {m}"] for m in ("small layers", "large layers")]
    verdict = "within" if max(ratios) <= 1.10 else "NOT within"
    print(f"BucketedDDP / torch's DDP: {ratios[0]:.2f}x (small layers), {ratios[1]:.2f}x (large layers): "
          f"{verdict} the 1.10x goal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
