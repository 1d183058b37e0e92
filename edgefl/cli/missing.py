"""A required option or argument left out, said as one message: what it wants, an example, and
the names to choose from where a registry holds them (click's "Missing option '--profile'" named
none, and under --json its fix was "see --help")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edgefl.cli import click_compat as click
from edgefl.errors import ConfigError


def _profiles() -> list[str]:
    from edgefl.profiles import list_profiles

    return list_profiles()


def _datasets() -> list[str]:
    from edgefl.data.registry import DATASETS

    return DATASETS.names()


def _targets() -> list[str]:
    from edgefl.deploy.targets import TARGETS

    return list(TARGETS)


def _methods() -> list[str]:
    from edgefl.fusion import METHODS

    return sorted(METHODS.names())


@dataclass(frozen=True)
class Wanted:
    """What a required parameter takes: an example, and the registry it names (if any)."""

    example: str  # "wristband or a profile TOML file"
    kind: str = ""  # "built-in profiles": how the registry's names are introduced
    names: Callable[[], list[str]] | None = None  # read only when the parameter is missing
    see: str = ""  # the command that says more


# Keyed by the parameter's name; a required parameter not here is said with its help and usage.
WANTED: dict[str, Wanted] = {
    "profile": Wanted("wristband or a profile TOML file", "built-in profiles", _profiles),
    "dataset": Wanted(
        "mnist:test or an .npz file",
        "datasets",
        _datasets,
        "`edgefl data list` says which are here",
    ),
    "public": Wanted("mnist:public, or an .npz with x"),
    "target": Wanted("tflite-micro", "deploy targets", _targets),
    "out": Wanted("deployed/wristband"),
    "input_path": Wanted("images.npy (a decoder: labels.npy)"),
    "method": Wanted(
        "fedmho or --method fedavg,fedmho-md",
        "valid fusion methods",
        _methods,
        "`edgefl server methods` says what each consumes",
    ),
}


def _what(param: click.Parameter) -> str:
    """The parameter's help as a clause: "Profile name or TOML path." -> "profile name or ..."."""
    text = (getattr(param, "help", None) or "").strip().rstrip(".")
    return text[:1].lower() + text[1:] if text else "a value"


def missing_error(exc: click.UsageError) -> ConfigError | None:
    """click's MissingParameter as edgefl's message; None for any other usage error, or where
    click named no parameter."""
    param, ctx = getattr(exc, "param", None), exc.ctx
    if not isinstance(exc, click.MissingParameter) or param is None or ctx is None:
        return None
    command = ctx.command_path.removeprefix(ctx.find_root().info_name or "").strip()
    is_option = isinstance(param, click.Option)
    name = max(param.opts, key=len) if is_option else param.human_readable_name
    message = f"{command} needs {name}: {_what(param)}"
    wanted = WANTED.get(param.name or "")
    if wanted is None:
        usage = " ".join(ctx.command.collect_usage_pieces(ctx))
        return ConfigError(message, hint=f"usage: {ctx.command_path} {usage}")
    hint = f"e.g. {name if is_option else ctx.command_path} {wanted.example}"
    if wanted.names is not None:
        hint += f"; {wanted.kind}: {', '.join(wanted.names())}"
    if wanted.see:
        hint += f" ({wanted.see})"
    return ConfigError(message, hint=hint)
