"""The shape issue 35 set for the library: no function over 60 lines (a CLI command's option
declarations aside: its parameters are its flags), so that each one reads as one step."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 60


def _lengths():
    for path in sorted((ROOT / "edgefl").rglob("*.py")):
        cli = "cli" in path.relative_to(ROOT / "edgefl").parts[:1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                start = node.body[0].lineno if cli else node.lineno
                yield f"{path.relative_to(ROOT)}:{node.lineno} {node.name}", (
                    node.end_lineno - start + 1
                )


def test_no_library_function_is_over_sixty_lines():
    long = {name: n for name, n in _lengths() if n > LIMIT}
    assert not long, f"split these into steps that return values: {long}"


def test_the_measure_sees_every_module():
    lengths = dict(_lengths())
    assert len(lengths) > 500 and max(lengths.values()) > 40  # it reads the real tree
