"""The `edgefl` console script. Loading the command takes a second or two (torch, onnx): Ctrl-C
then is one line and exit 130, as it is during the command's work, not a traceback of whichever
import it stopped."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from edgefl.cli import main as command
    except KeyboardInterrupt:
        print("interrupted: nothing was started", file=sys.stderr)
        raise SystemExit(130) from None
    command()
