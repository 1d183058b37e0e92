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

from typer.core import TyperCommand

# The Context class typer's commands create: click.core.Context or typer._click.core.Context.
Context = TyperCommand.context_class
PACKAGE = Context.__module__.rpartition(".")[0]  # "click" or "typer._click"

_core = importlib.import_module(f"{PACKAGE}.core")
_exceptions = importlib.import_module(f"{PACKAGE}.exceptions")
_globals = importlib.import_module(f"{PACKAGE}.globals")

Command = _core.Command
Group = _core.Group
Option = _core.Option
ParameterSource = _core.ParameterSource
HelpFormatter = Context.formatter_class
ClickException = _exceptions.ClickException
UsageError = _exceptions.UsageError
get_current_context = _globals.get_current_context

__all__ = [
    "PACKAGE",
    "ClickException",
    "Command",
    "Context",
    "Group",
    "HelpFormatter",
    "Option",
    "ParameterSource",
    "UsageError",
    "get_current_context",
]
