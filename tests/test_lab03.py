"""Lab 03 (change a wrapped model): realistic wrong versions fail with the message that names the mistake.

Two launches: the first version holds two independent mistakes, each caught by its own check (they need two
ranks); the optimizer mistake shows on one rank, the cheapest launch."""
from helpers import detail, wrong_version

LAB = "03_change_a_wrapped_model.py"


@wrong_version(LAB,
               ("    model = DDP(net)\n", "    # kept the old DDP wrapper\n"),
               ("        dist.broadcast(bias, src=0)\n", "        pass  # rank 0's edit stays on rank 0\n"), nproc=2)
def test_lab03_layer_added_without_rewrap_and_rank0_edit_without_broadcast(report):
    assert not report.passed
    same = detail(report, "new layer is identical")
    assert not same.passed and "fc2.new.weight" in same.detail and "wrap the changed module in a NEW DDP" in same.detail
    calibration = detail(report, "calibration reaches every rank")
    assert not calibration.passed and "rank 1:" in calibration.detail and "rank 0:" not in calibration.detail
    assert "made on rank 0 only and never sent" in calibration.detail and "dist.broadcast(bias, src=0)" in calibration.detail
    assert detail(report, "the new layer trains").passed  # told apart from the optimizer mistake
    assert not detail(report, "all replicas identical").passed


@wrong_version(LAB,
               ("    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)\n    ### END",
                "    ### END"), nproc=1)
def test_lab03_optimizer_still_holds_only_the_old_parameters(report):
    trains = detail(report, "the new layer trains")
    assert not trains.passed and "optimizer holds 4 of the model's 6" in trains.detail
    assert "Build a new one after growing" in trains.detail
    assert detail(report, "calibration reaches every rank").passed  # told apart from the other mistakes
