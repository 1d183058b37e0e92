"""Progress of long work, shown whatever the output is.

Work reports `progress(task, done, total, note)` (a plain callable, so lower layers need no
import from here) and one-off `message(text)` lines. A reporter turns them into what fits the
output: `LineReporter` writes plain lines with rate and ETA to a stream (a log, CI, `--json`
runs: stderr, so JSON on stdout stays clean), at most one every few seconds plus each task's
last step; the CLI's terminal reporter draws bars instead (edgefl.cli.progress); `NullReporter`
is `--quiet`. Control characters are shown escaped (an upload's names may reach these lines).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Protocol, TextIO

ProgressFn = Callable[..., None]  # (task: str, done: int, total: int, note: str = "")


class Reporter(Protocol):
    def __call__(self, task: str, done: int, total: int, note: str = "") -> None: ...

    def message(self, text: str) -> None: ...


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7F, 0xA0)] if c not in (0x09,)}


_CONTROL_LINES = {c: e for c, e in _CONTROL.items() if c != 0x0A}


def printable(text: str, lines: bool = False) -> str:
    """`text` with every control character written as an escape (`lines`: but its newlines
    kept): an upload's names may reach these lines, and they must never move the cursor or
    recolour the operator's terminal."""
    return str(text).translate(_CONTROL_LINES if lines else _CONTROL)


def one_line(text: str) -> str:
    """A message of several lines (a refusal listing the uploads it went without) as one, its
    lines joined by "; ": for a line of -q output or a table cell."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def log_lines(log, text: str) -> None:
    """`text` logged line by line: a log line escapes control characters, a newline inside one
    included (shown as \\x0a); a message's own lines (the uploads a method went without, each
    name escaped where it was written) stay lines."""
    for line in text.splitlines():
        log(line)


def no_progress(task: str, done: int, total: int, note: str = "") -> None:
    """The progress callable of work nobody watches."""


def fmt_seconds(s: float) -> str:
    s = max(0, round(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class _Clock:
    """Per-task start times and rates: a task starts at its first report."""

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.started: dict[str, tuple[float, int]] = {}

    def rate_eta(self, task: str, done: int, total: int) -> tuple[float | None, float | None]:
        now = self.clock()
        t0, d0 = self.started.setdefault(task, (now, done))
        if done <= d0 or now <= t0:
            return None, None
        rate = (done - d0) / (now - t0)
        return rate, max(0.0, (total - done) / rate)

    def forget(self, task: str) -> None:
        self.started.pop(task, None)


def describe(
    task: str, done: int, total: int, rate: float | None, eta: float | None, note: str = ""
) -> str:
    """`fedmho epoch 3/10 (0.8/s, about 9 s left): loss 0.2345`."""
    text = f"{task} {done}/{total}"
    if done >= total:
        text += " done"
    elif rate is not None and eta is not None:
        speed = f"{rate:.2f}/s" if rate < 10 else f"{rate:.0f}/s"
        text += f" ({speed}, about {fmt_seconds(eta)} left)"
    return f"{text}: {note}" if note else text


class LineReporter:
    """Plain progress lines on a stream: at most one per `every` seconds (whatever the task),
    plus the last step of every task, so a log is neither silent nor flooded."""

    def __init__(
        self,
        stream: TextIO | None = None,
        every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.stream = stream
        self.every = every
        self.clock = _Clock(clock)
        self.last: float | None = None

    def _write(self, line: str) -> None:
        stream = self.stream or sys.stderr
        stream.write(printable(line) + "\n")
        stream.flush()

    def __call__(self, task: str, done: int, total: int, note: str = "") -> None:
        rate, eta = self.clock.rate_eta(task, done, total)
        now = self.clock.clock()
        finished = done >= total
        if finished or done > 0 and (self.last is None or now - self.last >= self.every):
            self.last = now
            self._write(describe(task, done, total, rate, eta, note))
        if finished:
            self.clock.forget(task)

    def message(self, text: str) -> None:
        self._write(text)


class NullReporter:
    """`--quiet`: nothing."""

    def __call__(self, task: str, done: int, total: int, note: str = "") -> None:
        pass

    def message(self, text: str) -> None:
        pass
