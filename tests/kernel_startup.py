"""IPython startup file of the suite's notebook kernels (conftest.py copies it into the kernels' IPYTHONDIR):
check cells judge the solutions from recorded launches (tests/recorded_runs.py). Test machinery only."""
import sys as _sys

_sys.path.insert(0, __TESTS__)  # noqa: F821 (conftest.py writes the folder's path in)
import recorded_runs as _recorded_runs  # noqa: E402

_recorded_runs.install_in_kernel()
del _sys, _recorded_runs
