"""Every refusal edgefl raises says the fix (the standard: one message with the fix, exit 2).

Read from the source: each `raise ConfigError(...)` (and every other EdgeflError kind built at
the raise) passes a hint. 42 did not (2026-12-06: `--out x.txt`, a spec file that is not
JSON, an export that failed ...), and `--json` printed `"fix": null` for them."""

from __future__ import annotations

import ast
from pathlib import Path

import edgefl.errors as errors

ROOT = Path(__file__).resolve().parents[2]
# The kinds whose hint is the caller's to give (UnknownNameError and the like build their own).
KINDS = {
    name
    for name, value in vars(errors).items()
    if isinstance(value, type)
    and issubclass(value, errors.EdgeflError)
    and value.__init__ is errors.EdgeflError.__init__
}


def _raises_without_hint(source: str) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            func = node.exc.func
            name = getattr(func, "id", None) or getattr(func, "attr", None)
            given = len(node.exc.args) >= 2 or any(k.arg == "hint" for k in node.exc.keywords)
            if name in KINDS and not given:
                lines.append(node.lineno)
    return lines


def test_the_kinds_are_the_user_facing_errors():
    assert {"ConfigError", "ArtifactError", "DataError", "BudgetError", "FusionError"} <= KINDS


def test_every_raised_error_gives_its_fix():
    missing = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "edgefl").rglob("*.py"))
        for line in _raises_without_hint(path.read_text())
    ]
    assert not missing, "raised without hint= (say the fix): " + ", ".join(missing)


def test_the_scan_finds_a_raise_without_a_fix():
    assert _raises_without_hint('raise ConfigError("bad")') == [1]
    assert _raises_without_hint('raise ConfigError("bad", hint="do this")') == []
    assert _raises_without_hint('raise ValueError("internal")') == []
