"""Demo for notebook 03, section 4: checkpoints of a DDP model.

Rank 0 saves model.module.state_dict() atomically, every rank waits at a barrier and loads it with
map_location and weights_only=True. Rank 0 then shows three pitfalls on its own (no collectives): the
"module." prefix, a crash in the middle of a save, and a checkpoint that runs code when it is unpickled.

python -m ddpcourse run notebooks/demos/03_checkpoint.py --nproc 2 -- /tmp/some_folder
"""
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse import init_distributed, report
from ddpcourse.lab import compare_replicas
from ddpcourse.toy import build_model, make_dataset

# -----------------------------------------------------------------------------
FOLDER = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ddpcourse_03_checkpoints")
STEPS = 5
# -----------------------------------------------------------------------------

rank, world_size, device = init_distributed()
x, y = make_dataset().tensors
x_local, y_local = x[rank::world_size].to(device), y[rank::world_size].to(device)


class CrashAfter:
    """A file that dies after `limit` bytes: what a killed job or a full disk does to a save in progress."""

    def __init__(self, file, limit):
        self.file, self.limit, self.written = file, limit, 0

    def write(self, data):
        if self.written + len(data) > self.limit:
            self.file.write(bytes(data)[: self.limit - self.written])
            raise OSError("simulated crash in the middle of torch.save")
        self.written += len(data)
        return self.file.write(data)

    def flush(self):
        self.file.flush()


def save_atomically(state, path, crash_after=None):
    """torch.save to a temporary file in the same folder, then rename it over `path` (atomic on POSIX)."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as file:
        # CrashAfter simulates a crash in the middle of the write (Appendix E)
        torch.save(state, CrashAfter(file, crash_after) if crash_after else file)
        file.flush()
        os.fsync(file.fileno())  # the bytes are on disk before the name points at them
    os.replace(temporary, path)  # readers see the old file or the new one, never half of one


def save_directly(state, path, crash_after=None):
    with open(path, "wb") as file:
        torch.save(state, CrashAfter(file, crash_after) if crash_after else file)


def loads(path):
    """'ok' when torch.load reads the file, else the exception's type."""
    try:
        torch.load(path, weights_only=True)
        return "ok"
    except Exception as error:  # noqa: BLE001 (we report which error a reader would meet)
        return type(error).__name__


# 1. Train, save on rank 0 only, barrier, load everywhere ------------------------------------------------
model = DDP(build_model(0).to(device))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for _ in range(STEPS):
    optimizer.zero_grad()
    F.mse_loss(model(x_local), y_local).backward()
    optimizer.step()

checkpoint = FOLDER / "model.pt"
if rank == 0:
    FOLDER.mkdir(parents=True, exist_ok=True)
    save_atomically(model.module.state_dict(), checkpoint)  # .module: keys without the "module." prefix
dist.barrier()  # no rank reads the file before rank 0 has finished writing it

seen_locations = []  # map_location as a function shows where each tensor was saved from


def to_my_device(storage, location):
    seen_locations.append(location)
    return storage.to(device=device)


restored = build_model(seed=123).to(device)  # different starting weights: the load must overwrite them all
restored.load_state_dict(torch.load(checkpoint, map_location=to_my_device, weights_only=True))
same_as_trained = all(torch.equal(a, b) for a, b in zip(restored.state_dict().values(),
                                                           model.module.state_dict().values()))
loaded = {"same_as_trained": same_as_trained, "replicas": str(compare_replicas(restored)),
          "identical": compare_replicas(restored).identical, "saved_from": sorted(set(seen_locations))}
print(f"loaded {checkpoint.name}: same as the trained model: {same_as_trained}; saved from {loaded['saved_from']}")
report(loaded=loaded)
dist.barrier()

# 2-4. Pitfalls, on rank 0 only -------------------------------------------------------------------------
if rank == 0:
    # 2. The "module." prefix: the wrapper's state_dict names every tensor module.<name>.
    wrapped_keys = list(model.state_dict())
    try:
        build_model(0).load_state_dict(model.state_dict())
        prefix_error = None
    except RuntimeError as error:
        prefix_error = str(error).splitlines()[1].strip()  # the "Missing key(s)" line
    fixed = model.state_dict()
    consume_prefix_in_state_dict_if_present(fixed, "module.")  # torch's helper strips it in place
    build_model(0).load_state_dict(fixed)
    report(wrapped_keys=wrapped_keys, prefix_error=prefix_error, fixed_keys=list(fixed))

    # 3. A crash in the middle of a save. There is a good checkpoint already (from step 1).
    size = checkpoint.stat().st_size
    direct, atomic = FOLDER / "direct.pt", FOLDER / "atomic.pt"
    save_directly(model.module.state_dict(), direct)
    save_atomically(model.module.state_dict(), atomic)
    crashes = {}
    for name, save, path in (("direct", save_directly, direct), ("atomic", save_atomically, atomic)):
        try:
            save(model.module.state_dict(), path, crash_after=size // 2)
        except Exception:  # noqa: BLE001 (torch.save reports the failed write as a RuntimeError)
            crashes[name] = {"loads": loads(path), "bytes": path.stat().st_size}
    crashes["full_size"] = size
    report(crash=crashes)

    # 4. weights_only: a pickle can run code when it is loaded. This one only prints; it could do anything.
    class Surprise:
        def __reduce__(self):
            return (print, ("!!! this line was printed by code inside the checkpoint",))

    unsafe = FOLDER / "unsafe.pt"
    torch.save({"weights": model.module.state_dict(), "extra": Surprise()}, unsafe)
    refused = {}
    for label, kwargs in (("default", {}), ("weights_only=True", {"weights_only": True})):
        try:
            torch.load(unsafe, **kwargs)
            refused[label] = None
        except Exception as error:  # noqa: BLE001
            refused[label] = type(error).__name__
    torch.load(unsafe, weights_only=False)  # runs the code: only for files you trust
    report(refused=refused)

if __name__ == "__main__":  # run alone; 03_all_demos.py runs it among other demos and ends the group itself
    dist.destroy_process_group()
