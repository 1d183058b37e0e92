"""Errors raised at the device/server boundary."""

from __future__ import annotations


class ExportError(ValueError):
    """An export could not produce a faithful, self-describing artifact."""


class UploadRejected(ValueError):
    """An untrusted upload was refused; ``reason`` is one line a person can act on."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
