"""The one constraint system every config a user sets is checked by (scikit-learn's
`_param_validation`): constraints as data, declared on the config's fields, worded once.

- `Range` bounds a number and words its refusal with the way to move ("--epochs must be >= 1,
  got 0: raise it"); `OneOf` names the allowed values.
- `declare(constraint, default)` puts a constraint on a dataclass field (its flag, the fix to
  offer, whether None means unset); the config's `__post_init__` calls `check_fields(self)`.
  A fusion method's options are declared with `edgefl.fusion.options.option`, whose `Opt`
  checks through the same constraints and reports them the same way (`__rules__`).
- `@declared(**example)` registers a config class with a valid example, and `invalid_values`
  generates a value past every bound and outside every choice of every field: one test
  (tests/project/test_constraints.py) refuses them all through every registered class.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field, fields
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
            # every refusal says how to fix it: the nearest allowed count, else the range itself
            example = self._nearest(move)
            default = (
                f"e.g. {name} {example} ({self.text()})"
                if example is not None
                else f"give {name} a value that is {self.text()}"
            )
            raise ConfigError(problem, hint=side or hint or default)

    def _nearest(self, move: str) -> int | None:
        """The allowed integer nearest a value out of range on side `move` (None: not an
        integer range, or unbounded on that side)."""
        if not self.integer:
            return None
        if move == RAISE and self.low is not None:
            return int(self.low) + (1 if self.low_open else 0)
        if move == LOWER and self.high is not None:
            return int(self.high) - (1 if self.high_open else 0)
        return None

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


@dataclass(frozen=True)
class OneOf:
    """One of `choices` (names, or numbers such as a kernel size); never a bool for a number."""

    choices: tuple

    def text(self) -> str:
        return "one of " + ", ".join(str(c) for c in self.choices)

    def direction(self, value: Any) -> str:
        return ""  # no way to move a name

    def allows(self, value: Any) -> bool:
        return not isinstance(value, bool) and value in self.choices

    def problem(self, name: str, value: Any) -> str | None:
        return None if self.allows(value) else f"{name} must be {self.text()}, got {value!r}"

    def check(self, name: str, value: Any, *, hint: str | None = None, **_: Any) -> None:
        problem = self.problem(name, value)
        if problem is not None:
            raise ConfigError(problem, hint=hint or f"e.g. {name} {self.choices[0]}")

    def outside(self) -> list[tuple[Any, str]]:
        """A value of the choices' type that is none of them: for tests."""
        if all(_number(c) for c in self.choices):
            return [(max(self.choices) + 1, "")]
        return [("no-such-" + "-".join(str(c) for c in self.choices[:1]), "")]


Constraint = Range | OneOf


@dataclass(frozen=True)
class Rule:
    """A field's constraint, the flag its refusal names (None: --field-name), the fix it offers
    ("{flag}" in it: the flag) and whether None is a valid value (unset: a default applies)."""

    constraint: Constraint
    flag: str | None = None
    hint: str | None = None
    nullable: bool = False

    def check(self, name: str, value: Any) -> None:
        if value is None and self.nullable:
            return
        flag = self.flag or "--" + name.replace("_", "-")
        hint = self.hint.replace("{flag}", flag) if self.hint else None
        self.constraint.check(flag, value, hint=hint)


def declare(
    constraint: Constraint,
    default: Any = MISSING,
    *,
    flag: str | None = None,
    hint: str | None = None,
    nullable: bool | None = None,
) -> Any:
    """A dataclass field with its constraint: `epochs: int = declare(Range(1, integer=True))`.
    A default of None makes it nullable unless `nullable=False` says otherwise."""
    unset = default is None if nullable is None else nullable
    return field(default=default, metadata={"rule": Rule(constraint, flag, hint, unset)})


def rules(cls: Any) -> dict[str, Rule]:
    """Field name -> Rule of a config class (or instance): its declared fields, or what its
    own `__rules__` reports (a fusion config's options)."""
    own = getattr(cls, "__rules__", None)
    if own is not None:
        return own()
    return {f.name: f.metadata["rule"] for f in fields(cls) if "rule" in f.metadata}


def check_fields(obj: Any) -> None:
    """Raise ConfigError for the first field of `obj` its declaration refuses."""
    for name, rule in rules(obj).items():
        rule.check(name, getattr(obj, name))


# Config class -> a valid example of it; filled by @declared, read by the one invalid-value test.
DECLARED: dict[type, Callable[[], Any]] = {}


def declared(**example: Any) -> Callable[[type], type]:
    """Register a config class with the keyword arguments of one valid instance."""

    def register(cls: type) -> type:
        DECLARED[cls] = lambda: cls(**example)
        return cls

    return register


def invalid_values(cls: Any) -> Iterator[tuple[str, Any, str, str]]:
    """(field, a value its constraint refuses, the flag the refusal names, the way to move it)
    for every bound and choice of every declared field; plus a non-integer for an integer and
    None for a field that may not be unset."""
    for name, rule in rules(cls).items():
        flag = rule.flag or "--" + name.replace("_", "-")
        for value, move in rule.constraint.outside():
            yield name, value, flag, move
        c = rule.constraint
        if isinstance(c, Range) and c.integer:
            inside = c.low if c.low is not None and not c.low_open else 1
            yield name, inside + 0.5 if c.allows(inside) else 0.5, flag, ""
        if not rule.nullable:
            yield name, None, flag, ""


SEED = Range(0, 2**63 - 1, integer=True)  # numpy takes no negative seed, torch none past int64
