"""Plant small mistakes in every solution and count how many the lab checks catch.

A solution region (### BEGIN SOLUTION .. ### END SOLUTION) should hold nothing the check could do
without: deleting any statement in it, or changing its reduction op, its divisor or its source rank,
must make the lab's check fail. For every statement of every region (found with `ast`, nested ones
too) this script writes a mutant copy of the solution with one such change and runs the lab's check
on it:

    delete     the statement becomes `pass`
    op         ReduceOp.SUM <-> AVG / MAX; an all_reduce with the default op gets op=AVG or op=MAX
    divisor    `/ world_size` becomes `/ 1` and `/ (world_size + 1)` (also /=, // and //=)
    source     src=0 becomes src=1 (any other src value becomes 0); `rank == 0` becomes `rank == 1`

It prints a table per lab: planted, caught, survived, and each survivor's statement and change.
It is slow (every check launches the lab on several world sizes, 3-4 s a launch; a caught mutant
usually costs one or two launches), so it is a measurement, not a test:

    python benchmarks/planted_changes.py --lab 05 [--jobs 2]
"""
import argparse
import ast
import concurrent.futures
import multiprocessing
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddpcourse.checks import check_lab  # noqa: E402
from ddpcourse.authoring.makelabs import BEGIN, END  # noqa: E402
from ddpcourse.paths import COURSE_ROOT, lab_files  # noqa: E402

REDUCE_OPS = {"SUM": ("AVG", "MAX"), "AVG": ("SUM",), "MAX": ("SUM",)}
REDUCING_CALLS = {"all_reduce", "reduce"}
COMPOUND = (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef, ast.ClassDef)


@dataclass
class Mutant:
    line: int          # the statement's first line in the solution
    statement: str     # its first line, stripped
    change: str        # what was planted
    text: str          # the whole mutated solution


def regions(lines):
    """(first, last) line numbers (1-based, inclusive) of the code inside each solution region."""
    found, start = [], None
    for number, line in enumerate(lines, start=1):
        if line.strip().startswith(BEGIN):
            start = number + 1
        elif line.strip().startswith(END):
            found.append((start, number - 1))
    return found


def statements_in_regions(tree, spans):
    inside = lambda node: any(a <= node.lineno and node.end_lineno <= b for a, b in spans)  # noqa: E731
    return [node for node in ast.walk(tree) if isinstance(node, ast.stmt) and inside(node)]


def _own_nodes(statement):
    """The expressions of `statement` itself: a compound statement's header, not its body."""
    if isinstance(statement, COMPOUND):
        roots = [getattr(statement, name) for name in ("test", "iter", "target") if hasattr(statement, name)]
        roots += [item.context_expr for item in getattr(statement, "items", [])]
    else:
        roots = [statement]
    return [node for root in roots for node in ast.walk(root)]


def _replace_span(lines, node, new):
    """`lines` with the source of `node` replaced by `new` (node positions: 1-based lines, byte columns)."""
    out = list(lines)
    first = out[node.lineno - 1].encode()
    last = out[node.end_lineno - 1].encode()
    merged = first[:node.col_offset].decode() + new + last[node.end_col_offset:].decode()
    out[node.lineno - 1:node.end_lineno] = [merged]
    return out


def _insert_before_close(lines, call, text):
    line = lines[call.end_lineno - 1].encode()
    out = list(lines)
    out[call.end_lineno - 1] = (line[:call.end_col_offset - 1] + text.encode() + line[call.end_col_offset - 1:]).decode()
    return out


