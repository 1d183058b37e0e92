"""A number outside its range, worded once: what the range is, what came, and which way to move.

Declared as data (scikit-learn's `Interval`): a `Range` checks a value, words the refusal
("--epochs must be >= 1, got 0: raise it") and gives the values just past each of its bounds,
so that tests generate the failures from the declarations instead of listing them by hand.
A fusion method's options are declared in edgefl.fusion.options, which words its own.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from edgefl.errors import ConfigError

RAISE, LOWER = "raise it", "lower it"


@dataclass(frozen=True)
class Range:
    """`low`/`high` bound a number (None: unbounded that way); `*_open`: the bound itself is not
    allowed; `integer`: only integers (numpy's too; never a bool)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False

    def text(self) -> str:
        """The range in words: 'an integer >= 1', '> 0', 'in [0, 1]', 'an integer in 2..12'."""
        noun = "an integer " if self.integer else ""
        lo, hi = self.low, self.high
        if lo is not None and hi is not None:
            if self.integer and not (self.low_open or self.high_open):
                return f"{noun}in {_num(lo)}..{_num(hi)}"
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"{noun}in {left}{_num(lo)}, {_num(hi)}{right}"
        if lo is not None:
            return f"{noun}{'>' if self.low_open else '>='} {_num(lo)}"
        if hi is not None:
            return f"{noun}{'<' if self.high_open else '<='} {_num(hi)}"
        return noun.strip() or "a number"

    def direction(self, value: Any) -> str:
        """RAISE for a number below the range, LOWER for one above it, "" for anything else
        (inside the range, not a number, not finite)."""
        if not _number(value) or not math.isfinite(value):
            return ""
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return RAISE
        if self.high is not None and (value >= self.high if self.high_open else value > self.high):
            return LOWER
        return ""

    def allows(self, value: Any) -> bool:
        if not _number(value) or (self.integer and not isinstance(value, numbers.Integral)):
            return False
        return math.isfinite(value) and not self.direction(value)

    def problem(self, name: str, value: Any) -> str | None:
        """None if `value` is in range, else the sentence that refuses it, ending in the way to
        move it where there is one: "--epochs must be >= 1, got 0: raise it"."""
        if self.allows(value):
            return None
        move = self.direction(value)
        if self.integer and _number(value) and math.isfinite(value) and not move:
            return f"{name} must be an integer, got {value}"  # 6.0: in range, not an int
        text = self.text() if move or self.integer else f"a finite number {self.text()}".strip()
        got = str(value) if _number(value) else repr(value)
        return f"{name} must be {text}, got {got}" + (f": {move}" if move else "")

    def check(
        self,
        name: str,
        value: Any,
        *,
        hint: str | None = None,
        below: str | None = None,
        above: str | None = None,
    ) -> None:
        """Raise ConfigError if `value` is out of range. The fix offered: `below`/`above` for a
        value on that side, else `hint` (default: none beyond the message's own "raise it" or
        "lower it")."""
        problem = self.problem(name, value)
        if problem is not None:
            move = self.direction(value)
            side = below if move == RAISE else above if move == LOWER else None
            raise ConfigError(problem, hint=side or hint)

    def outside(self) -> list[tuple[float, str]]:
        """A value just past each bound and the way it must move: for tests."""
        step = 1
        past = []
        if self.low is not None:
            past.append((self.low if self.low_open else self.low - step, RAISE))
        if self.high is not None:
            past.append((self.high if self.high_open else self.high + step, LOWER))
        return [(int(v) if self.integer else v, move) for v, move in past]


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)
