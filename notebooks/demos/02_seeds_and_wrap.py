"""Demo for notebook 02, sections 1-2: seeds decide the initial weights; DDP's constructor checks, then broadcasts.

python -m ddpcourse run notebooks/demos/02_seeds_and_wrap.py --nproc 2
It wraps models that differ on purpose: in their number of parameters, in a parameter's strides, in a frozen
parameter's size (which the check does not see, and the broadcast mangles), and (the last step) in a
parameter's sizes: the run ends with DDP's error. It also wraps with init_sync=False and with an ignored buffer.
Notebook 02 runs it with the notebook's other demos, in one launch: demos/02_all_demos.py.
"""
import inspect

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse import init_distributed, report
from ddpcourse.lab import CollectiveLog, compare_replicas
from ddpcourse.toy import TinyNet, build_model

# -----------------------------------------------------------------------------
SEED = 0            # the shared seed for the initial weights
WARMUP_BATCH = 8    # rows per BatchNorm warm-up batch (makes the buffers differ per rank)
# -----------------------------------------------------------------------------

# 1. Seeds decide the initial weights, wherever the model is built.
built_before_init = build_model(seed=SEED)  # no process group exists yet
torch.manual_seed(SEED)  # seeded before the group exists, built after it, NOT seeded again in between:
rank, world_size, device = init_distributed()
seeded_before_init_built_after = TinyNet()  # ...equal to build_model(SEED) only if the group drew no numbers
built_after_init = build_model(seed=SEED)
seeded_by_rank = build_model(seed=SEED + rank)

torch.manual_seed(SEED)
if rank == 0:
    torch.rand(3)  # rank 0 alone draws a random number (say, for a log) between seeding and building
extra_draw_on_rank0 = TinyNet()

seeds = {"built_before_init": compare_replicas(built_before_init),
         "built_after_init": compare_replicas(built_after_init),
         "seeded_by_rank": compare_replicas(seeded_by_rank),
         "extra_draw_on_rank0": compare_replicas(extra_draw_on_rank0)}
for name, result in seeds.items():
    print(f"{name:20s} {result}")
# build_model seeds itself: this compares what creating the group left in the generator with a fresh seed
init_draws_nothing = all(torch.equal(a, b) for a, b in zip(seeded_before_init_built_after.state_dict().values(),
                                                             built_after_init.state_dict().values()))
print(f"seeded, init_process_group, built: the weights of build_model(SEED): {init_draws_nothing}")
report(seeds={name: r.as_dict() for name, r in seeds.items()}, init_draws_nothing=init_draws_nothing)


# 2. DDP's constructor broadcasts rank 0's parameters AND buffers.
def differently_started(rank):
    """A BatchNorm model seeded by rank, its running statistics warmed on rank+1 batches of its own."""
    model = build_model(seed=SEED + rank, batchnorm=True)
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(rank + 1):  # num_batches_tracked differs too
        model(torch.randn(WARMUP_BATCH, 8, generator=generator) + rank)
    return model


model = differently_started(rank)
before = compare_replicas(model)
tensors_before = [t for t in list(model.parameters()) + list(model.buffers())]
ddp = DDP(model)  # default forward_sync_buffers=True (formerly broadcast_buffers) and init_sync=True: the broadcast happens here
after = compare_replicas(ddp)
rank0_start = differently_started(0)  # rebuilt here, on every rank, to compare with what DDP left
equals_rank0 = all(torch.equal(a, b) for a, b in zip(ddp.module.state_dict().values(),
                                                      rank0_start.state_dict().values()))
same_tensors = all(a is b for a, b in zip(tensors_before, list(model.parameters()) + list(model.buffers())))
print(f"before DDP(...): {before}")
print(f"after  DDP(...): {after}")
print(f"every rank now holds rank 0's start: {equals_rank0}; same tensor objects, written in place: {same_tensors}")

# Where torch does it: the lines of DistributedDataParallel.__init__ that verify and broadcast.
source = inspect.getsource(DDP.__init__).splitlines()
where = [line.strip() for line in source if line.strip() == "if init_sync:"
         or "_verify_param_shape_across_processes(" in line
         or "_sync_module_states(" in line or line.strip().startswith("src=0")]
print("in DistributedDataParallel.__init__:", *where, sep="\n    ")
report(before_wrap=before.as_dict(), after_wrap=after.as_dict(), equals_rank0_start=equals_rank0,
       same_tensor_objects=same_tensors, module_is_model=ddp.module is model, ddp_init_lines=where)

