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
import importlib.util
from pathlib import Path

import torch.distributed as dist

# The base class is the lab's own (solutions/06_ddp_from_the_inside.py: the start from rank 0's weights, the
# buffers at each forward, no_sync()), loaded by path: one copy, and a demo never runs the learner's lab.
_spec = importlib.util.spec_from_file_location(
    "lab06_solution", Path(__file__).resolve().parents[2] / "solutions" / "06_ddp_from_the_inside.py")
_solution = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_solution)
_Replicated = _solution._Replicated


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
