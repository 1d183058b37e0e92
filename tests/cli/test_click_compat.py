"""edgefl's click classes are the ones the installed typer is built from.

typer 0.29 carries its own copy of click (`typer._click`) with its own context stack: a help
context subclassed from the `click` package made every command fail with "There is no active
click context", and `click.UsageError` no longer caught typer's usage errors."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import typer.main
from typer.core import TyperCommand, TyperGroup
from typer.testing import CliRunner

from edgefl.cli import app
from edgefl.cli import click_compat as click

ROOT = Path(__file__).resolve().parents[2]


def test_the_shim_is_the_click_typer_is_built_on():
    assert click.Context is TyperCommand.context_class
    assert issubclass(TyperCommand, click.Command) and issubclass(TyperGroup, click.Command)
    assert click.HelpFormatter is click.Context.formatter_class
    assert issubclass(typer.BadParameter, click.UsageError)
    assert issubclass(click.UsageError, click.ClickException)


def _commands(command):
    yield command
    for sub in getattr(command, "commands", {}).values():
        yield from _commands(sub)


def test_every_command_makes_the_context_typer_reads():
    commands = list(_commands(typer.main.get_command(app)))
    assert len(commands) > 20
    for command in commands:
        assert isinstance(command, click.Command), command.name
        # typer's own class, not the shim's: the test stands even if the shim is wrong
        assert issubclass(command.context_class, TyperCommand.context_class), command.name
        assert issubclass(command.context_class.formatter_class, click.HelpFormatter)


def test_a_command_runs_and_sees_its_context():
    result = CliRunner().invoke(app, ["profile", "list"])
    assert result.exit_code == 0, result.output
    assert "There is no active click context" not in result.output


def test_a_usage_error_is_typers_and_reaches_a_json_caller():
    command = typer.main.get_command(app)
    with pytest.raises(click.UsageError):
        command.make_context("edgefl", ["--no-such-option"])
    result = CliRunner().invoke(app, ["profile", "list", "--json", "--no-such-option"])
    assert result.exit_code == 2
    out = result.stdout  # click < 8.2's runner mixes stderr (the usage text) in after it
    error, _ = json.JSONDecoder().raw_decode(out, out.index("{"))
    assert "no such option" in error["error"].lower() and "--help" in error["fix"]


def _imports_click(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        if any(name == "click" or name.startswith("click.") for name in names):
            return True
    return False


def test_nothing_imports_the_click_package_itself():
    # typer 0.29 does not depend on `click`: it may be absent, or another package's version.
    files = [*(ROOT / "edgefl").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    assert len(files) > 50
    assert [str(p.relative_to(ROOT)) for p in files if _imports_click(p)] == []
