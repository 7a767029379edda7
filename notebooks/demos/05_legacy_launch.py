"""Demo for notebook 05: what the deprecated `torch.distributed.launch` hands a worker, and whether it restarts one.

python -m torch.distributed.launch --standalone --nproc-per-node 2 --max-restarts 1 notebooks/demos/05_legacy_launch.py

The worker does not import torch (and so does not call ddpcourse.report): it only says, as one JSON line,
what the launcher gave it and where its agent (the launcher's process) listens, which keeps this launch
cheap. Local rank 1 exits with an error in the first attempt, so the run shows whether the launcher
restarts the workers or ends the job.
"""
import json
import os
import sys
import time

import psutil

attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
local_rank = os.environ.get("LOCAL_RANK", "0")
said = {"local_rank_variable": local_rank, "arguments": sys.argv[1:], "attempt": attempt,
        "max_restarts": os.environ.get("TORCHELASTIC_MAX_RESTARTS"),
        # torch's own stores, as plain torchrun creates them: [address, port] of each socket the agent listens on
        "agent_listening": sorted([c.laddr.ip, c.laddr.port] for c in psutil.Process(os.getppid()).net_connections("tcp")
                                  if c.status == psutil.CONN_LISTEN),
        "master_port": int(os.environ["MASTER_PORT"]),
        "master_addr": os.environ["MASTER_ADDR"],  # the agent's choice, whatever MASTER_ADDR the agent itself had
        "use_agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE")}
sys.stdout.write(json.dumps(said) + "\n")  # one write: the workers share the launcher's stdout
sys.stdout.flush()
if attempt == 0 and local_rank == "1":
    time.sleep(2)  # let local rank 0 say its line before the launcher stops it
    sys.exit(3)  # a worker that dies: the launcher decides what happens next
