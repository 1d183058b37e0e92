"""The `edgefl` command. Sub-commands live one module per noun; algorithms never live here."""

from __future__ import annotations

from edgefl.threads import share_cores_politely

# First thing at start, before this module's imports load numpy (OpenBLAS) and the commands
# load torch: they read the thread settings once, when they load. The console script imports
# this module before it calls main(); a spawned worker re-imports it as the script's module.
share_cores_politely()

import os  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import typer  # noqa: E402
from rich.markup import escape  # noqa: E402
from typer.core import TyperGroup  # noqa: E402

from edgefl.cli import click_compat as click  # noqa: E402 (the click typer is built on)
from edgefl.cli.common import err_console, print_json  # noqa: E402
from edgefl.cli.missing import missing_error  # noqa: E402
from edgefl.errors import ConfigError, EdgeflError  # noqa: E402


def report_error(exc: EdgeflError, as_json: bool = False) -> None:
    # Escape: messages quote user text and TOML tables like "[training]", not rich markup.
    err_console.print(f"[bold red]error:[/] {escape(exc.message)}")
    if exc.hint:
        err_console.print(f"  [bold]fix:[/] {escape(exc.hint)}")
    if as_json:  # a machine reading stdout gets the failure too, not an empty stream
        print_json({"error": exc.message, "fix": exc.hint})


def _usage_fix(exc: click.UsageError) -> str:
    command = exc.ctx.command_path if exc.ctx is not None else "edgefl"
    return f"see `{command} --help`"


# What rich.markup.escape makes of "[default: x]": typer escapes every help record's
# "[default: ...]" / "[required]" for rich markup even when help is plain click text.
_ESCAPED_TAG = re.compile(r"(\\*)\\(\[[a-z#/@][^[]*?\])")


