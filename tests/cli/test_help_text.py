"""Every help page of every command is plain text: no rich-markup escape (`\\[default: mnist]`,
`\\[required]`) reaches the reader, and the defaults and required marks are still there."""

from __future__ import annotations

import pytest
import typer.main
from rich.markup import escape
from typer.testing import CliRunner

from edgefl.cli import app, plain_help
from edgefl.cli import click_compat as click


def command_paths(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [path]
    for name, sub in getattr(command, "commands", {}).items():
        out += command_paths(sub, (*path, name))
    return out


PATHS = command_paths(typer.main.get_command(app))


def test_the_tree_is_walked_whole():
    assert ("data", "partition") in PATHS and ("server", "fuse") in PATHS and ("demo",) in PATHS
    assert len(PATHS) > 20


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "edgefl")
def test_no_help_page_prints_a_markup_escape(path):
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "\\[" not in result.output, result.output
    assert "Usage:" in result.output


def test_defaults_and_required_marks_are_shown_plain():
    text = " ".join(CliRunner().invoke(app, ["data", "partition", "--help"]).output.split())
    assert "[default: mnist]" in text and "[default: dirichlet:0.5]" in text
    text = CliRunner().invoke(app, ["eval", "--help"]).output
    assert "[required]" in text
    # a mark wrapped over two lines is still one plain mark (click's range marks: below;
    # deploy's --eval-samples is checked by edgefl, which says which way to move, not by click)
    text = CliRunner().invoke(app, ["deploy", "--help"], env={"COLUMNS": "80"}).output
    assert "[default: 1000]" in " ".join(text.split())


@pytest.mark.parametrize(
    "inner", ["default: mnist", "required", "default: [a]", "default: C:\\\\", "x>=1", "1<=x<=5"]
)
def test_plain_help_undoes_rich_escape(inner):
    text = f"Some help.  [{inner}]"
    assert plain_help(escape(text)) == text
    assert plain_help(text) == text  # plain text passes unchanged


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "edgefl")
def test_every_argument_is_described_once(path):
    """typer 0.20 with click 8.5 lost every argument's help ("MODEL  [required]"); given back,
    click's own "Positional arguments:" section would have repeated typer's "Arguments:"."""
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert "Positional arguments:" not in result.output
    for param in command.params:
        if isinstance(param, click.Argument):
            assert param.help, f"{param.name} has no help"
            assert result.output.count(param.help.rstrip(".")) == 1, result.output
