"""The `edgefl` console script. Loading the command takes a second or two (torch, onnx): Ctrl-C
then is one line and exit 130, as it is during the command's work, not a traceback of whichever
import it stopped."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from edgefl.cli import main as command
    except (KeyboardInterrupt, ImportError, SystemError) as exc:
        # A C extension's initialisation (onnxruntime's) turns the interrupt into an
        # ImportError "initialization failed" whose context is the KeyboardInterrupt (CI,
        # 2026-12-06): an interrupt is what it is wherever in the chain.
        if not _interrupted(exc):
            raise
        print("interrupted: nothing was started", file=sys.stderr)
        raise SystemExit(130) from None
    command()


def _interrupted(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 20:  # the chain, bounded
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False
