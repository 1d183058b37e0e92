"""What every CLI command shares: consoles, JSON output, and the one place errors become exit 2."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterable
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.segment import Segment

from edgefl.bounds import Range
from edgefl.data.datasets import check_data_dir  # noqa: F401 (the commands import it here)
from edgefl.errors import ConfigError
from edgefl.progress import one_line, printable


class SafeConsole(Console):
    """A console whose text can never drive the terminal: every control character in what it
    renders is written as an escape (newlines and tabs kept). Rich's own styling and cursor
    moves are not text (they come from styles and control segments) and pass; an escape code
    in a file name, client id or reason quoted from an upload is shown, never obeyed, in every
    line and table of every command, whether or not its call site remembered. Markup is a
    separate matter: upload text is passed through rich.markup.escape where it is printed."""

    def print(self, *objects, **kwargs) -> None:
        # Strings before layout, so widths count the escapes (and rich's own stripping of
        # a few control codes does not silently drop them from what the operator sees).
        shown = (printable(o, lines=True) if isinstance(o, str) else o for o in objects)
        super().print(*shown, **kwargs)

    def render(self, renderable, options=None):  # the rest: tables and other renderables
        for seg in super().render(renderable, options):
            shown = seg.text if seg.control else printable(seg.text, lines=True)
            yield seg if shown == seg.text else Segment(shown, seg.style)


@contextlib.contextmanager
def narration_on_stderr(on: bool = True):
    """While on, what a command tells a person (`console`) goes to stderr, so that stdout holds
    only the JSON a `--json` caller parses."""
    if not on:
        yield
        return
    # `stderr`, not `file`: the console looks sys.stderr up as it writes (a test runner swaps
    # the streams), and setting it back leaves no stream of this call bound to the console.
    before = console.stderr
    console.stderr = True
    try:
        yield
    finally:
        console.stderr = before


def upload_text(text: object) -> str:
    """Text from an upload (a file name, client id, class name, a reason quoting its metadata)
    for a rich line: markup inert and every control character escaped, newlines included. The
    consoles keep the newlines of the program's own messages; only the call site knows which
    text is the upload's, so a file named "a\\nerror: ..." must pass through here to stay on
    its line."""
    return escape(printable(text))


# emoji=False: rich turns ":name:" into an emoji in any string it prints, so a file called
# "m:fire:.onnx" or a --calibrate "digits:train:..." would be shown as another name.
console = SafeConsole(highlight=False, emoji=False)
err_console = SafeConsole(stderr=True, highlight=False, emoji=False)

# Progress goes to stderr (bars on a terminal, a plain line every few seconds elsewhere).
# --quiet, the same on every command that has it: for scripts, whose files and exit code are
# the result; what needs a person's eye (a warning, an error) still prints, on stderr.
QUIET = typer.Option(
    False,
    "--quiet",
    "-q",
    help="Print nothing but warnings and errors (on stderr): no progress, no summary. The "
    "exit code says how it went; --json still prints its JSON.",
)
# --for's bounds, the same on `server fuse` and `simulate` (their --for texts name their outputs).
# The numbers are edgefl.server.classes' EPOCHS and SAMPLES, written here so that importing the
# CLI does not import the server (tests/server/test_for_classes.py holds them equal).
FOR_EPOCHS = typer.Option(20, help="--for: distillation epochs per class.")
FOR_SAMPLES = typer.Option(
    5000, help="--for: most transfer samples (the method's own, else inverted)."
)
FOR_MAX_MACS = typer.Option(
    None, help="--for: cap on a class model's MACs (a CPU server trains it)."
)


COUNT = Range(1, integer=True)


def check_counts(**counts: int | None) -> None:
    """Each count flag given (None: left to its default) is an integer >= 1; one below is told
    to raise it. Called before any work: `check_counts(batch_size=batch_size)`."""
    for name, value in counts.items():
        if value is not None:
            COUNT.check(f"--{name.replace('_', '-')}", value)


def print_quiet(warnings: Iterable[str] = (), errors: Iterable[str] = ()) -> None:
    """All --quiet prints: each error, then each warning, one line on stderr."""
    for e in errors:
        err_console.print(f"[red]error[/] {upload_text(one_line(e))}")
    for w in warnings:
        err_console.print(f"[yellow]warning[/] {upload_text(one_line(w))}")


def print_json(obj: Any) -> None:
    # Plain print: rich would wrap long lines and break machine parsing.
    sys.stdout.write(json.dumps(obj, indent=2, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, tuple | set):
        return list(o)
    raise TypeError(f"not JSON-serialisable: {type(o).__name__}")


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"


def fmt_count(n: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


# The help of every output option that creates missing parent folders says so.
MAKES_FOLDERS = " Missing folders are created."


def given(ctx: typer.Context, name: str) -> bool:
    """Whether option `name` (its parameter name) was typed on the command line."""
    from edgefl.cli.click_compat import ParameterSource

    return ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE


def applies_only_with(
    ctx: typer.Context,
    name: str,
    needed: str,
    present: bool,
    hint: str | None = None,
    why: str = "",
    flag: str | None = None,
) -> None:
    """Option `name` acts only with `needed` (a flag, or what it names): given without it,
    refused (it was passed over without a word); `why` is said in brackets; `flag`: how the
    option is spelt, where not --NAME (a --x/--no-x switch)."""
    if given(ctx, name) and not present:
        flag = flag or "--" + name.replace("_", "-")
        raise ConfigError(
            f"{flag} applies with {needed} only" + (f" ({why})" if why else ""),
            hint=hint or f"add {needed}, or drop {flag}",
        )


def check_for_flags(ctx: typer.Context, for_classes: str | None) -> None:
    """--for-epochs / --for-samples / --for-max-macs size the --for distillation only."""
    for name in ("for_epochs", "for_samples", "for_max_macs"):
        applies_only_with(ctx, name, "--for", for_classes is not None)


def distinct_names(text: str, flag: str, hint: str) -> tuple[str, ...]:
    """A comma-separated list of method names, each once: none at all (`''`, `','`) and one
    name twice are refused, each said."""
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    if not names or len(set(names)) != len(names):
        what = "no name" if not names else "a name twice"
        raise ConfigError(f"{flag} expects distinct names, got {what}: {text!r}", hint=hint)
    return names
