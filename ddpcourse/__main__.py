"""Command line: python -m ddpcourse
{run,check,status,hint,reset,cleanup,make-labs,make-clean,execute,doctor} ... (see README.md).
The console script ``ddpcourse`` (pyproject.toml) is the same command.

Each sub-command is one ``cmd_*`` function, set as the sub-parser's ``func``: it takes the parsed options
and returns the exit status. The functions import what they need when they run, so that ``status --line``
and ``hint`` never pay for importing torch (seconds) or the launcher's machinery they do not use.
"""
import argparse
import sys

from ddpcourse.launch.launcher import DEFAULT_TIMEOUT

RUN_EXAMPLE = """examples:
  python -m ddpcourse run labs/00_first_collectives.py --nproc 3
  python -m ddpcourse run labs/05_resilient_trainer.py --nproc 2 --max-restarts 1 -- --checkpoint-dir /tmp/ck
Arguments after -- are passed to the script."""


# ----------------------------------------------------------------------------- one function per command
def cmd_run(options):
    from ddpcourse.launch.launcher import run as launch
    try:
        result = launch(options.file, nproc=options.nproc, args=options.script_args, timeout=options.timeout,
                        show="rank0" if options.rank0 else "all", nnodes=options.nnodes,
                        torchrun_args=["--max-restarts", str(options.max_restarts)] if options.max_restarts else ())
    except KeyboardInterrupt:
        return 130
    return 0 if result.ok else (124 if result.timed_out else 1)


def cmd_check(options):
    from ddpcourse.checks import check_lab
    try:
        report = check_lab(options.file, nproc=options.nproc, timeout=options.timeout)
    except (FileNotFoundError, ValueError) as exc:
        print(f"check: {exc}", file=sys.stderr)
        return 2
    return 0 if report.passed else 1


def cmd_status(options):
    if options.line:
        from ddpcourse.learner.progress import room_line
        print(room_line(options.labs))
        return 0
    from ddpcourse.learner.progress import status
    try:
        status(options.labs, timeout=options.timeout)
    except KeyboardInterrupt:
        return 130
    return 0


