"""Demo for notebook 05: what torchrun gives each worker, three ways to initialize (and what listens where
during each), whether init_process_group waits for the other ranks (gloo as by default, and lazy), and the
GPU code path.

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

# 2. Three init methods, and file:// once more with gloo's lazy init. Each time: join, all_reduce the ranks,
# leave.
methods = {
    "env": "env://",  # MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the environment (torchrun's default)
    "tcp": f"tcp://127.0.0.1:{options.tcp_port}",
    "file": f"file://{options.file}",  # a file on a shared filesystem
    "lazy": f"file://{options.file}.lazy",  # the same, with TORCH_GLOO_LAZY_INIT=1 (read when a group is created)
}


def listening_now():
    """[address, port, who] of every TCP socket that this node's agent or its workers listen on."""
    agent = psutil.Process(os.getppid())
    names = {agent.pid: "agent", os.getpid(): "rank 0"}
    pids = [agent.pid] + [child.pid for child in agent.children(recursive=True)]
    return [[address, port, names.get(pid, "another rank")] for address, port, pid in listening_sockets(pids)]


def wait_for(marker, seconds=20):
    """Wait until the file `marker` exists, for at most `seconds`: were rank 0 stuck, the notebook's check of
    the moments recorded below fails, rather than the run hanging."""
    deadline = time.time() + seconds
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.01)


# Does init_process_group wait for the other ranks? Asked of the two file:// groups, whose FileStore waits for
# nobody (a TCPStore that rank 0 hosts, as for env:// and tcp:// here, waits for its clients to connect):
# - "file", gloo as by default: rank 1 calls only once rank 0 is about to (a marker file says so), so rank 0 is
#   inside its call first; wall-clock moments on one machine then show whether its call waited for rank 1;
# - "lazy": rank 1 calls only once rank 0's call has returned, which it can only do if it waits for nobody.
rank0_calling, rank0_returned = Path(f"{options.file}.rank0-calling"), Path(f"{options.file}.rank0-returned")
sums, init_moments, listening = {}, {}, {}
for name, method in methods.items():
    extra = {} if name == "env" else {"rank": rank, "world_size": world_size}
    if name == "lazy":
        os.environ["TORCH_GLOO_LAZY_INIT"] = "1"
    if rank == 1 and name in ("file", "lazy"):
        wait_for(rank0_calling if name == "file" else rank0_returned)
    called_at = time.time()
    if rank == 0 and name == "file":
        rank0_calling.touch()  # after called_at: rank 1's call begins after rank 0's
    dist.init_process_group("gloo", init_method=method, **extra)
    init_moments[name] = {"called_at": called_at, "returned_at": time.time()}
    if name == "lazy":
        del os.environ["TORCH_GLOO_LAZY_INIT"]
        if rank == 0:
            rank0_returned.touch()
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)  # the lazy group connects here, at its first collective
    sums[name] = total.item()
    if rank == 0 and name != "lazy":  # every rank has joined and exchanged a message: every socket is open
        listening[name] = listening_now()
    dist.barrier()
    dist.destroy_process_group()
report(sums=sums, init_moments=init_moments)
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
per_group = ", ".join(f"{name} {total:g}" for name, total in sums.items())
print(f"rank {rank}: all_reduce of the ranks, per group: {per_group}; GPU path: {gpu_path.split(':')[0]}")
