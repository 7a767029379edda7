"""The command line's structure: every sub-command dispatches through its own function."""
import argparse

from ddpcourse.__main__ import build_parser, main

COMMANDS = {"run", "check", "status", "hint", "reset", "cleanup", "make-labs", "make-clean", "execute", "doctor"}


def _subcommands(parser):
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


def test_every_subcommand_has_a_function():
    commands = _subcommands(build_parser())
    assert set(commands) == COMMANDS
    for name, sub in commands.items():
        assert callable(sub.get_default("func")), f"`{name}` has no func"
    assert len({sub.get_default("func") for sub in commands.values()}) == len(COMMANDS)  # one function each


def test_arguments_after_the_double_dash_go_to_the_script(monkeypatch):
    seen = {}

    def fake_run(options):
        seen.update(vars(options))
        return 0

    monkeypatch.setattr("ddpcourse.__main__.cmd_run", fake_run)
    assert main(["run", "x.py", "--nproc", "3", "--", "--help", "--nproc", "9"]) == 0
    assert seen["nproc"] == 3 and seen["script_args"] == ["--help", "--nproc", "9"]