def changes(statement, lines):
    """(description, mutated lines) for every planted change of one statement."""
    indent = " " * statement.col_offset
    deleted = list(lines)
    deleted[statement.lineno - 1:statement.end_lineno] = [f"{indent}pass  # planted: statement deleted\n"]
    yield "deleted", deleted
    for node in _own_nodes(statement):
        if isinstance(node, ast.Attribute) and node.attr in REDUCE_OPS and ast.unparse(node.value).endswith("ReduceOp"):
            for other in REDUCE_OPS[node.attr]:
                yield f"ReduceOp.{node.attr} -> {other}", _replace_span(lines, node, f"{ast.unparse(node.value)}.{other}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in REDUCING_CALLS \
                and not any(k.arg == "op" for k in node.keywords) and len(node.args) < 2:
            for other in ("AVG", "MAX"):
                yield f"default op (SUM) -> op=ReduceOp.{other}", _insert_before_close(lines, node, f", op=dist.ReduceOp.{other}")
        divisor = None
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv)):
            divisor = node.right
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Div, ast.FloorDiv)):
            divisor = node.value
        if divisor is not None:
            old = ast.unparse(divisor)
            for new in ("1", f"({old} + 1)"):
                yield f"divisor {old} -> {new}", _replace_span(lines, divisor, new)
        if isinstance(node, ast.keyword) and node.arg in ("src", "dst"):
            new = "1" if isinstance(node.value, ast.Constant) and node.value.value == 0 else "0"
            yield f"{node.arg}={ast.unparse(node.value)} -> {node.arg}={new}", _replace_span(lines, node.value, new)
        if isinstance(node, ast.Compare) and len(node.comparators) == 1 and ast.unparse(node.left) == "rank" \
                and isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value == 0:
            yield "rank == 0 -> rank == 1", _replace_span(lines, node.comparators[0], "1")


def mutants(solution):
    text = solution.read_text()
    lines = text.splitlines(keepends=True)
    tree = ast.parse(text)
    found = []
    for statement in sorted(statements_in_regions(tree, regions(lines)), key=lambda s: (s.lineno, s.col_offset)):
        for change, mutated in changes(statement, lines):
            new_text = "".join(mutated)
            ast.parse(new_text)  # every mutant must still be valid Python
            found.append(Mutant(statement.lineno, lines[statement.lineno - 1].strip(), change, new_text))
    return found


def caught(solution, mutant, timeout):
    """True if the lab's check fails on the mutant (and the failures' first line, for the log)."""
    with tempfile.TemporaryDirectory(prefix="planted-") as folder:
        path = Path(folder) / solution.name  # the check recognises the lab by its file name
        path.write_text(mutant.text)
        report = check_lab(path, timeout=timeout, quiet=True)
    first = report.failures[0] if report.failures else None
    return not report.passed, (f"{first.name}: {first.detail.splitlines()[0] if first.detail else ''}" if first else "")


def measure(solution, jobs, timeout):
    planted = mutants(solution)
    print(f"\n{solution.name}: {len(planted)} planted changes", flush=True)
    start = time.monotonic()
    # processes, not threads: each judgement seeds torch's global RNG to recompute expected values
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        verdicts = list(pool.map(caught, [solution] * len(planted), planted, [timeout] * len(planted)))
    survivors = []
    for mutant, (was_caught, why) in zip(planted, verdicts):
        print(f"  line {mutant.line:3d} {'caught  ' if was_caught else 'SURVIVED'} {mutant.change:38s} "
              f"{mutant.statement[:60]}" + (f"\n           -> {why[:150]}" if was_caught else ""), flush=True)
        if not was_caught:
            survivors.append(mutant)
    print(f"  {solution.name}: planted {len(planted)}, caught {len(planted) - len(survivors)}, "
          f"survived {len(survivors)} ({time.monotonic() - start:.0f} s)", flush=True)
    return len(planted), survivors


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lab", action="append", help="lab number (NN); repeat for several; default: all")
    parser.add_argument("--jobs", type=int, default=1, help="checks run at the same time (default 1)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per launch before it counts as a hang")
    parser.add_argument("--list", action="store_true", help="only list the planted changes")
    options = parser.parse_args()
    solutions = [s for s in lab_files(COURSE_ROOT / "solutions")
                 if not options.lab or s.name[:2] in options.lab]
    if options.list:
        for solution in solutions:
            for m in mutants(solution):
                print(f"{solution.name}:{m.line}: {m.change:38s} {m.statement}")
        return
    table = []
    for solution in solutions:
        planted, survivors = measure(solution, options.jobs, options.timeout)
        table.append((solution.name, planted, survivors))
    print("\n| lab | planted | caught | survived | survivors |\n|---|---|---|---|---|")
    for name, planted, survivors in table:
        names = "; ".join(f"line {m.line} `{m.statement[:50]}`: {m.change}" for m in survivors) or "none"
        print(f"| {name} | {planted} | {planted - len(survivors)} | {len(survivors)} | {names} |")


if __name__ == "__main__":
    main()
