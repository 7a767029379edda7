"""Lab 06 (BucketedDDP): realistic wrong versions fail with the message that names the mistake.

Mutants whose mistakes different checks catch share a launch; the two that crash run on one rank.
Dividing twice is told apart by the same check as no division (1/N instead of N times torch's gradient).
Blocking inside the backward is caught whatever the route (Work.wait, its future, polling): the evidence is
a collective that cannot finish before rank 0's last gradient, not a wrapper the lab could step around.
"""
from helpers import detail, wrong_version

LAB = "06_ddp_from_the_inside.py"
LAUNCH = "        self.works[i] = dist.all_reduce(self.flat[i], group=self.process_group, async_op=True)\n"
FIRST_CAP = "    first = FIRST_BUCKET_MB if bucket_cap_mb is None else cap\n"
READY = "        if self.pending[i] == 0:\n            self._launch_bucket(i)\n"
FINISH = "        for i, bucket in enumerate(self.buckets):\n            self.works[i].wait()\n"
DIVIDE = "            self.flat[i] /= self.world_size\n"


@wrong_version(LAB, ("                dist.broadcast(tensor, group=process_group, group_src=0)\n", "                pass\n"),
               (LAUNCH, LAUNCH + "        self.works[i].wait()  # waits right here, inside the backward\n"), nproc=2)
def test_lab06_no_broadcast_at_start_and_waiting_inside_the_hook(report):
    start = detail(report, "rank 0's weights and buffers")
    assert not start.passed and "ranks [1] differ from rank 0" in start.detail and "broadcast every" in start.detail
    replicas = detail(report, "parameters identical on every rank")
    assert not replicas.passed and "ranks [1] differ" in replicas.detail
    overlap = detail(report, "communication overlaps the backward")
    assert not overlap.passed and "waiting inside the hook" in overlap.detail
    assert detail(report, "one all_reduce per bucket").passed  # the calls themselves are right


@wrong_version(LAB, (DIVIDE, "            pass  # the sum stays\n"), nproc=2)
def test_lab06_no_division(report):
    for label in ("(one bucket)", "(256-byte buckets)"):
        equal = detail(report, f"equal torch's DDP after 3 steps {label}")
        assert not equal.passed and "2x torch's: the SUM over ranks" in equal.detail
    assert not detail(report, "no_sync() accumulates").passed
    assert detail(report, "rank 0's weights").passed and detail(report, "communication overlaps").passed



@wrong_version(LAB, (DIVIDE, DIVIDE + DIVIDE), nproc=2)
def test_lab06_divided_twice(report):
    # world size 2: at 1 a second division by 1 changes nothing
    for label in ("(one bucket)", "(256-byte buckets)"):
        equal = detail(report, f"equal torch's DDP after 3 steps {label}")
        assert not equal.passed and "1/2 of torch's: divided by the world size twice" in equal.detail
        assert "SUM over ranks" not in equal.detail


@wrong_version(LAB, ("params = [p for p in module.parameters() if p.requires_grad]",
                               "params = [p for layer in module.modules() for p in layer.parameters(recurse=False)"
                               " if p.requires_grad]"), nproc=1)
def test_lab06_tied_weight_counted_twice(report):
    # a crash: one rank shows it
    (failure,) = report.failures
    assert "the lab runs to the end" in failure.name
    assert "never launched" in failure.detail and "tied" in failure.detail


FLATTEN = "        self.flat[i] = torch._utils._flatten_dense_tensors([p.grad for p in self.buckets[i]])\n"


@wrong_version(LAB, ("if self.pending[i] == 0:", "if self.pending[i] == 1:  # one early"),
               (FLATTEN, "        self.flat[i] = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])\n"), nproc=1)
def test_lab06_bucket_launched_before_its_gradients_are_ready(report):
    # the learner's likely flatten (torch.cat of reshapes) meets the missing gradient as an AttributeError
    (failure,) = report.failures
    assert "launched before all its gradients were ready" in failure.detail


def test_lab06_a_missing_gradient_is_explained_whichever_flatten_met_it():
    from types import SimpleNamespace

    from ddpcourse.checks import lab06
    from ddpcourse.launch.diagnosis import EXCEPTION_KIND

    for error in ("AttributeError: 'NoneType' object has no attribute 'reshape'",
                  "TypeError: expected Tensor as element 8 in argument 0, but got NoneType"):
        run = SimpleNamespace(failure=SimpleNamespace(kind=EXCEPTION_KIND, error=error))
        assert "launched before all its gradients were ready" in lab06.LAB_CHECK.explain(run)
    run = SimpleNamespace(failure=SimpleNamespace(kind=EXCEPTION_KIND, error="TypeError: something else"))
    assert lab06.LAB_CHECK.explain(run) == ""


@wrong_version(LAB, (LAUNCH, LAUNCH + "        self.works[i].get_future().wait()  # blocks through the future\n"),
               (FIRST_CAP, "    first = min(FIRST_BUCKET_MB, cap)  # the first bucket always at most 1 MiB\n"), nproc=2)
def test_lab06_waiting_through_the_future_and_the_first_bucket_always_small(report):
    overlap = detail(report, "communication overlaps the backward")
    assert not overlap.passed and "never produced its last gradient" in overlap.detail
    assert "waiting inside the hook" in overlap.detail
    buckets = detail(report, "buckets hold the parameters torch's DDP puts in each")
    assert not buckets.passed and "bucket_cap_mb=2.5" in buckets.detail
    assert detail(report, "one all_reduce per bucket").passed  # the calls themselves are right
    assert detail(report, "equal torch's DDP after 3 steps (256-byte buckets)").passed


@wrong_version(LAB, (LAUNCH, LAUNCH.replace("group=self.process_group, ", "")
                     + "        while not self.works[i].is_completed():  # polls until it is done\n"
                       "            pass\n"), nproc=2)
def test_lab06_polling_inside_the_hook_on_the_default_group(report):
    calls = detail(report, "one all_reduce per bucket")
    assert not calls.passed and "on the default group" in calls.detail and "self.process_group" in calls.detail
    overlap = detail(report, "communication overlaps the backward")
    assert not overlap.passed and "never produced its last gradient" in overlap.detail
    assert detail(report, "equal torch's DDP after 3 steps (one bucket)").passed  # same ranks: same sums


@wrong_version(LAB, (READY, "        if self.pending[i] == 0:\n            pass  # launched later\n"),
               (FINISH, "        for i, bucket in enumerate(self.buckets):\n            self._launch_bucket(i)\n"
                        "            self.works[i].wait()\n"), nproc=2)
def test_lab06_every_bucket_launched_after_the_backward(report):
    overlap = detail(report, "communication overlaps the backward")
    assert not overlap.passed and "every all_reduce started after the backward" in overlap.detail
    assert detail(report, "one all_reduce per bucket").passed
    assert detail(report, "equal torch's DDP after 3 steps (256-byte buckets)").passed
