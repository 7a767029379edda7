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


def test_slurm_template_is_valid_bash_and_launches_torchrun_per_node():
    import subprocess
    from ddpcourse.paths import COURSE_ROOT

    template = COURSE_ROOT / "notebooks" / "demos" / "05_slurm_torchrun.sbatch"
    syntax = subprocess.run(["bash", "-n", str(template)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    text = template.read_text()
    assert "#SBATCH --ntasks-per-node=1" in text  # one agent per node: torchrun starts the workers
    assert "srun torchrun" in text and "--rdzv-backend=c10d" in text and '--nnodes="$SLURM_NNODES"' in text
