"""What every CLI command shares: consoles, JSON output, and the one place errors become exit 2."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.console import Console

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

# Progress goes to stderr (bars on a terminal, a plain line every few seconds elsewhere).
QUIET = typer.Option(False, "--quiet", "-q", help="No progress on stderr (errors still print).")


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
