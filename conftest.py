"""Test-suite settings shared by the unit tests and the notebooks (nbval).

The notebooks' lab cells run solutions/ (DDPCOURSE_LAB_SOURCE=solutions, the instructors' demo mode of
docs/instructors.md), so their outputs are the committed ones. Set here, before any notebook kernel starts:
kernels inherit the environment. A learner's run uses labs/ (tests/test_learner_path.py).
"""
import os

os.environ["DDPCOURSE_LAB_SOURCE"] = "solutions"

# clean/ holds the learners' copies: no outputs to compare, and a learner's saved run must not become a test.
collect_ignore = ["clean"]
