"""The command line every linter in docs/lint/ shares: ``python docs/lint/<doc>.py --check [--root DIR]``.

Each problem is one line naming the file and the place; the exit code is 1 when there is any, else 0 after a
one-line summary of what was checked. Nothing is ever written: --check is the only mode, kept as a flag so that
the call reads as what it does (as make_answer_key.py's --check).
"""
import argparse
from pathlib import Path


def check(doc, problems, summary, default_root, argv=None):
    """Print every problem of ``problems(root)`` and return 1, or print ``summary(root)`` and return 0."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report the problems (the only mode: nothing is written)")
    parser.add_argument("--root", type=Path, default=default_root, help="the course to check (default: this one)")
    root = parser.parse_args(argv).root
    found = problems(root)
    for problem in found:
        print(problem)
    if found:
        return 1
    print(summary(root))
    return 0
