"""Seconds per named stage, summed: one timer for the exporters' checks and for edgefl's
ingest and fusion stages (edgefl imports it; it imports nothing of edgefl)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


@contextlib.contextmanager
def timed(timings: dict[str, float] | None, stage: str) -> Iterator[None]:
    """Add the block's wall seconds to timings[stage] (nothing when timings is None)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        if timings is not None:
            timings[stage] = timings.get(stage, 0.0) + time.perf_counter() - start


def add_times(into: dict[str, float] | None, more: dict[str, float]) -> None:
    """Sum another timings dict into `into` (per-worker dicts merged by one thread: a shared
    dict updated from several threads could lose an addition)."""
    if into is not None:
        for stage, seconds in more.items():
            into[stage] = into.get(stage, 0.0) + seconds
