"""Notebook 03's demos in one launch: each rank imports torch and joins a process group once, not four times.

python -m ddpcourse run notebooks/demos/03_all_demos.py --nproc 2 -- /tmp/some_folder
The folder is 03_checkpoint.py's. Each demo also runs alone (see its docstring). Here they share one
process group, and the run ends with DDP's error on purpose: 03_freeze_after_wrapping.py comes last.
"""
import runpy
from pathlib import Path

HERE = Path(__file__).parent

for demo in ("03_edit_values.py", "03_change_model.py", "03_checkpoint.py", "03_freeze_after_wrapping.py"):
    runpy.run_path(str(HERE / demo))  # they read sys.argv as if run alone: the folder reaches 03_checkpoint.py
