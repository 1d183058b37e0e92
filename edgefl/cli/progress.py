"""The CLI's progress: bars on a terminal, plain lines with rate and ETA elsewhere (edgefl.progress).

Both go to stderr, so that stdout holds only the command's result (a table, or JSON with
--json). `--quiet` turns progress off (and the commands their summaries: edgefl.cli.common's
QUIET); warnings and errors are printed either way.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from edgefl.progress import LineReporter, NullReporter, Reporter, printable


class BarReporter:
    """One rich bar per task, drawn on a terminal; one-off messages print above the bars."""

    def __init__(self, console: Console):
        self.bars = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("[dim]{task.fields[note]}"),
            console=console,
            transient=False,
        )
        self.tasks: dict[str, TaskID] = {}

    def __call__(self, task: str, done: int, total: int, note: str = "") -> None:
        if task not in self.tasks:
            self.tasks[task] = self.bars.add_task(escape(printable(task)), total=total, note="")
        tid = self.tasks[task]
        self.bars.update(tid, completed=done, total=total, note=escape(printable(note)))
        if done >= total:
            self.tasks.pop(task)  # the finished bar stays; a task run again gets a new one

    def message(self, text: str) -> None:
        self.bars.console.print(printable(text), markup=False, highlight=False)


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


@contextlib.contextmanager
def reporter(quiet: bool = False, every: float = 5.0) -> Iterator[Reporter]:
    """What fits this run: nothing (--quiet), bars (stderr a terminal), or plain lines."""
    if quiet:
        yield NullReporter()
    elif stderr_is_terminal():
        bars = BarReporter(Console(stderr=True, highlight=False, emoji=False))
        with bars.bars:
            yield bars
    else:
        yield LineReporter(sys.stderr, every=every)
