"""The command line: every sub-command dispatches through its own function, those that can answer without a
launch answer right; and the package has no import cycle (grimp, import-linter's graph)."""
import argparse

import grimp
import pytest

from ddpcourse.__main__ import build_parser, main

COMMANDS = {"run", "check", "status", "hint", "reset", "cleanup", "make-labs", "make-clean", "execute", "doctor"}


def _subcommands(parser):
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


# Each command with the least it needs: what build_parser accepts, nothing launched or written.
MINIMAL_ARGS = {"run": ["x.py"], "check": ["00"], "status": [], "hint": ["00"], "reset": ["00"], "cleanup": [],
                "make-labs": ["--check"], "make-clean": ["--check"], "execute": ["notebooks/x.ipynb"], "doctor": []}


def test_each_subcommand_dispatches_to_its_own_function(monkeypatch):
    """Structure: every command reaches its own cmd_* function, with its options parsed."""
    assert set(_subcommands(build_parser())) == COMMANDS == set(MINIMAL_ARGS)
    called = []
    for name in COMMANDS:
        function = "cmd_" + name.replace("-", "_")
        monkeypatch.setattr(f"ddpcourse.__main__.{function}", lambda options, f=function: called.append(f) or 0)
    for name, args in MINIMAL_ARGS.items():
        assert main([name, *args]) == 0
        assert called[-1] == "cmd_" + name.replace("-", "_"), name


@pytest.mark.parametrize("argv, code, says", [
    (["make-labs", "--check"], 0, "labs/ is up to date with solutions/"),
    (["run", "no_such_file.py"], 1, "FAILED: no_such_file.py does not exist"),
    (["check", "labs/99_x.py"], 2, "no such file: labs/99_x.py"),
    (["hint", "99"], 2, "no lab 99"),
    (["reset", "99"], 2, "there is no lab 99"),
])
def test_the_commands_answer_for_real(argv, code, says, capsys):
    """Behaviour, where a command answers without a launch and without writing: a broken command fails here
    (status, hint, reset, run, make-labs also have tests of their own; the doctor runs in test_start.py's
    quick start; make-clean --check in test_notebooks.py; execute whenever a notebook is re-executed)."""
    assert main(argv) == code
    captured = capsys.readouterr()
    assert says in captured.out + captured.err


def test_arguments_after_the_double_dash_go_to_the_script(monkeypatch):
    seen = {}

    def fake_run(options):
        seen.update(vars(options))
        return 0

    monkeypatch.setattr("ddpcourse.__main__.cmd_run", fake_run)
    assert main(["run", "x.py", "--nproc", "3", "--", "--help", "--nproc", "9"]) == 0
    assert seen["nproc"] == 3 and seen["script_args"] == ["--help", "--nproc", "9"]


def _import_cycle(graph):
    """One import cycle of a grimp graph (import-linter's, imports inside functions included: a lazy import
    still makes a cycle, only a later one) as [a, b, ..., a], or None."""
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            chain = graph.find_shortest_chain(importer=imported, imported=module)
            if chain:
                return [module, *chain]
    return None


def test_the_package_has_no_import_cycle():
    graph = grimp.build_graph("ddpcourse")
    assert {"ddpcourse.todos", "ddpcourse.authoring.makelabs", "ddpcourse.learner.progress", "ddpcourse.__main__"} <= graph.modules
    assert "ddpcourse.checks" in graph.find_modules_directly_imported_by("ddpcourse.learner.progress")  # a lazy import
    cycle = _import_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for importer, imported in (("a", "b"), ("b", "c"), ("c", "a")):
        graph.add_import(importer=importer, imported=imported)
    assert _import_cycle(graph) == ["a", "b", "c", "a"]
    graph.remove_import(importer="c", imported="a")
    assert _import_cycle(graph) is None
