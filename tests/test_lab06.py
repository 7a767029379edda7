"""Lab 06 (BucketedDDP): realistic wrong versions fail with the message that names the mistake.

Mutants whose mistakes different checks catch share a launch; the two that crash run on one rank.
Dividing twice is told apart by the same check as no division (1/N instead of N times torch's gradient).
"""
from helpers import detail, wrong_version

LAB = "06_ddp_from_the_inside.py"
LAUNCH = "        self.works[i] = dist.all_reduce(self.flat[i], group=self.process_group, async_op=True)\n"
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
    assert "a bucket was never all-reduced" in failure.detail and "tied" in failure.detail


@wrong_version(LAB, ("if self.pending[i] == 0:", "if self.pending[i] == 1:  # one early"), nproc=1)
def test_lab06_bucket_launched_before_its_gradients_are_ready(report):
    (failure,) = report.failures
    assert "launched before all its gradients were ready" in failure.detail
