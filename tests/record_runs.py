"""Record every launch the suite replays afresh (tests/recorded_runs.py), after an edit made them stale.

    python3 tests/record_runs.py

First the lab tests' and the check cells' launches, with the notebooks under rotation 0; then the notebooks
under rotations 1, 2 and 3, so that each notebook's own launches are recorded under all four settings of
tests/kernel_settings.py, each while its notebook's asserts and nbval judge it. About 25 minutes on 2 cores.
"""
import os
import subprocess
import sys
from pathlib import Path

COURSE = Path(__file__).resolve().parent.parent


def record(rotation, *targets):
    command = [sys.executable, str(COURSE / "start.py"), "test", *targets, "--record-runs"]
    print(f"record_runs.py: rotation {rotation}: {' '.join(command[2:])}", flush=True)
    return subprocess.run(command, cwd=COURSE, env=dict(os.environ, DDPCOURSE_TESTS_ROTATION=str(rotation))).returncode


def main():
    lab_tests = sorted(path.relative_to(COURSE).as_posix() for path in (COURSE / "tests").glob("test_lab*.py"))
    failed = record(0, *lab_tests, "tests/test_checks.py", "notebooks")
    for rotation in (1, 2, 3):
        failed = record(rotation, "notebooks") or failed
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
