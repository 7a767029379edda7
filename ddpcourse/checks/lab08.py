"""Checks for lab 08 (three broken trainers): each world size runs each trainer once, fixed (the learner's
TODOs), and judges from outside:
- the fixed trainer ran to the end (a hang or a crash fails here, with the launcher's verdict);
- its replicas agree after every step (the per-step weight checksums each rank reports);
- its final weights are those of the same training done in one process, computed here with torch alone
  (reference): a fix that only silences the error (find_unused_parameters=True where the parameter is really
  missing from the loss) trains another model, and fails here;
- what it does besides the weights: the hang trainer logs, every LOG_EVERY steps on rank 0, the mean of the
  ranks' losses, which is the one-process loss of that step (a log line without the all_reduce logs rank 0's own
  loss); every rank's learning rate after every step is the schedule's (a scheduler stepped on rank 0 alone,
  hidden by a broadcast of rank 0's weights, keeps the weights right and the other ranks' rates wrong);
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
                      "the others never call; the first ranks to raise are only the first to time out (in the "
                      "default group's PG_TIMEOUT; the log group, made without timeout=, has torch's 30 minutes)",
    ("hang", "collective"): "the op the flight recorder recorded for that rank (the verdict's 'failed in ...')",
    ("crash", "rank"): "DDP raises on every rank: each rank's forward leaves the same parameter out",
    ("crash", "parameter"): "the verdict's 'Parameters that got no gradient' (or DDP's own message under "
                            "TORCH_DISTRIBUTED_DEBUG=INFO, or under DETAIL set by dist.set_debug_level after "
                            "init_process_group: DETAIL in the environment crashes DDP's constructor on gloo)",
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


def reference(trainer):
    """The trainer trained in one process, batch b = samples 12 b .. 12 b + 11, as intended: its final weights,
    the loss of every step (the mean of the ranks' losses, the ranks' batches being of one size) and the learning
    rate after every step."""
    dataset = make_dataset(samples=SAMPLES, seed=SEED)
    if trainer == "crash":
        model, forward = _scaled_net()
    else:
        model = build_model(SEED)
        forward = model
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    step, losses, learning_rates = 0, [], []
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
            losses.append(loss.item())
            learning_rates.append(optimizer.param_groups[0]["lr"])
    weights = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    return weights, losses, learning_rates


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


def _logged_means_check(run, losses):
    """Rank 0 logs, every LOG_EVERY steps, the mean of the ranks' losses (and prints it); no other rank logs."""
    logged = run.values("logged_means")  # rank -> [[step, mean], ...]
    expected = [[step, losses[step - 1]] for step in range(LOG_EVERY, len(losses) + 1, LOG_EVERY)]
    problem = ""
    if [step for step, _ in logged[0]] != [step for step, _ in expected]:
        problem = (f"rank 0 logged at steps {[step for step, _ in logged[0]]}, not every {LOG_EVERY} steps "
                   f"({[step for step, _ in expected]})")
    elif any(logged[1:]):
        problem = f"ranks {[r for r, means in enumerate(logged) if r and means]} log too: only rank 0 prints"
    else:
        off = [(step, mean, want) for (step, mean), (_, want) in zip(logged[0], expected)
               if not abs(mean - want) <= TOLERANCE * max(1.0, abs(want))]
        if off:
            step, mean, want = off[0]
            problem = (f"at step {step} rank 0 logged {mean:.6g} as the mean loss, but the ranks' losses average "
                       f"{want:.6g}: every rank's loss must go into the mean (the all_reduce), divided by the "
                       "world size")
        else:
            printed = set(run.output.get(0, []))
            missing = [step for step, mean in logged[0]
                       if not any(f"step {step}: mean loss {mean:.4f}" in line for line in printed)]
            if missing:
                problem = f"rank 0 returned the mean loss of steps {missing} but printed no log line for them"
    return Check("the fixed hang trainer logs the mean of the ranks' losses", not problem, problem)


def _learning_rates_check(run, learning_rates):
    """Every rank's learning rate after every step is the schedule's: the optimizers step alike."""
    found = run.values("learning_rates")  # rank -> [after step 1, ...]
    wrong = [(rank, step + 1, rates[step]) for rank, rates in enumerate(found) for step in range(len(rates))
             if rates[step] != learning_rates[step]]
    detail = ""
    if wrong:
        rank, step, rate = wrong[0]
        detail = (f"rank {rank}'s learning rate after step {step} is {rate:g}, the schedule's is "
                  f"{learning_rates[step - 1]:g}: whatever changes how a rank steps must run on every rank "
                  "(copying rank 0's weights afterwards hides it, and each rank's optimizer stays wrong)")
    return Check("every rank of the fixed diverge trainer steps at the schedule's learning rate", not wrong, detail)


def checks(runs):
    found = []
    for trainer in TRAINERS:
        run = runs[trainer]
        checksums = run.values("checksums")  # rank -> [after step 1, after step 2, ...]
        apart = [step + 1 for step in range(len(checksums[0])) if len({c[step] for c in checksums}) > 1]
        found.append(Check(f"the fixed {trainer} trainer's replicas agree after every step", not apart,
                           f"the ranks' weights differ from step {apart[0]} on (checksums per rank: "
                           f"{[c[apart[0] - 1] for c in checksums]})" if apart else ""))
        (intended, losses, learning_rates), weights = reference(trainer), run.values("weights")[0]
        off = {name: float((torch.tensor(weights.get(name, float("nan"))) - value).abs().max())
               for name, value in intended.items()}
        worst = max(off, key=lambda name: off[name] if off[name] == off[name] else float("inf"))
        wrong = not off[worst] <= TOLERANCE  # NaN compares False: a NaN is wrong too
        found.append(Check(f"the fixed {trainer} trainer ends with the one-process weights", not wrong,
                           f"{worst} is {off[worst]:.3g} away from training the same batches in one process: "
                           "the fix must change what the trainer computes back to what was meant, not only "
                           "silence the error" if wrong else ""))
        if trainer == "hang":
            found.append(_logged_means_check(run, losses))
        if trainer == "diverge":
            found.append(_learning_rates_check(run, learning_rates))
        found.append(_diagnosis_checks(trainer, run.values("diagnoses")[0].get(trainer)))
    return found


LAB_CHECK = LabCheck(judge=checks, nprocs=NPROCS, runs=runs)
