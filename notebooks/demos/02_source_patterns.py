"""Demo for notebook 02, Appendix C: the three ways the source article starts a DDP model, in the course's code.

One function per pattern, all in one launch. Each builds the course's TinyNet the way the article's
example does, wraps it in DistributedDataParallel and reports whether the replicas agree just before
and just after DDP(...). The article's code itself is not reproduced: only what it does.

python -m ddpcourse run notebooks/demos/02_source_patterns.py --nproc 2
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse import init_distributed, report
from ddpcourse.lab import compare_replicas
from ddpcourse.toy import TinyNet, build_model

# -----------------------------------------------------------------------------
SEED = 0               # the shared seed of the second pattern
FRESH_STREAM = 1000    # an unseeded process has a random stream of its own; fixed per rank so the output repeats
# -----------------------------------------------------------------------------

rank, world_size, device = init_distributed()


def replicas_around_wrap(model, **ddp_options):
    """Wrap `model` in DDP; return the wrapper and whether the replicas agreed before and after DDP(...)."""
    before = compare_replicas(model)
    wrapped = DDP(model, **ddp_options)
    return wrapped, {"before_wrap": before.as_dict(), "after_wrap": compare_replicas(wrapped).as_dict()}


def no_seed_then_wrap():
    """Pattern 1: every rank builds the model from its own random stream, then wraps it."""
    torch.manual_seed(FRESH_STREAM + rank)
    _, result = replicas_around_wrap(TinyNet())
    return result


def shared_seed_to_device_then_wrap():
    """Pattern 2: the same seed everywhere, build, move the model to this rank's device, then wrap.

    What the move is for: DDP never moves the module; `device_ids` only decides where the forward sends
    the inputs (notebook 02 reads both from torch's source). Every process holds its own model object
    whether or not it is moved.
    """
    model = build_model(seed=SEED).to(device)
    gpu = device.type == "cuda"
    _, result = replicas_around_wrap(model, device_ids=[device.index] if gpu else None)
    result["gpu_path"] = "run" if gpu else "not run on this machine: needs a CUDA device per rank"
    # A module left on the CPU with device_ids: DDP refuses device_ids (and output_device) for any CPU
    # module, on every rank alike, before any collective (so catching it is safe). This part runs on a CPU.
    try:
        DDP(build_model(seed=SEED), device_ids=[rank])
        result["left_on_cpu_error"] = None
    except ValueError as error:
        result["left_on_cpu_error"] = str(error)
    return result


def custom_row_on_rank0_then_object_list():
    """Pattern 3: rank 0 writes its own values into a layer, broadcast_object_list of the tensors, then wrap."""
    torch.manual_seed(FRESH_STREAM + rank)
    model = TinyNet()
    if rank == 0:
        with torch.no_grad():
            model.fc1.weight[0] = torch.arange(8.0)  # say, pretrained values that only rank 0 has
    tensors = [p.detach() for p in model.parameters()]
    dist.broadcast_object_list(tensors, src=0)  # replaces the list's items on ranks > 0; the model is not written
    after_object_list = compare_replicas(model)
    wrapped, result = replicas_around_wrap(model)
    result["after_object_list"] = after_object_list.as_dict()
    result["row0_after_wrap"] = wrapped.module.fc1.weight[0].tolist()
    return result


patterns = {"no_seed": no_seed_then_wrap(), "shared_seed": shared_seed_to_device_then_wrap(),
            "object_list": custom_row_on_rank0_then_object_list()}
for name, result in patterns.items():
    print(f"{name:12s} replicas identical before DDP(...): {result['before_wrap']['identical']}, "
          f"after: {result['after_wrap']['identical']}")
print(f"DDP(model on the CPU, device_ids=[{rank}]) -> ValueError: "
      f"{patterns['shared_seed']['left_on_cpu_error'][:80]}...")
report(**patterns)
if __name__ == "__main__":  # run alone; 02_all_demos.py runs it among other demos and ends the group itself
    dist.destroy_process_group()
