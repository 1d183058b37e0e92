"""Checks on output paths, made before any long work so that a bad path costs nothing."""

from __future__ import annotations

import os
from pathlib import Path

from edgefl.errors import ConfigError


def check_writable(path: str | Path, flag_name: str, example: str) -> None:
    """Fail now, naming the flag, if `path` cannot be created as a file: it is a folder, or its
    nearest existing ancestor is not a writable folder (a regular file, /proc, read-only)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{flag_name} {path} is a directory", hint=f"name a file, e.g. {example}")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:  # the nearest existing ancestor
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{flag_name} {path} cannot be written: {folder} is not a writable folder",
            hint=f"write it somewhere you can write, e.g. {flag_name} {example}",
        )