def plain_help(text: str) -> str:
    """`text` with rich.markup.escape undone: backslashes before a tag halved back, the one
    it added before each "[" dropped."""
    return _ESCAPED_TAG.sub(lambda m: m.group(1)[: len(m.group(1)) // 2] + m.group(2), text)


class _PlainFormatter(click.HelpFormatter):
    def write_dl(self, rows, col_max=30, col_spacing=2):
        super().write_dl([(a, plain_help(b)) for a, b in rows], col_max, col_spacing)


class _PlainHelpContext(click.Context):
    formatter_class = _PlainFormatter


def _plain_help_everywhere(command: click.Command) -> None:
    """Every command of the tree formats its help with _PlainFormatter: the help is click's
    plain text here (rich_markup_mode=None), so a markup escape would be printed as is."""
    command.context_class = _PlainHelpContext
    click.restore_argument_help(command)
    for sub in getattr(command, "commands", {}).values():
        _plain_help_everywhere(sub)


def _repeated(group: click.Group, args: list[str]) -> ConfigError | None:
    """An option of one value given twice with two values (`eval --dataset mnist --dataset
    digits` evaluated digits; click keeps the last without a word), as the refusal."""
    cmd, i = _command_of(group, args)
    single = {
        name: p.opts[0]
        for p in cmd.params
        if isinstance(p, click.Option) and not (p.multiple or p.is_flag or p.count)
        for name in p.opts
    }
    seen: dict[str, str | None] = {}
    while i < len(args) and args[i] != "--":
        name, eq, value = args[i].partition("=")
        if name in single:
            if not eq:
                value, i = (args[i + 1] if i + 1 < len(args) else None), i + 1
            key = single[name]
            if seen.setdefault(key, value) != value:
                return ConfigError(
                    f"{key} given twice, as {seen[key]!r} and {value!r}", hint=f"give {key} once"
                )
        i += 1
    return None


def _command_of(group: click.Group, args: list[str]) -> tuple[click.Command, int]:
    """The sub-command `args` name and the index of its first own argument."""
    cmd: click.Command = group
    i = 0
    while isinstance(cmd, click.Group) and i < len(args) and args[i] in cmd.commands:
        cmd, i = cmd.commands[args[i]], i + 1
    return cmd, i


class _Group(TyperGroup):
    """Root group: the one place an EdgeflError becomes a message and exit code 2."""

    context_class = _PlainHelpContext

    def __init__(self, **attrs):
        super().__init__(**attrs)  # typer builds the sub-commands first, then their root
        for sub in self.commands.values():
            _plain_help_everywhere(sub)

    def parse_args(self, ctx, args):
        # Seen before any sub-command parses: an error in parsing or running it is still
        # reported as JSON to a caller that asked for JSON.
        ctx.meta["edgefl.json"] = (
            "--json" in args[: args.index("--")] if "--" in args else ("--json" in args)
        )
        ctx.meta["edgefl.repeated"] = _repeated(self, list(args))
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        try:
            if ctx.meta.get("edgefl.repeated"):
                raise ctx.meta["edgefl.repeated"]
            return super().invoke(ctx)
        except EdgeflError as exc:
            report_error(exc, as_json=ctx.meta.get("edgefl.json", False))
            raise typer.Exit(2) from None
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
            # A path the user named that cannot be read (`client sample missing.onnx`): their
            # error, one line, not a traceback. Commands check their inputs first where they
            # can; this is the net under the ones that read a path directly.
            what = f"{exc.filename}: " if exc.filename else ""
            err = ConfigError(
                f"cannot read {what}{exc.strerror or exc}",
                hint="check the path: an existing file you may read",
            )
            report_error(err, as_json=ctx.meta.get("edgefl.json", False))
            raise typer.Exit(2) from None
        except click.UsageError as exc:  # click prints it (exit 2); JSON callers get it too
            missing = missing_error(exc)
            if missing is not None:  # a required parameter left out: said with what it takes
                report_error(missing, as_json=ctx.meta.get("edgefl.json", False))
                raise typer.Exit(2) from None
            if ctx.meta.get("edgefl.json", False):
                print_json({"error": exc.format_message(), "fix": _usage_fix(exc)})
            raise
        except KeyboardInterrupt as exc:
            err_console.print(
                "[yellow]"
                + ("terminated" if isinstance(exc, Terminated) else "interrupted")
                + "[/]: finished outputs were kept, none half-written"
            )
            raise typer.Exit(143 if isinstance(exc, Terminated) else 130) from None


app = typer.Typer(
    cls=_Group,
    name="edgefl",
    help="One-shot federated learning for real edge devices.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # click's own help wraps every line at the terminal's width; rich's boxed help cut option
    # names and defaults at 80 columns (--max-classifier-..., smartphone:5,wris...).
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        from edgefl import __version__

        print(f"edgefl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """One-shot federated learning for real edge devices."""


def _register() -> None:
    # Explicit list: every sub-command module, in the order of the data's trip.
    from edgefl.cli import data_cmd, models_cmd, profile_cmd

    app.add_typer(profile_cmd.app, name="profile")
    models_cmd.register(app)
    app.add_typer(data_cmd.app, name="data")
    names = (
        "client_cmd",
        "server_cmd",
        "eval_cmd",
        "simulate_cmd",
        "reproduce_cmd",
        "search_cmd",
        "infer_cmd",
        "deploy_cmd",
        "audit_cmd",
    )
    for name in names:
        try:
            module = __import__(f"edgefl.cli.{name}", fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name != f"edgefl.cli.{name}":
                raise
            continue
        module.register(app)


_register()


class Terminated(KeyboardInterrupt):
    """SIGTERM (a service manager, `kill`): stopped as by Ctrl-C, so that temp files are
    removed and forked workers are ended on the way out instead of outliving the command."""


def _terminated(signum, frame) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)
    try:
        app(args=argv if argv is not None else sys.argv[1:])
    except KeyboardInterrupt as exc:  # while typer builds the command, before any work
        stopped = "terminated" if isinstance(exc, Terminated) else "interrupted"
        print(f"{stopped}: nothing was started", file=sys.stderr)
        raise SystemExit(143 if isinstance(exc, Terminated) else 130) from None
    except SystemExit as done:
        if done.code in (130, 143):
            _end_past_stray_threads(done.code)
        raise


def _end_past_stray_threads(code: int, grace: float = 3.0) -> None:
    """After an interrupt, a library's non-daemon thread would hold the interpreter at exit
    forever (Flower's simulation engine polls in one: `simulate --engine flower` hung after
    Ctrl-C, 2026-12-06). The command's own cleanup has run (every with-block unwound on the
    way here): the threads get `grace` seconds, then the process ends with its code."""
    deadline = time.monotonic() + grace
    for t in threading.enumerate():
        if t is not threading.current_thread() and not t.daemon:
            t.join(max(0.0, deadline - time.monotonic()))
    if any(
        t.is_alive() and not t.daemon
        for t in threading.enumerate()
        if t is not threading.current_thread()
    ):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