# Both sit under `if init_sync:` (default True): DDP(..., init_sync=False) checks and sends nothing.
unsynced = differently_started(rank)
with CollectiveLog() as log:
    DDP(unsynced, init_sync=False)
init_sync_off = {"collectives": log.names, "identical": compare_replicas(unsynced).identical}
# Tensors on the wrapper's ignore list (a private torch helper writes it) are left out of the broadcast.
ignoring = differently_started(rank)
DDP._set_params_and_buffers_to_ignore_for_model(ignoring, ["norm.running_mean"])
DDP(ignoring)
ignored_still_differ = [d["name"] for d in compare_replicas(ignoring).as_dict()["differences"]]
print(f"DDP(..., init_sync=False): {init_sync_off}; with norm.running_mean ignored, still different: "
      f"{ignored_still_differ}")
report(init_sync_off=init_sync_off, ignored_still_differ=ignored_still_differ)


# 3. Before it broadcasts, the constructor checks the replicas: which collectives, and what each mismatch raises.
def wrap_logged(model):
    """DDP(model) on this rank: the collectives it launched and the text of its RuntimeError (None if none)."""
    with CollectiveLog() as log:
        try:
            DDP(model)
        except RuntimeError as error:
            return {"collectives": log.names, "error": str(error)}
    return {"collectives": log.names, "error": None}


# 3a. A different NUMBER of parameters: rank 1's model has one more layer (2 more parameters).
more_parameters = TinyNet()
if rank == 1:
    more_parameters.extra = torch.nn.Linear(1, 1)
count_check = wrap_logged(more_parameters)
print(f"{len(list(more_parameters.parameters()))} parameters: {count_check}")

# 3b. The same sizes, other strides: rank 1's fc1.weight is a [16, 8] view of an [8, 16] tensor.
other_strides = TinyNet()
if rank == 1:
    other_strides.fc1.weight = torch.nn.Parameter(torch.empty(8, 16).t())
stride_check = wrap_logged(other_strides)
print(f"fc1.weight strides {other_strides.fc1.weight.stride()}: {stride_check}")
if stride_check["error"] is not None:
    # Rank 0, whose metadata was the reference, passed the check and now waits in the broadcast of its
    # parameters: this rank joins that broadcast (as DDP would have), so that the run can go on.
    dist._broadcast_coalesced(dist.group.WORLD, [p.detach() for p in other_strides.parameters()],
                              250 * 1024 * 1024, 0)

# 3c. A FROZEN parameter of another size: the check counts and compares trainable parameters only
#     (DDP._build_params_for_reducer keeps those with requires_grad), so it lets this pass. The broadcast
#     that follows sends every parameter, frozen ones too, flattened into one bucket in named_parameters()
#     order (the root module's own `frozen` first): the ranks' buckets differ in length.
frozen_differs = TinyNet()
frozen_differs.frozen = torch.nn.Parameter(torch.full((3 + rank,), 10.0 + rank), requires_grad=False)
frozen_check = wrap_logged(frozen_differs)
print(f"a frozen parameter of {3 + rank} elements: {frozen_check}")
buckets = [None] * world_size  # each rank's parameters after DDP(...), flattened in the broadcast's order
dist.all_gather_object(buckets, torch.cat([p.detach().flatten() for p in frozen_differs.parameters()]).tolist())
frozen_after = {"frozen": frozen_differs.frozen.tolist(),
                "first_in_bucket": next(frozen_differs.named_parameters())[0],
                "rank1_starts_with_rank0s_bucket": buckets[1][:len(buckets[0])] == buckets[0],
                "trainable_identical": buckets[0][3:] == buckets[1][4:]}  # after each rank's frozen elements
print(f"after it: {frozen_after}")
report(count_check=count_check, stride_check=stride_check, frozen_check=frozen_check, frozen_after=frozen_after)


def wrap_mismatched_shapes():
    """3c. Other sizes: rank 1's hidden layer is one unit wider. The run ends here."""
    mismatched = TinyNet(hidden=16 + rank)
    print(f"wrapping a model with fc1.weight of shape {list(mismatched.fc1.weight.shape)} ...")
    with CollectiveLog() as log:
        try:
            DDP(mismatched)  # ranks > 0 raise; rank 0 (the reference) moves on to the broadcast and is stopped
        finally:
            report(shape_check_collectives=log.names)  # what a rank launched before it raised


if __name__ == "__main__":  # run alone; 02_all_demos.py calls the last step itself, after the other demos
    wrap_mismatched_shapes()
    dist.destroy_process_group()
