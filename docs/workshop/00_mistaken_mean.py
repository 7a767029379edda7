"""The mistaken lab: lab 00 with a wrong global_mean, for the projector (docs/instructors.md, "The mistaken lab").

    python -m ddpcourse check docs/workshop/00_mistaken_mean.py --nproc 2

This file shows none of lab 00's answers, so it can lie open on the projector before the room has done
the lab. It loads the course's solution of lab 00 (solutions/00_first_collectives.py) when it runs,
swaps that module's global_mean for the version below, and runs the solution's main(): the max and the
gather stay correct and pass, the mean fails. Ask the room what the FAIL line says before reading on.

The mistake: torch.mean of the tensor this rank holds is a mean over that tensor's elements (one loss),
not over the ranks. No collective runs, so every rank returns its own loss.
"""
import importlib.util
from pathlib import Path

import torch

COURSE_ROOT = Path(__file__).resolve().parents[2]
SOLUTION = COURSE_ROOT / "solutions" / "00_first_collectives.py"


def load_solution():
    """The solution of lab 00 as a module (its main() is not run on import)."""
    spec = importlib.util.spec_from_file_location("lab00_solution", SOLUTION)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mistaken_global_mean(value, world_size):
    """What a learner might write first: a mean, but of what this rank holds only."""
    return torch.mean(value)  # the mistake shown on the projector: no other rank's loss takes part


if __name__ == "__main__":
    lab = load_solution()
    lab.global_mean = mistaken_global_mean  # main() looks global_mean up in the solution's module
    lab.main()
