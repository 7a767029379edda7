"""Notebook 02's demos in one launch: each rank imports torch and joins a process group once, not four times.

python -m ddpcourse run notebooks/demos/02_all_demos.py --nproc 2
Each demo also runs alone (see its docstring). Here they share one process group, and the run ends with
DDP's shape error on purpose (section 2 of the notebook): that step comes last.
"""
import runpy
from pathlib import Path

HERE = Path(__file__).parent

# First: it builds a model before the process group exists, then creates the group the others join.
seeds_and_wrap = runpy.run_path(str(HERE / "02_seeds_and_wrap.py"))
for demo in ("02_what_ddp_syncs.py", "02_custom_init.py", "02_source_patterns.py"):
    runpy.run_path(str(HERE / demo))
seeds_and_wrap["wrap_mismatched_shapes"]()  # ranks > 0 raise, which ends the run
