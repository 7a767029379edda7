"""Lab 05's check against realistic wrong trainers: each must fail with the message naming its mistake."""
from helpers import detail, wrong_version

LAB = "05_resilient_trainer.py"


SAVE = """        with open(temporary, "wb") as file:
            torch.save(state, file)"""


@wrong_version(LAB,
               ("    sampler.set_epoch(epoch)  #", "    pass  #"),
               ("    if not os.path.exists(path):\n        return 0", "    if True:\n        return 0"),
               (SAVE, SAVE.replace("open(temporary,", "open(path,")),
               ("        os.replace(temporary, path)", "        pass"), nproc=2)
def test_missing_set_epoch_resume_from_step_0_and_checkpoint_written_in_place(report):
    atomic = detail(report, "writes atomically")
    assert not atomic.passed and "checkpoint.pt itself was opened for writing" in atomic.detail
    assert "os.replace(temporary, path)" in atomic.detail
    order = detail(report, "new order")
    assert not order.passed and "call sampler.set_epoch(epoch)" in order.detail
    resume = detail(report, "resumed from the last checkpoint")
    assert not resume.passed and "started again from step 0" in resume.detail
    # retraining from scratch is deterministic, so the weights still match: only the resume check can tell
    assert detail(report, "final weights").passed
    assert detail(report, "every sample is seen once").passed


@wrong_version(LAB,
               ("            os.fsync(file.fileno())", "            pass"),
               ("    dist.barrier()  #", "    pass  #"),
               ('    model.module.load_state_dict(state["model"])',
                '    if dist.get_rank() == 0:\n        model.module.load_state_dict(state["model"])'), nproc=2)
def test_no_fsync_no_barrier_and_model_loaded_on_rank_0_only(report):
    atomic = detail(report, "writes atomically")
    assert not atomic.passed and "renamed onto checkpoint.pt without os.fsync" in atomic.detail
    waits = detail(report, "only once the checkpoint is written")
    assert not waits.passed and "rank 1 returned from save_checkpoint call" in waits.detail
    assert "dist.barrier()" in waits.detail
    resumed = detail(report, "identical at the end of the resumed run")
    assert not resumed.passed and "ranks [1]" in resumed.detail and "every rank must load" in resumed.detail
    assert detail(report, "only rank 0 writes").passed
    assert detail(report, "resumed from the last checkpoint").passed


@wrong_version(LAB, ("    if rank == 0:  # the replicas are identical", "    if True:  # the replicas are identical"), nproc=2)
def test_every_rank_writing_the_checkpoint(report):
    assert not report.passed
    # two writers race on one file: the run may even crash; either way the check names the writers
    assert any("ranks [0, 1] wrote into the checkpoint folder" in c.detail for c in report.failures)


@wrong_version(LAB, (SAVE + """  # torch.save flushes the file object when it is done
            os.fsync(file.fileno())  # the bytes are on the disk before a name points at them
        os.replace(temporary, path)  # atomic: a crash leaves the old checkpoint or the new one, never half""",
                    "        torch.save(state, path)"), nproc=1)
def test_torch_save_straight_onto_the_checkpoint(report):
    """torch.save(state, path) opens the file from C++, where no audit event reports it: the check still fails
    (one rank is enough: what rank 0 wrote, and how, is the evidence)."""
    atomic = detail(report, "writes atomically")
    assert not atomic.passed and "no file was renamed onto checkpoint.pt" in atomic.detail
    writers = detail(report, "only rank 0 writes")
    assert not writers.passed and "torch.save(state, path), which writes in place" in writers.detail


def test_slurm_template_is_valid_bash_and_launches_torchrun_per_node():
    import subprocess
    from ddpcourse.paths import COURSE_ROOT

    template = COURSE_ROOT / "notebooks" / "demos" / "05_slurm_torchrun.sbatch"
    syntax = subprocess.run(["bash", "-n", str(template)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    text = template.read_text()
    assert "#SBATCH --ntasks-per-node=1" in text  # one agent per node: torchrun starts the workers
    assert "srun torchrun" in text and "--rdzv-backend=c10d" in text and '--nnodes="$SLURM_NNODES"' in text
