"""IPython startup file of the suite's notebook kernels (conftest.py copies it into the kernels' IPYTHONDIR):
check cells judge the solutions, and the notebooks' other launches replay, from recorded launches
(tests/recorded_runs.py). Test machinery only."""
import os as _os
import sys as _sys

# The notebooks' lab cells run solutions/ in the suite (the committed outputs are the solutions'); only this
# kernel's process is told so, not the pytest process that started it.
_os.environ["DDPCOURSE_LAB_SOURCE"] = "solutions"

_sys.path.insert(0, __TESTS__)  # noqa: F821 (conftest.py writes the folder's path in)
import recorded_runs as _recorded_runs  # noqa: E402

_recorded_runs.install_in_kernel()
del _os, _sys, _recorded_runs
