# =====================================================================================================
# Lab 06, learner copy: replace each TODO's raise line with your code, then check your work with
#     python -m ddpcourse check labs/06_ddp_from_the_inside.py
# Stuck on a TODO? `python -m ddpcourse hint 06` shows the next hint, one level at a time.
# Generated from solutions/06_ddp_from_the_inside.py by `python -m ddpcourse make-labs`; course authors edit that file.
# =====================================================================================================
"""Lab 06: BucketedDDP, your own DistributedDataParallel with buckets that overlap the backward pass.

torch's DDP does not wait for backward() to end: a hook on every parameter fires when its gradient is
ready; parameters are grouped into buckets (in the order their gradients become ready: the reverse of
registration order), and as soon as a bucket's last gradient arrives, the bucket is flattened into one
tensor and all-reduced asynchronously while the backward goes on. Before the optimizer's step, the wait
copies the averaged gradients back. This class does the same in about sixty lines.

Your tasks (clean/06_ddp_from_the_inside.ipynb builds the two simpler versions first):
  TODO 1  _grad_ready: a bucket's communication starts as soon as its last gradient is ready
  TODO 2  _launch_bucket: start one bucket's communication; the backward must not wait for it
  TODO 3  finish_gradient_synchronization: before the step, each .grad holds its mean over ranks

ddpcourse/harness/lab06.py runs your class: it trains the same models with your BucketedDDP and with
torch's DDP on the same data (a model with a frozen layer, a weight shared by two layers and BatchNorm
buffers; one bucket and several), notes how many collectives its process group had launched as each
gradient became ready, holds the other ranks back until rank 0 has all its gradients (an all-reduce in
flight then cannot have finished), and reports everything to the check.

Run it:    python -m ddpcourse run labs/06_ddp_from_the_inside.py --nproc 2
Check it:  python -m ddpcourse check labs/06_ddp_from_the_inside.py
"""
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn

DEFAULT_CAP_MB = 25.0  # torch's DDP, bucket_cap_mb left at None
FIRST_BUCKET_MB = 1.0  # torch's DDP: dist._DEFAULT_FIRST_BUCKET_BYTES, used only when bucket_cap_mb is None


def bucket_caps(bucket_cap_mb):
    """(first bucket's cap, every other bucket's cap) in bytes, by torch's DDP's rule: left at None, the cap
    is 25 MiB and the first bucket closes at 1 MiB already; a cap you set applies to the first bucket too."""
    cap = DEFAULT_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
    first = FIRST_BUCKET_MB if bucket_cap_mb is None else cap
    return first * 2**20, cap * 2**20


class _Replicated(nn.Module):
    """What every version of notebook 06 shares (NaiveDDP and OverlappedDDP in notebooks/demos/
    06_handwritten_ddp.py, BucketedDDP below): the start from rank 0's weights, rank 0's buffers at each
    forward, the trainable parameters, no_sync()."""

    def __init__(self, module, process_group=None):
        super().__init__()
        self.module = module
        self.process_group = process_group  # None: all ranks (as torch's DDP; the notebook uses subgroups)
        self.world_size = dist.get_world_size(process_group)
        self.require_sync = True  # False inside no_sync()
        # parameters() lists a weight shared by two layers once; frozen parameters get no gradient.
        self.params = [p for p in module.parameters() if p.requires_grad]
        with torch.no_grad():  # every rank starts from rank 0's weights and buffers
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor, group=process_group, group_src=0)

    def forward(self, *args, **kwargs):
        # Rank 0's buffers before each forward run with gradients on, outside no_sync(). torch's DDP decides
        # from the PREVIOUS forward instead: it skips the broadcast after a no_grad or no_sync forward.
        if torch.is_grad_enabled() and self.require_sync:
            with torch.no_grad():
                for buffer in self.module.buffers():
                    dist.broadcast(buffer, group=self.process_group, group_src=0)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally; the next one outside averages the total. Here the
        backward decides; torch's DDP decides in the forward (notebook 04), so put both inside, as for torch."""
        self.require_sync = False
        try:
            yield
        finally:
            self.require_sync = True


class BucketedDDP(_Replicated):
    """Data parallelism with gradient buckets all-reduced during the backward pass.

    After ``loss.backward()`` call ``finish_gradient_synchronization()``, then ``optimizer.step()``.
    """

    def __init__(self, module, bucket_cap_mb=None, process_group=None):
        super().__init__(module, process_group)
        # Buckets are filled once, in reverse registration order: the order in which gradients arrive when the
        # forward runs the layers in the order they were registered. torch's DDP starts with one bucket and,
        # after the first step, rebuilds them in the order it saw the gradients arrive: for such a model, the
        # same buckets. A bucket closes once it holds its cap (bucket_caps).
        caps = bucket_caps(bucket_cap_mb)
        self.buckets, size = [[]], 0
        for param in reversed(self.params):
            self.buckets[-1].append(param)
            size += param.numel() * param.element_size()
            if size >= caps[len(self.buckets) > 1]:
                self.buckets.append([])
                size = 0
        self.buckets = [bucket for bucket in self.buckets if bucket]
        self.bucket_of = {param: i for i, bucket in enumerate(self.buckets) for param in bucket}
        self.sizes = [[param.numel() for param in bucket] for bucket in self.buckets]
        self._reset()
        for param in self.params:
            param.register_post_accumulate_grad_hook(self._grad_ready)

    def _reset(self):
        self.pending = [len(bucket) for bucket in self.buckets]  # one counter per bucket
        self.flat = [None] * len(self.buckets)                   # one tensor per bucket
        self.works = [None] * len(self.buckets)                  # one work handle per bucket

    def _grad_ready(self, param):
        """Runs during backward, right after `param.grad` has been accumulated."""
        if not self.require_sync:
            return  # no_sync(): the gradient stays local and accumulates
        # TODO 1: each bucket knows how many of its gradients have not arrived yet; the last one
        #         starts it
        raise NotImplementedError('TODO 1: each bucket knows how many of its gradients have not arrived yet; the last one starts it')

    def _launch_bucket(self, i):
        """Start the all-reduce of bucket i and return at once: the backward goes on meanwhile."""
        # TODO 2: one communication per bucket, not per parameter, and it must not block: keep what
        #         lets you wait for it later
        raise NotImplementedError('TODO 2: one communication per bucket, not per parameter, and it must not block: keep what lets you wait for it later')

    def finish_gradient_synchronization(self):
        """Wait for every bucket and write the mean over ranks back into each parameter's .grad."""
        if not self.require_sync:
            return
        # TODO 3: an all-reduce sums; the optimizer reads a mean, and it reads it from each
        #         parameter's own .grad, not from the bucket's tensor
        raise NotImplementedError("TODO 3: an all-reduce sums; the optimizer reads a mean, and it reads it from each parameter's own .grad, not from the bucket's tensor")
        self._reset()


if __name__ == "__main__":
    # What runs your class and reports to the check (the model, the data, torch's DDP beside it) is
    # ddpcourse/harness/lab06.py: this file holds your class and the code it stands on.
    from ddpcourse.harness import lab06

    lab06.main(BucketedDDP)
