# =====================================================================================================
# Lab 08, learner copy: replace each TODO's raise line with your code, then check your work with
#     python -m ddpcourse check labs/08_broken_trainers.py
# Stuck on a TODO? `python -m ddpcourse hint 08` shows the next hint, one level at a time.
# Generated from solutions/08_broken_trainers.py by `python -m ddpcourse make-labs`; course authors edit that file.
# =====================================================================================================
"""Lab 08: three broken DDP trainers. Find the rank, the collective (or parameter) and the line; then fix them.

Each trainer is a short, realistic DDP training run with one distributed bug, of three different kinds:
    hang     a trainer that logs its mean loss: it stops, and nothing prints an error for a while;
    crash    a trainer whose model has a learned output scale: it dies with a RuntimeError from DDP;
    diverge  a trainer with a learning-rate schedule: it finishes, and its replicas no longer agree.

The design (notebook 08, section 4): the part of each trainer that holds the bug is given twice, once as it
was written (the functions and class named *_as_given, outside the TODOs: run them, never edit them) and once
as a TODO that you fill with the fixed version. `--as-given` runs the given version, so that you can watch it
fail under the tools of notebook 08; without it the trainer runs your fix. TODO 1 is your diagnosis, written as
data: the rank (or "every" when every rank does the same wrong thing), the collective or the parameter, and
the line, as its code (the text of the line in the *_as_given code, without its comment).

Your tasks:
  TODO 1  diagnoses: what each as-given trainer does wrong, and where
  TODO 2  log_progress: the hang trainer's logging, fixed
  TODO 3  ScaledNet.forward: the crash trainer's model, fixed
  TODO 4  end_of_step: the diverge trainer's schedule, fixed

Watch it fail:  python -m ddpcourse run labs/08_broken_trainers.py --nproc 3 -- --trainer hang --as-given
Run your fix:   python -m ddpcourse run labs/08_broken_trainers.py --nproc 3 -- --trainer hang
Check:          python -m ddpcourse check labs/08_broken_trainers.py
The check runs each fixed trainer on 1, 2 and 3 ranks and compares its final weights with the same training
done in one process (the check computes that itself), the mean losses the hang trainer logs with that training's
losses, every rank's learning rate after every step with the schedule, and your diagnoses with the true causes.
"""
import argparse
import datetime

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from ddpcourse import report
from ddpcourse.toy import build_model, make_dataset

# ---- config (the check trains the same way in one process: keep it as it is) ---------------------------------
SAMPLES = 48            # divisible by 1, 2 and 3 ranks
GLOBAL_BATCH = 12       # every step sees 12 samples in all, whatever the world size
EPOCHS = 2
LR = 0.05
LOG_EVERY = 2           # steps between log lines
SEED = 0
# A debugging timeout for the default group (init_process_group's, where DDP's collectives run): a rank stuck in
# one of its collectives raises after 5 s instead of torch's 30 minutes. A group made later by dist.new_group()
# does not inherit it: without a timeout= of its own it gets torch's 30 minutes (train() makes one so, as the
# script was written).
PG_TIMEOUT = datetime.timedelta(seconds=5)
# ----------------------------------------------------------------------------------------------------------------


def diagnoses():
    """Your diagnosis of each as-given trainer: which rank, which collective or parameter, which line."""
    # TODO 1: run each trainer with --as-given on 3 ranks and read the launcher's verdict (the line
    #         ahead of the stacks): it names the collective where the ranks disagree, or the
    #         parameters without a gradient; the diverge trainer raises nothing: compare the ranks'
    #         weights step by step (a checksum per step)
    raise NotImplementedError("TODO 1: run each trainer with --as-given on 3 ranks and read the launcher's verdict (the line ahead of the stacks): it names the collective where the ranks disagree, or the parameters without a gradient; the diverge trainer raises nothing: compare the ranks' weights step by step (a checksum per step)")


# ---------------------------------------------------------------------------------------------------- hang
def log_progress_as_given(step, loss, rank, log_group):
    """The mean loss over the ranks, printed every LOG_EVERY steps and returned (as written: it hangs). Its
    all-reduce goes through a group of its own, created so that logging never gets in the way of DDP's
    collectives."""
    if rank == 0 and step % LOG_EVERY == 0:
        total = loss.detach().clone()
        dist.all_reduce(total, group=log_group)
        mean = total.item() / dist.get_world_size()
        print(f"step {step}: mean loss {mean:.4f}", flush=True)
        return mean


