"""Demo for notebook 05: what torchrun gives each worker, three ways to initialize (and what listens where
during each), and the GPU code path.

python -m ddpcourse run notebooks/demos/05_what_torchrun_sets.py --nproc 2 -- --tcp-port 29999 --file /tmp/x
"""
import argparse
import os
import sys
import time
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from ddpcourse import report
from ddpcourse.launch.processes import listening_sockets

TORCHRUN_VARIABLES = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                      "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                      "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"]

parser = argparse.ArgumentParser()
parser.add_argument("--tcp-port", type=int, required=True)  # a free port the notebook picked
parser.add_argument("--file", required=True)                # a path that does not exist yet
options = parser.parse_args()
rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

# 1. The environment: torchrun passes everything through variables, nothing through arguments.
report(env={name: os.environ.get(name) for name in TORCHRUN_VARIABLES}, argv=sys.argv[1:],
       cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))  # torchrun passes it on as it found it

# 2. Three init methods. Each time: join, all_reduce the ranks, leave.
# Rank 1 calls init_process_group only once rank 0 is about to (a marker file says so), so rank 0 is
# inside the call first; wall-clock moments on one machine then show whether its call waited for rank 1.
rank0_calling = Path(f"{options.file}.rank0-calling")
if rank == 0:
    rank0_calling.touch()
else:
    while not rank0_calling.exists():
        time.sleep(0.01)
methods = {
    "env://": {},  # MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the environment (torchrun's default)
    f"tcp://127.0.0.1:{options.tcp_port}": {"rank": rank, "world_size": world_size},
    f"file://{options.file}": {"rank": rank, "world_size": world_size},  # a file on a shared filesystem
}


def listening_now():
    """[address, port, who] of every TCP socket that this node's agent or its workers listen on."""
    agent = psutil.Process(os.getppid())
    names = {agent.pid: "agent", os.getpid(): "rank 0"}
    pids = [agent.pid] + [child.pid for child in agent.children(recursive=True)]
    return [[address, port, names.get(pid, "another rank")] for address, port, pid in listening_sockets(pids)]


sums, first_init, listening = {}, None, {}
for method, extra in methods.items():
    called_at = time.time()
    dist.init_process_group("gloo", init_method=method, **extra)
    if first_init is None:
        first_init = {"called_at": called_at, "returned_at": time.time()}
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    sums[method.split(":")[0]] = total.item()
    if rank == 0:  # every rank has joined and exchanged a message: every socket of this method is open
        listening[method.split(":")[0]] = listening_now()
    dist.barrier()
    dist.destroy_process_group()
report(sums=sums, first_init=first_init)
if rank == 0:
    report(listening=listening, gloo_interface=os.environ.get("GLOO_SOCKET_IFNAME"))

# 3. Which backends this torch build has, and the GPU path (one GPU per local rank).
report(backends={"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(), "mpi": dist.is_mpi_available()})
local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
if torch.cuda.is_available() and torch.cuda.device_count() >= local_world:
    # .cuda() with no argument goes to the CURRENT device, which is cuda:0 until set_device says otherwise
    unset = torch.nn.Linear(4, 1).cuda().weight.device
    torch.cuda.set_device(local_rank)  # before any other CUDA work: this process owns GPU `local_rank`
    dist.init_process_group("nccl")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1).cuda(), device_ids=[local_rank])
    gpu_path = f"ran: rank {rank}: .cuda() went to {unset} before set_device, to {next(model.parameters()).device} after"
    report(cuda_before=str(unset), cuda_after=str(next(model.parameters()).device))
    dist.destroy_process_group()
else:
    gpu_path = f"not run on this machine: needs {local_world} CUDA devices (one per local rank)"
report(gpu_path=gpu_path)
print(f"rank {rank}: env:// tcp:// file:// all summed ranks to {sums['env']:g}; GPU path: {gpu_path.split(':')[0]}")
