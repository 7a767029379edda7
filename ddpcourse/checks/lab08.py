"""Checks for lab 08 (three broken trainers): each world size runs each trainer once, fixed (the learner's
TODOs), and judges from outside:
- the fixed trainer ran to the end (a hang or a crash fails here, with the launcher's verdict);
- its replicas agree after every step (the per-step weight checksums each rank reports);
- its final weights are those of the same training done in one process, computed here with torch alone
  (reference_weights): a fix that only silences the error (find_unused_parameters=True where the
  parameter is really missing from the loss) trains another model, and fails here;
- the diagnoses name the true cause: the rank, the collective or the parameter, the line (its code).
"""
import torch

from ddpcourse.checks import Check, LabCheck
from ddpcourse.toy import build_model, make_dataset

TRAINERS = ("hang", "crash", "diverge")
NPROCS = (1, 2, 3)
# the lab's config (solutions/08_broken_trainers.py), outside its TODOs: the reference trains the same way
SAMPLES, GLOBAL_BATCH, EPOCHS, LR, LOG_EVERY, SEED = 48, 12, 2, 0.05, 2, 0
TOLERANCE = 1e-5  # float32 sums in another order (N ranks' mean of means vs one mean): far below any bug's effect

TRUE_CAUSES = {
    "hang": {"rank": 0, "collective": "all_reduce", "line": "dist.all_reduce(total, group=log_group)"},
    "crash": {"rank": "every", "parameter": "out_scale", "line": "return self.head(hidden)"},
    "diverge": {"rank": 0, "first_step": 3, "line": "scheduler.step()"},
}
WHY = {  # what each field is found from, for the learner whose diagnosis misses it
    ("hang", "rank"): "the verdict's line under the error names the rank that waits in a collective of a group "
                      "the others never call; the first rank to raise is only the first to time out",
    ("hang", "collective"): "the op the flight recorder recorded for that rank (the verdict's 'failed in ...')",
    ("crash", "rank"): "DDP raises on every rank: each rank's forward leaves the same parameter out",
    ("crash", "parameter"): "the verdict's 'Parameters that got no gradient' (or TORCH_DISTRIBUTED_DEBUG=DETAIL)",
    ("diverge", "rank"): "the rank whose checksums part from the others' (the others agree among themselves)",
    ("diverge", "first_step"): "the first step after which the ranks' weight checksums differ (steps count from 1)",
}


def runs(workdir, nproc):
    return {trainer: {"args": ["--trainer", trainer]} for trainer in TRAINERS}


def _scaled_net():
    """The crash trainer's intended model: body, head, and a learned output scale (0.5 at the start)."""
    torch.manual_seed(SEED)
    body, head = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)
    model = torch.nn.ModuleDict({"body": body, "head": head})
    model.out_scale = torch.nn.Parameter(torch.tensor(0.5))
    return model, lambda x: head(torch.relu(body(x))) * model.out_scale


def reference_weights(trainer):
    """The trainer's final weights trained in one process, batch b = samples 12 b .. 12 b + 11, as intended."""
    dataset = make_dataset(samples=SAMPLES, seed=SEED)
    if trainer == "crash":
        model, forward = _scaled_net()
    else:
        model = build_model(SEED)
        forward = model
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    step = 0
    for _ in range(EPOCHS):
        for start in range(0, SAMPLES, GLOBAL_BATCH):
            x, y = dataset.tensors[0][start:start + GLOBAL_BATCH], dataset.tensors[1][start:start + GLOBAL_BATCH]
            loss = torch.nn.functional.mse_loss(forward(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if trainer == "diverge" and step % LOG_EVERY == 0:
                scheduler.step()
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


def _code(line):
    """A line's code as written in a diagnosis: without its comment and with its spaces normalized."""
    return " ".join(str(line).split("#")[0].split())


def _diagnosis_checks(trainer, written):
    truth, problems = TRUE_CAUSES[trainer], []
    written = written if isinstance(written, dict) else {}
    for field, expected in truth.items():
        got = written.get(field)
        if field == "line":
            right = _code(got) == _code(expected)
        elif field in ("collective", "parameter"):
            right = str(got).strip().lstrip(".").lower() == expected
        else:
            right = got == expected
        if not right:
            why = WHY.get((trainer, field), "the line whose code causes it, in the *_as_given code")
            problems.append(f"{field}: you wrote {got!r}: {why}")
    return Check(f"the {trainer} diagnosis names the true cause", not problems, "; ".join(problems))


def checks(runs):
    found = []
    for trainer in TRAINERS:
        run = runs[trainer]
        checksums = run.values("checksums")  # rank -> [after step 1, after step 2, ...]
        apart = [step + 1 for step in range(len(checksums[0])) if len({c[step] for c in checksums}) > 1]
        found.append(Check(f"the fixed {trainer} trainer's replicas agree after every step", not apart,
                           f"the ranks' weights differ from step {apart[0]} on (checksums per rank: "
                           f"{[c[apart[0] - 1] for c in checksums]})" if apart else ""))
        reference, weights = reference_weights(trainer), run.values("weights")[0]
        off = {name: float((torch.tensor(weights.get(name, float("nan"))) - value).abs().max())
               for name, value in reference.items()}
        worst = max(off, key=lambda name: off[name] if off[name] == off[name] else float("inf"))
        wrong = not off[worst] <= TOLERANCE  # NaN compares False: a NaN is wrong too
        found.append(Check(f"the fixed {trainer} trainer ends with the one-process weights", not wrong,
                           f"{worst} is {off[worst]:.3g} away from training the same batches in one process: "
                           "the fix must change what the trainer computes back to what was meant, not only "
                           "silence the error" if wrong else ""))
        found.append(_diagnosis_checks(trainer, run.values("diagnoses")[0].get(trainer)))
    return found


LAB_CHECK = LabCheck(judge=checks, nprocs=NPROCS, runs=runs)
