"""Lab 05's check against realistic wrong trainers: each must fail with the message naming its mistake."""
from ddpcourse.checks import check_lab
from helpers import detail, mutant

LAB = "05_resilient_trainer.py"


def test_missing_set_epoch_and_resume_from_step_0(tmp_path):
    path = mutant(tmp_path, LAB,
                  ("    sampler.set_epoch(epoch)  #", "    pass  #"),
                  ("    if not os.path.exists(path):\n        return 0", "    if True:\n        return 0"))
    report = check_lab(path, nproc=2, quiet=True)
    order = detail(report, "new order")
    assert not order.passed and "call sampler.set_epoch(epoch)" in order.detail
    resume = detail(report, "resumed from the last checkpoint")
    assert not resume.passed and "started again from step 0" in resume.detail
    # retraining from scratch is deterministic, so the weights still match: only the resume check can tell
    assert detail(report, "final weights").passed
    assert detail(report, "every sample is seen once").passed


def test_every_rank_writing_the_checkpoint(tmp_path):
    path = mutant(tmp_path, LAB, ("    if rank == 0:  # the replicas are identical", "    if True:  # the replicas are identical"))
    report = check_lab(path, nproc=2, quiet=True)
    assert not report.passed
    # two writers race on one file: the run may even crash; either way the check names the writers
    assert any("ranks [0, 1] wrote into the checkpoint folder" in c.detail for c in report.failures)