def cmd_hint(options):
    from ddpcourse.learner.hints import reveal_hint
    try:
        print(reveal_hint(options.lab, options.todo))
    except (FileNotFoundError, ValueError) as exc:
        print(f"hint: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_reset(options):
    from ddpcourse.learner.progress import main_reset
    return main_reset(options.lab, options.labs)


def cmd_cleanup(options):
    from ddpcourse.launch.processes import end_leftover_runs
    end_leftover_runs(include_active=options.all)
    return 0


def cmd_make_labs(options):
    from ddpcourse.authoring.makelabs import make_labs
    stale = make_labs(check=options.check)
    return 1 if (options.check and stale) else 0


def cmd_make_clean(options):
    from ddpcourse.authoring.notebooks import make_clean
    stale = make_clean(check=options.check)
    return 1 if (options.check and stale) else 0


def cmd_execute(options):
    from ddpcourse.authoring.notebooks import execute
    return 0 if execute(options.notebooks) else 1


def cmd_doctor(options):
    from ddpcourse.learner.doctor import doctor
    return 0 if doctor().ok else 1


# ----------------------------------------------------------------------------- the parser
def build_parser():
    """The argument parser: one sub-parser per command, each with its ``cmd_*`` function as ``func``."""
    parser = argparse.ArgumentParser(prog="python -m ddpcourse", description="ddpcourse tools")
    sub = parser.add_subparsers(dest="command", required=True)
    defaults = argparse.ArgumentDefaultsHelpFormatter

    run = sub.add_parser("run", help="run a script on N local processes (torchrun, never hangs)",
                         usage="python -m ddpcourse run FILE [options] [-- ARGS...]",
                         epilog=RUN_EXAMPLE, formatter_class=type("Formatter", (defaults, argparse.RawDescriptionHelpFormatter), {}))
    run.add_argument("file")
    run.add_argument("--nproc", type=int, default=2, help="processes (ranks) per node")
    run.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds before every rank is stopped")
    run.add_argument("--rank0", action="store_true", help="show only rank 0's output")
    run.add_argument("--nnodes", type=int, default=1, help="torchrun agents ('nodes') on this machine, each --nproc ranks")
    run.add_argument("--max-restarts", type=int, default=0, help="torchrun restarts every rank up to this many times")
    run.set_defaults(func=cmd_run)

    check = sub.add_parser("check", help="run a lab and check its results", formatter_class=defaults)
    check.add_argument("file", help="a lab file (labs/, solutions/ or your own copy), or its number")
    check.add_argument("--nproc", type=int, default=None, help="one world size instead of the lab's list")
    check.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                       help="seconds each run may take before it is stopped")
    check.set_defaults(func=cmd_check)

    status = sub.add_parser("status", help="one table of every lab: not started / TODOs open / check fails / passes",
                            description="Labs whose TODOs are all done are checked once, on 2 ranks; "
                                        "`check` is the full verdict.")
    status.add_argument("--labs", default=None, help="the labs folder to look at (default: the course's labs/)")
    status.add_argument("--line", action="store_true",
                        help="one line for the room's shared document (00:edited 01:todo2 02:new ...), nothing launched")
    status.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds each check run may take (default: {DEFAULT_TIMEOUT:g})")
    status.set_defaults(func=cmd_status)

    hint = sub.add_parser("hint", help="the next hint of a lab's next open TODO (or of TODO k), one level at a time",
                          description="Level 1 is the idea (the TODO's comment), 2 the calls to use, "
                                      "3 where in solutions/ to look. The level reached is remembered per TODO.")
    hint.add_argument("lab", help="the lab's number, e.g. 00, or a lab file")
    hint.add_argument("todo", nargs="?", type=int, default=None, help="the TODO number (default: the first open one)")
    hint.set_defaults(func=cmd_hint)

    reset = sub.add_parser("reset", help="restore labs/NN_*.py to its generated state, saving your version beside it",
                           description="Your version is kept as labs/NN_name.saved-YYYYmmdd-HHMMSS.py.")
    reset.add_argument("lab", help="the lab's number, e.g. 03")
    reset.add_argument("--labs", default=None, help="the labs folder (default: the course's labs/)")
    reset.set_defaults(func=cmd_reset)

    cleanup = sub.add_parser("cleanup", help="end this user's left-over course runs (their notebook or terminal is gone)",
                             description="Finds the processes of course runs (ddpcourse run, run_lab, check) whose "
                                         "launcher is gone, ends them and lists what it ended.")
    cleanup.add_argument("--all", action="store_true", help="also end runs whose launcher still waits for them")
    cleanup.set_defaults(func=cmd_cleanup)

    make = sub.add_parser("make-labs", help="generate labs/ from solutions/ (course authors)")
    make.add_argument("--check", action="store_true", help="change nothing; exit 1 if labs/ is stale")
    make.set_defaults(func=cmd_make_labs)

    clean = sub.add_parser("make-clean", help="generate clean/ (learner copies, no outputs) from notebooks/")
    clean.add_argument("--check", action="store_true", help="change nothing; exit 1 if clean/ is stale")
    clean.set_defaults(func=cmd_make_clean)

    execute = sub.add_parser("execute", help="re-execute notebooks in place against solutions/, save them without "
                                             "widget state or timing metadata, regenerate their clean copies")
    execute.add_argument("notebooks", nargs="+", help="e.g. notebooks/00_start_here.ipynb")
    execute.set_defaults(func=cmd_execute)

    doctor = sub.add_parser("doctor", help="check this machine and environment for the course")
    doctor.set_defaults(func=cmd_doctor)
    return parser


def main(argv=None):
    """Parse ``argv`` (default: sys.argv[1:]), run the command, return its exit status. What follows ``--``
    is kept out of the parser, as ``options.script_args``: ``run`` passes it to the script untouched."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, script_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    options, unknown = parser.parse_known_args(ours)
    if unknown:
        hint = " (arguments for the script go after --)" if options.command == "run" else ""
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    options.script_args = script_args
    return options.func(options)


if __name__ == "__main__":
    sys.exit(main())
