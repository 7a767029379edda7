"""Test-suite settings shared by the unit tests and the notebooks (nbval).

Set before any notebook kernel starts (kernels inherit the environment): the notebooks' lab cells run
solutions/, whose outputs are the committed ones. A learner's run uses labs/.
"""
import os

os.environ["DDPCOURSE_LAB_SOURCE"] = "solutions"
