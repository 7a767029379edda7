"""Demo for notebook 00: broadcast, all_reduce and all_gather on the values of the pictures, then
ReduceOp.AVG and an asynchronous all_reduce.

python -m ddpcourse run notebooks/demos/00_collectives.py --nproc 3
"""
import torch
import torch.distributed as dist

from ddpcourse import init_distributed, report

rank, world_size, device = init_distributed()
start = [7.0, 1.0, 4.0, 2.0][rank % 4]  # each rank starts with its own number

t = torch.tensor(start, device=device)
dist.broadcast(t, src=0)  # in place: every rank's t now holds rank 0's value
broadcast = t.item()

t = torch.tensor(start, device=device)
dist.all_reduce(t, op=dist.ReduceOp.SUM)  # in place: every rank's t now holds the sum
summed = t.item()

t = torch.tensor(start, device=device)
parts = [torch.empty_like(t) for _ in range(world_size)]  # one slot per rank, filled in rank order
dist.all_gather(parts, t)
gathered = [p.item() for p in parts]

print(f"started with {start:g}: broadcast -> {broadcast:g}, all_reduce -> {summed:g}, all_gather -> {gathered}")

# --- the mean in one call (float tensors)
t = torch.tensor(start, device=device)
dist.all_reduce(t, op=dist.ReduceOp.AVG)
averaged = t.item()

# --- async_op=True: the call hands back a Work handle; the result is there after wait()
t = torch.tensor(start, device=device)
work = dist.all_reduce(t, async_op=True)
work.wait()
if device.type == "cuda":
    # with nccl, wait() only made the stream wait, and is_completed() asks whether the GPU has finished the
    # operation: wait for the GPU first, so that "completed" reads True on every backend
    torch.cuda.synchronize()
async_result = {"handle": type(work).__name__, "completed": work.is_completed(), "value": t.item()}

# --- with nccl a blocking call returns once the reduction is queued on the GPU stream
queued_only = None  # stays None on CPU (gloo): there the call returns with the result in t
if device.type == "cuda":
    # made before the sleep: copying a CPU value to the GPU waits for the stream, so after the sleep it
    # would hold the CPU until the sleep was over, and the check below would prove nothing
    t = torch.tensor(start, device=device)
    torch.cuda._sleep(200_000_000)  # keep this rank's stream busy for a while (GPU clock cycles)
    dist.all_reduce(t)
    queued_only = not torch.cuda.current_stream().query()  # True: returned while the stream still works
    torch.cuda.synchronize()

print(f"AVG -> {averaged:g}; async: {async_result}")
report(start=start, broadcast=broadcast, all_reduce=summed, all_gather=gathered, avg=averaged,
       async_result=async_result, backend=dist.get_backend(), queued_only=queued_only)
dist.destroy_process_group()
