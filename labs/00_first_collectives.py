# =====================================================================================================
# Lab 00, learner copy: replace each TODO's raise line with your code, then check your work with
#     python -m ddpcourse check labs/00_first_collectives.py
# Stuck on a TODO? `python -m ddpcourse hint 00` shows the next hint, one level at a time.
# Generated from solutions/00_first_collectives.py by `python -m ddpcourse make-labs`; course authors edit that file.
# =====================================================================================================
"""Lab 00: first collectives. Combine numbers that live on different processes.

After a training step every rank knows only its own numbers: the loss on its shard of the batch, the
norm of its gradients. Logging, early stopping and gradient clipping need the *global* values, and
every rank needs them (not only rank 0), or the ranks start to take different decisions.

Your tasks (notebook 00, clean/00_start_here.ipynb, explains each collective with a picture):
  TODO 1  global_mean: the mean over ranks of each rank's loss, known on every rank
  TODO 2  global_max:  the largest gradient norm on any rank, known on every rank
  TODO 3  gather_all:  every rank's loss, in rank order, on every rank

Run it:    python labs/00_first_collectives.py                  (one process: world size 1)
           python -m ddpcourse run labs/00_first_collectives.py --nproc 3
Check it:  python -m ddpcourse check labs/00_first_collectives.py
"""
import torch
import torch.distributed as dist

from ddpcourse import init_distributed, report

# float64 so that the checker can compare exactly: these are exact binary fractions.
DTYPE = torch.float64


def local_measurements(rank):
    """What this rank measured on its own shard: different on every rank, the same on every run."""
    loss = torch.tensor(1.0 + 0.5 * rank, dtype=DTYPE)
    grad_norm = torch.tensor(float((rank * 5) % 7 + 1), dtype=DTYPE)  # 1, 6, 4, 2, ...: max not on the last rank
    return loss, grad_norm


def global_mean(value, world_size):
    """The mean of `value` over all ranks, returned on every rank. `value` itself is left unchanged."""
    # TODO 1: the mean is the total of every rank's value over the number of ranks, and every rank
    #         needs that total: one collective of notebook 00's section 3 gives it. `value` must
    #         stay as it was
    raise NotImplementedError("TODO 1: the mean is the total of every rank's value over the number of ranks, and every rank needs that total: one collective of notebook 00's section 3 gives it. `value` must stay as it was")


def global_max(value):
    """The largest `value` on any rank, returned on every rank. `value` itself is left unchanged."""
    # TODO 2: like the mean, but the ranks combine their values by keeping the largest instead of
    #         adding them; work on a copy again
    raise NotImplementedError('TODO 2: like the mean, but the ranks combine their values by keeping the largest instead of adding them; work on a copy again')


def gather_all(value, world_size):
    """A 1-D tensor of every rank's `value`, element i from rank i, on every rank."""
    # TODO 3: every rank needs one slot per rank; one collective fills slot r with rank r's value on
    #         every rank; return them as one 1-D tensor, element r from rank r
    raise NotImplementedError("TODO 3: every rank needs one slot per rank; one collective fills slot r with rank r's value on every rank; return them as one 1-D tensor, element r from rank r")


def main():
    rank, world_size, device = init_distributed()
    loss, grad_norm = local_measurements(rank)
    loss, grad_norm = loss.to(device), grad_norm.to(device)

    mean_loss = global_mean(loss, world_size)
    max_grad_norm = global_max(grad_norm)
    all_losses = gather_all(loss, world_size)

    print(f"local loss {loss.item():.2f}, local grad norm {grad_norm.item():.0f} -> "
          f"mean loss {mean_loss.item():.4f}, max grad norm {max_grad_norm.item():.0f}, "
          f"all losses {all_losses.tolist()}")
    # The check reads these; the local values too, to catch an in-place all_reduce on the caller's tensor.
    report(local_loss=loss, local_grad_norm=grad_norm, mean_loss=mean_loss,
           max_grad_norm=max_grad_norm, all_losses=all_losses)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
