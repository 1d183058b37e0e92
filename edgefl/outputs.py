"""Checks on output paths, made before any long work so that a bad path costs nothing."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from edgefl.errors import ConfigError


def check_writable(path: str | Path, flag_name: str, example: str, folder_ok: bool = False) -> None:
    """Fail now, naming the flag, if `path` cannot be created as a file (or, with `folder_ok`,
    used as a folder of outputs): a file where a folder is wanted or the reverse, or its
    nearest existing ancestor is not a writable folder (a regular file, /proc, read-only)."""
    path = Path(path)
    if folder_ok and path.exists() and not path.is_dir():
        raise ConfigError(f"{flag_name} {path} is a file", hint=f"name a folder, e.g. {example}")
    if not folder_ok and path.is_dir():
        raise ConfigError(f"{flag_name} {path} is a directory", hint=f"name a file, e.g. {example}")
    folder = path if folder_ok else path.parent
    while not folder.exists() and folder != folder.parent:  # the nearest existing ancestor
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK) or not _can_create(folder):
        raise ConfigError(
            f"{flag_name} {path} cannot be written: {folder} is not a writable folder",
            hint=f"write it somewhere you can write, e.g. {flag_name} {example}",
        )


def _can_create(folder: Path) -> bool:
    """Create and remove a temp file there, as the atomic writers will: os.access says yes to
    root for folders no file can be made in (/proc, a read-only mount)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".edgefl-check.", suffix=".tmp")
    except OSError:
        return False
    os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    return True