def log_progress(step, loss, rank, log_group):
    """The mean loss over the ranks (through log_group), every LOG_EVERY steps: rank 0 prints it and returns it;
    every other call returns None. The trainer reports what it returns, and the check compares it with the
    losses of the same training in one process."""
    # TODO 2: a collective is a call every rank makes, in the same order: only the printing (and the
    #         value returned) is rank 0's
    raise NotImplementedError("TODO 2: a collective is a call every rank makes, in the same order: only the printing (and the value returned) is rank 0's")


# ---------------------------------------------------------------------------------------------------- crash
class ScaledNetAsGiven(torch.nn.Module):
    """A two-layer net with a learned output scale (as written: DDP raises at the second step)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(SEED)
        self.body = torch.nn.Linear(8, 16)
        self.head = torch.nn.Linear(16, 1)
        self.out_scale = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        hidden = torch.relu(self.body(x))
        return self.head(hidden)


class ScaledNet(ScaledNetAsGiven):
    def forward(self, x):
        # TODO 3: a parameter DDP expects a gradient for must take part in the loss; the net's
        #         output is meant to be scaled by it (telling DDP to look for unused parameters
        #         hides the error and trains another model)
        raise NotImplementedError("TODO 3: a parameter DDP expects a gradient for must take part in the loss; the net's output is meant to be scaled by it (telling DDP to look for unused parameters hides the error and trains another model)")


# ---------------------------------------------------------------------------------------------------- diverge
def end_of_step_as_given(step, loss, rank, scheduler):
    """Log, and decay the learning rate every LOG_EVERY steps (as written: the replicas drift apart)."""
    if rank == 0 and step % LOG_EVERY == 0:
        print(f"step {step}: loss {loss.item():.4f}, lr {scheduler.get_last_lr()[0]:.4f}", flush=True)
        scheduler.step()


def end_of_step(step, loss, rank, scheduler):
    """Log on rank 0, and decay the learning rate every LOG_EVERY steps on every rank."""
    # TODO 4: DDP keeps the gradients equal, not the optimizers: whatever changes how a rank steps
    #         must happen on every rank; only the printing is rank 0's
    raise NotImplementedError("TODO 4: DDP keeps the gradients equal, not the optimizers: whatever changes how a rank steps must happen on every rank; only the printing is rank 0's")


# ---------------------------------------------------------------------------------------------------- the loop
def weight_checksum(model):
    """This rank's sum of its weights, in float64. Reported, not all-gathered: a collective of its own would
    change the very order of collectives the hang trainer gets wrong. Compare the ranks' lists after the run."""
    return sum(p.detach().double().sum().item() for p in model.parameters())


def train(trainer, as_given):
    dist.init_process_group("gloo", timeout=PG_TIMEOUT)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dataset = make_dataset(samples=SAMPLES, seed=SEED)
    # no shuffle: step b of every rank together covers samples 12 b .. 12 b + 11, as one process's batch b
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False)
    order, batch = list(sampler), GLOBAL_BATCH // world_size
    if trainer == "crash":
        model = DDP(ScaledNetAsGiven() if as_given else ScaledNet())
    else:
        model = DDP(build_model(SEED))
    # every rank creates every group, in the same order (torch's rule); no timeout= here, so this group waits
    # torch's default 30 minutes, not PG_TIMEOUT
    log_group = dist.new_group()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    checksums, logged_means, learning_rates, step = [], [], [], 0
    for epoch in range(EPOCHS):
        for start in range(0, len(order), batch):
            indices = order[start:start + batch]
            x, y = dataset.tensors[0][indices], dataset.tensors[1][indices]
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if trainer == "hang":
                mean = (log_progress_as_given if as_given else log_progress)(step, loss, rank, log_group)
                if mean is not None:
                    logged_means.append([step, mean])
            if trainer == "diverge":
                (end_of_step_as_given if as_given else end_of_step)(step, loss, rank, scheduler)
            checksums.append(weight_checksum(model))  # after step `step`
            learning_rates.append(optimizer.param_groups[0]["lr"])  # the rate of step `step` + 1, on this rank
    report(trainer=trainer, as_given=as_given, steps=step, checksums=checksums, weights=model.module.state_dict(),
           logged_means=logged_means, learning_rates=learning_rates)
    if not as_given:  # the as-given trainers run before any TODO is done: they ask for no diagnosis
        report(diagnoses=diagnoses())
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainer", required=True, choices=["hang", "crash", "diverge"])
    parser.add_argument("--as-given", action="store_true", help="run the trainer as it was written (broken)")
    options = parser.parse_args()
    train(options.trainer, options.as_given)
