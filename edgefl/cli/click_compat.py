"""click, as the installed typer uses it.

typer up to 0.2x builds its commands on the `click` package; newer typer (0.29 here) carries
its own copy as `typer._click` and does not depend on `click` at all. The two copies keep
separate context stacks and exception classes: a Context subclassed from `click` is never the
current context of a typer command (every command failed "There is no active click context"),
and `click.UsageError` does not catch typer's. So every click class edgefl subclasses, catches
or names comes from here: the package typer's own commands are built from.
"""

from __future__ import annotations

import importlib
import inspect

from typer.core import TyperCommand

# The Context class typer's commands create: click.core.Context or typer._click.core.Context.
Context = TyperCommand.context_class
PACKAGE = Context.__module__.rpartition(".")[0]  # "click" or "typer._click"

_core = importlib.import_module(f"{PACKAGE}.core")
_exceptions = importlib.import_module(f"{PACKAGE}.exceptions")
_globals = importlib.import_module(f"{PACKAGE}.globals")

Argument = _core.Argument
Command = _core.Command
Group = _core.Group
Option = _core.Option
Parameter = _core.Parameter
ParameterSource = _core.ParameterSource
HelpFormatter = Context.formatter_class
ClickException = _exceptions.ClickException
UsageError = _exceptions.UsageError
MissingParameter = _exceptions.MissingParameter
get_current_context = _globals.get_current_context


def restore_argument_help(command: Command) -> None:
    """Give each positional argument of `command` back the help its declaration wrote.

    typer's TyperArgument sets `help` before it calls click's Argument.__init__, which (since
    click's Parameter took `help` itself, 8.5 here with typer 0.20) sets it again to None: every
    ARGUMENT line of `--help` was bare ("MODEL  [required]"). Where typer kept it, nothing
    changes. typer writes the arguments' section itself ("Arguments:"); click's own
    ("Positional arguments:", 8.5) would repeat it once they have help, so it is left out."""
    signature = inspect.signature(command.callback) if command.callback else None
    for param in command.params:
        declared = signature.parameters.get(param.name) if signature and param.name else None
        text = getattr(getattr(declared, "default", None), "help", None)
        if isinstance(param, Argument) and not getattr(param, "help", None) and text:
            param.help = text
    if hasattr(Command, "format_arguments") and isinstance(command, TyperCommand):
        command.format_arguments = lambda ctx, formatter: None


__all__ = [
    "Argument",
    "PACKAGE",
    "ClickException",
    "Command",
    "Context",
    "Group",
    "HelpFormatter",
    "MissingParameter",
    "Option",
    "Parameter",
    "ParameterSource",
    "UsageError",
    "get_current_context",
    "restore_argument_help",
]
