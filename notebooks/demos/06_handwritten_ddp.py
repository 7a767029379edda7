"""Two hand-written data-parallel wrappers for notebook 06, the steps before the lab's BucketedDDP.

NaiveDDP      after backward, one all_reduce per gradient, then divide.
OverlappedDDP a hook per parameter starts that gradient's all_reduce (async) as soon as it is ready;
              finish_gradient_synchronization() waits for them and divides.

Both have BucketedDDP's interface: the constructor broadcasts parameters and buffers from the group's
rank 0; frozen parameters are skipped; a weight shared by two layers is one tensor, listed once by
model.parameters(); no_sync() accumulates; .module is the wrapped model. Call
finish_gradient_synchronization() after backward() and before optimizer.step().
Not a script: demos/06_inside_ddp.py and benchmarks/own_ddp_vs_torch.py load it.
"""
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn


class _Replicated(nn.Module):
    """What every version shares: the starting broadcast, buffers from rank 0 at each forward, no_sync()."""

    def __init__(self, module, process_group=None):
        super().__init__()
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.require_sync = True
        self.params = [p for p in module.parameters() if p.requires_grad]
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor, group=process_group, group_src=0)

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled() and self.require_sync:  # THIS forward decides; torch's DDP: the previous one
            with torch.no_grad():
                for buffer in self.module.buffers():
                    dist.broadcast(buffer, group=self.process_group, group_src=0)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        self.require_sync = False
        try:
            yield
        finally:
            self.require_sync = True


class NaiveDDP(_Replicated):
    def finish_gradient_synchronization(self):
        if not self.require_sync:
            return
        for param in self.params:  # one message per tensor, only once the whole backward is done
            dist.all_reduce(param.grad, group=self.process_group)
            param.grad /= self.world_size


class OverlappedDDP(_Replicated):
    def __init__(self, module, process_group=None):
        super().__init__(module, process_group)
        self.in_flight = []  # (parameter, work) in the order the gradients became ready
        for param in self.params:
            param.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, param):
        if self.require_sync:  # start it now; the backward goes on while it runs
            self.in_flight.append((param, dist.all_reduce(param.grad, group=self.process_group, async_op=True)))

    def finish_gradient_synchronization(self):
        if not self.require_sync:
            return
        for param, work in self.in_flight:
            work.wait()
            param.grad /= self.world_size
        self.in_flight = []
