"""Lab 04 (local SGD): realistic wrong versions fail with the message that names the mistake.

Each mutant combines mistakes that different checks catch, so two launches cover five mistakes.
"""
import re

from ddpcourse.paths import COURSE_ROOT
from helpers import detail, wrong_version

LAB = "04_local_sgd.py"


def averaging_steps():
    """The steps after which the solution averages, from its own config (the source of truth)."""
    config = dict(re.findall(r"^([A-Z_]+) = (\d+)", (COURSE_ROOT / "solutions" / LAB).read_text(), re.M))
    steps, every = int(config["STEPS"]), int(config["AVERAGE_EVERY"])
    return [step for step in range(1, steps + 1) if step % every == 0]


@wrong_version(LAB,
               ("                tensor /= world_size", "                tensor *= 1  # the sum stays"),
               ("if step % every == 0:", "if True:  # every step"), nproc=2)
def test_lab04_sum_without_division_and_averaging_every_step(report):
    assert not report.passed
    params = detail(report, "every parameter is averaged")
    assert not params.passed and "SUM over ranks" in params.detail and "divide by the world size" in params.detail
    assert "still differ" not in params.detail  # every rank holds the same (wrong) sum
    buffers = detail(report, "every buffer is averaged")
    assert not buffers.passed and "SUM over ranks" in buffers.detail and "norm.running_mean" in buffers.detail
    schedule = detail(report, "replicas differ between averagings")
    assert not schedule.passed and "you average every step" in schedule.detail
    assert str(averaging_steps()) in schedule.detail
    assert not detail(report, "PeriodicModelAverager").passed


@wrong_version(LAB,
               ("list(model.parameters()) + list(model.buffers())", "list(model.parameters())[:2]"),
               ("    return False\n    ### END SOLUTION", "    ### END SOLUTION"), nproc=2)
def test_lab04_some_parameters_only_buffers_forgotten_and_no_return_false(report):
    params = detail(report, "every parameter is averaged")
    assert not params.passed and "not only some of them" in params.detail
    assert "fc2.weight" in params.detail and "fc1.weight" not in params.detail  # names what was left out
    buffers = detail(report, "every buffer is averaged")
    assert not buffers.passed and "average model.buffers() too" in buffers.detail
    assert "norm.running_mean" in buffers.detail and "SUM" not in buffers.detail
    schedule = detail(report, "replicas differ between averagings")
    assert not schedule.passed and "maybe_average returned None after some steps" in schedule.detail
    assert "you average" not in schedule.detail  # the schedule itself is right: only the return value is not
