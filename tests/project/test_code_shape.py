"""The shape issue 35 set for the library (``edgefl/`` and ``exporters/``): no function over 60
lines (a CLI command's option declarations aside: its parameters are its flags) and none with a
cyclomatic complexity over 15, so that each one reads as one step."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("edgefl", "exporters")
LIMIT = 60
COMPLEXITY = 15


def _functions():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            cli = path.relative_to(ROOT).parts[:2] == ("edgefl", "cli")
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield f"{path.relative_to(ROOT)}:{node.lineno} {node.name}", node, cli


def _lengths():
    for name, node, cli in _functions():
        start = node.body[0].lineno if cli else node.lineno
        yield name, node.end_lineno - start + 1


def _own_nodes(function: ast.AST):
    """The nodes of ``function``'s body, nested functions, lambdas and classes left out (they
    are measured on their own)."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def complexity(function: ast.AST) -> int:
    """McCabe's count as radon takes it: one, plus one per branch point."""
    count = 1
    for node in _own_nodes(function):
        if isinstance(node, ast.If | ast.IfExp | ast.match_case | ast.Assert):
            count += 1
        elif isinstance(node, ast.For | ast.AsyncFor | ast.While):
            count += 1 + bool(node.orelse)
        elif isinstance(node, ast.Try):
            count += len(node.handlers) + bool(node.orelse)
        elif isinstance(node, ast.BoolOp):
            count += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            count += 1 + len(node.ifs)
    return count


def test_no_library_function_is_over_sixty_lines():
    long = {name: n for name, n in _lengths() if n > LIMIT}
    assert not long, f"split these into steps that return values: {long}"


def test_no_library_function_has_more_than_fifteen_paths():
    tangled = {name: c for name, node, _ in _functions() if (c := complexity(node)) > COMPLEXITY}
    assert not tangled, f"split these into steps that return values: {tangled}"


def test_the_measures_see_every_module():
    lengths = dict(_lengths())
    assert len(lengths) > 500 and max(lengths.values()) > 40  # it reads the real tree
    assert any(name.startswith("exporters/") for name in lengths)
    scores = [complexity(node) for _, node, _ in _functions()]
    assert max(scores) > 10


def test_the_complexity_counts_branches():
    source = """
def f(x, ys):
    if x and ys:
        for y in ys:
            try:
                x += y
            except ValueError:
                pass
    def inner(z):
        return z if z else 0
    return [y for y in ys if y]
"""
    f = ast.parse(source).body[0]
    # 1 + if + and + for + except + (comprehension + its if); inner's branch is its own
    assert complexity(f) == 7
    assert complexity(f.body[1]) == 2
