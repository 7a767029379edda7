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


def _import_graph():
    """{module: modules of ddpcourse it imports}, read with ast from every file of the package, imports
    inside functions included (a lazy import still makes a cycle, only a later one)."""
    import ast

    from ddpcourse.paths import COURSE_ROOT

    package = COURSE_ROOT / "ddpcourse"
    modules = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(COURSE_ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from . import x, from .x import y
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[:len(anchor) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                # `from ddpcourse import diagnosis` imports the module ddpcourse.launch.diagnosis, not the package's code
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            else:
                continue
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def _cycle(graph):
    """One import cycle as [a, b, ..., a], or None."""
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, stack + [nxt])
                if found:
                    return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_the_package_has_no_import_cycle():
    graph = _import_graph()
    assert {"ddpcourse.authoring.todos", "ddpcourse.authoring.makelabs", "ddpcourse.learner.progress", "ddpcourse.__main__"} <= set(graph)
    assert "ddpcourse.authoring.todos" in graph["ddpcourse.authoring.makelabs"]  # the graph does see imports
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
