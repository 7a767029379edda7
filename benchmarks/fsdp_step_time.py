"""Step time of lab 07's hand-written FSDP against torch's fully_shard (FSDP2) and DDP, on 2 ranks.

The three train the lab's model (ddpcourse/harness/lab07.py: five units, one frozen, one with a
tied weight) on the same data with SGD and momentum. They take turns, round after round, so that a slow moment
of the machine hits them alike; each prints the median step time, and the hand-written FSDP's ratio to
fully_shard is set against the goal of 1.25x. A measurement, not a test.

What it measures is the CPU: here fully_shard waits for every all-gather and reduce-scatter as it calls it (its
overlap comes from separate CUDA streams, stand-ins on a CPU) and dispatches more ATen operators (copies between
each parameter and its flat buffer, DTensor), while the lab's FSDP starts its collectives with async_op=True
into one flat buffer per unit. Notebook 07, Appendix C, counts both. Neither carries over to GPUs with NCCL.

    python benchmarks/fsdp_step_time.py [--rounds 8] [--steps 10] [--batch 16]
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RANK_ENV = "FSDP_BENCHMARK_RANK"  # set for the ranks: they measure instead of launching
GOAL = 1.25


def measure(rounds, steps, batch_size):
    import importlib.util

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from ddpcourse import init_distributed, report

    spec = importlib.util.spec_from_file_location("lab07", ROOT / "solutions" / "07_sharded_data_parallel.py")
    lab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lab)  # the classes; their harness runs only as __main__
    from ddpcourse.harness import lab07 as harness  # the lab's model
    rank, world_size, _ = init_distributed(backend="gloo")
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(batch_size, harness.IN_FEATURES, generator=generator)
    y = torch.randn(batch_size, harness.OUT_FEATURES, generator=generator)

    def hand_written():
        fsdp = lab.FSDP(harness.build())
        return fsdp, fsdp.finish_gradient_synchronization

    def torch_fsdp2():
        model, mesh = harness.build(), init_device_mesh("cpu", (world_size,))
        for child in model.children():
            if any(True for _ in child.parameters()):
                fully_shard(child, mesh=mesh)
        return fully_shard(model, mesh=mesh), lambda: None

    def ddp():
        return torch.nn.parallel.DistributedDataParallel(harness.build()), lambda: None

    runners = {}
    for name, make in [("hand-written FSDP", hand_written), ("fully_shard", torch_fsdp2), ("DDP", ddp)]:
        model, finish = make()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step(model=model, finish=finish, optimizer=optimizer):
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            finish()
            optimizer.step()

        for _ in range(3):  # warm-up: allocations, fully_shard's lazy initialisation
            step()
        runners[name] = step
    seconds = {}
    for _ in range(rounds):
        for name, step in runners.items():
            dist.barrier()
            start = time.perf_counter()
            for _ in range(steps):
                step()
            dist.barrier()  # the slowest rank's time
            seconds.setdefault(name, []).append((time.perf_counter() - start) / steps)
    report(seconds={k: statistics.median(v) for k, v in seconds.items()}, threads=torch.get_num_threads())
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="turns each variant takes (the median is printed)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per turn (their mean is one sample)")
    parser.add_argument("--batch", type=int, default=16, help="samples per rank and step")
    options = parser.parse_args()
    if os.environ.get(RANK_ENV):
        return measure(options.rounds, options.steps, options.batch)

    from ddpcourse.launch.launcher import run

    args = ["--rounds", str(options.rounds), "--steps", str(options.steps), "--batch", str(options.batch)]
    result = run(__file__, nproc=2, args=args, env={RANK_ENV: "1"}, timeout=600, show="none")
    if not result.ok:
        print(result.message)
        return 1
    seconds = result.values("seconds")[0]
    print(f"2 ranks, gloo, {result.values('threads')[0]} thread(s) per rank, batch {options.batch} per rank; "
          f"median over {options.rounds} turns of {options.steps} steps each")
    print(f"{'variant':<18} {'step':>10} {'vs fully_shard':>15}")
    for name, value in seconds.items():
        print(f"{name:<18} {value * 1e3:7.2f} ms {value / seconds['fully_shard']:14.2f}x")
    ratio = seconds["hand-written FSDP"] / seconds["fully_shard"]
    verdict = "within" if ratio <= GOAL else "NOT within"
    print(f"hand-written FSDP / fully_shard: {ratio:.2f}x: {verdict} the {GOAL:.2f}x goal")
    print("(CPU and gloo: fully_shard's collectives run synchronously here; on GPUs its streams overlap them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
