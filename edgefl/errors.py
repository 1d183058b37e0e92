"""The small error hierarchy every user-facing failure goes through.

The CLI catches `EdgeflError` once and prints `message` plus `hint` with exit code 2; library users
can catch the stdlib base (`ValueError`, `KeyError`, ...) they already expect.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class EdgeflError(Exception):
    """Base class: a problem the user can fix. `hint` says how."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  fix: {self.hint}"


class ConfigError(EdgeflError, ValueError):
    """Invalid configuration: a profile file, a flag value, a method config."""


def nearest(name: str, valid: Iterable[str]) -> str | None:
    """The valid name nearest `name`, if one is near: what a "did you mean" offers."""
    # Case-blind: "FEDAVG" is as near to fedavg as "fedavgx" is.
    by_lower = {v.lower(): v for v in valid}
    close = difflib.get_close_matches(str(name).lower(), by_lower, n=1, cutoff=0.5)
    return by_lower[close[0]] if close else None


class UnknownNameError(EdgeflError, KeyError):
    """A name that is not in a registry (profile, dataset, model, method)."""

    def __init__(self, kind: str, name: str, valid: Iterable[str]):
        valid = sorted(valid)
        close = nearest(name, valid)
        message = f"unknown {kind} {name!r}"
        if close:
            message += f"; did you mean {close!r}?"
        super().__init__(message, hint=f"valid {kind}s: {', '.join(valid)}")
        self.name = name
        self.valid = valid

    # KeyError.__str__ would repr() the message; keep it readable.
    __str__ = EdgeflError.__str__


class DataError(EdgeflError, ValueError):
    """A dataset that is missing, malformed, or inconsistent."""


class BudgetError(EdgeflError, ValueError):
    """A model that does not fit the device profile's budget."""


class ArtifactError(EdgeflError, ValueError):
    """An ONNX artifact that cannot be exported, read, or used as asked."""


class FusionError(EdgeflError, ValueError):
    """Uploads that a fusion method cannot use (wrong kinds, mixed architectures, none left)."""
