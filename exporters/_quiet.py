"""Keep third-party chatter (torch.onnx, onnxscript, onnxruntime.quantization) off the console."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings
from collections.abc import Iterator

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@contextlib.contextmanager
def quiet() -> Iterator[io.StringIO]:
    """Swallow prints, warnings and log records below ERROR; errors still raise normally.

    Measured on torch 2.13: each export logs "torchvision is not installed. Skipping ..." (4 lines,
    via torch's own log handler, which holds the real stderr, so redirecting sys.stderr alone does
    not catch them) plus a FutureWarning and a UserWarning; quantize_dynamic calls
    logging.warning() on the root logger.
    """
    buffer = io.StringIO()
    root = logging.getLogger()
    previous_disable = logging.root.manager.disable
    # logging.warning() runs basicConfig() when root has no handler, which would leave a handler
    # bound to our temporary stderr for the rest of the process; a NullHandler prevents that.
    guard = logging.NullHandler() if not root.handlers else None
    if guard is not None:
        root.addHandler(guard)
    logging.disable(logging.WARNING)
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(buffer),
            contextlib.redirect_stderr(buffer),
        ):
            warnings.simplefilter("ignore")
            yield buffer
    finally:
        logging.disable(previous_disable)
        if guard is not None:
            root.removeHandler(guard)


def one_line(exc: BaseException, limit: int = 300) -> str:
    """The actionable line of a (often multi-page, ANSI-coloured) exporter error."""
    text = _ANSI.sub("", str(exc))
    # The dynamo exporter puts the root cause under "## Exception summary" as "<class 'X'>: msg".
    match = re.search(r"<class '([\w.]+)'>: (.+)", text)
    if match:
        line = f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2).strip()}"
    else:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        line = lines[0] if lines else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."
