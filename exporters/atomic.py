"""Atomic file writes: a crash leaves either the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path

import onnx

# Every temporary file or folder: `.atomic-PID-RANDOM.tmp`, under 30 bytes whatever the target's
# name (a name of the target's length plus a suffix broke the file system's 255-byte limit).
# The writer's pid lets a later write tell a dead writer's leftover from a live one's.
_TEMP = re.compile(r"^\.atomic-(\d+)-[a-z0-9_]+\.tmp$")


def _temp_prefix() -> str:
    return f".atomic-{os.getpid()}-"


def is_temp_name(name: str) -> bool:
    """Whether `name` is one of the temporary files or folders these writers make."""
    return _TEMP.match(name) is not None


def make_temp_dir(folder: str | os.PathLike[str]) -> Path:
    """A private folder in `folder` (0700), named like the temporary files, so that the same
    clean-up removes it once its writer is gone."""
    return Path(tempfile.mkdtemp(dir=folder, prefix=_temp_prefix(), suffix=".tmp"))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temp file in the same directory and ``os.replace``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target.parent)
    # Same directory so os.replace is a rename on one filesystem (atomic), not a copy.
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=_temp_prefix(), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp creates 0600; keep an existing file's mode, else what open() would give.
        mode = target.stat().st_mode & 0o777 if target.exists() else new_file_mode()
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(target.parent)
    return target


def remove_stale_temps(folder: str | os.PathLike[str]) -> None:
    """Delete the temporary files and folders in `folder` whose writer is gone (a SIGKILL
    leaves them; nothing else can): never a live writer's, which it may still rename."""
    try:
        entries = list(os.scandir(folder))
    except OSError:  # no folder yet: nothing to clean
        return
    for entry in entries:
        m = _TEMP.match(entry.name)
        if m is None or _alive(int(m.group(1))):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def new_file_mode() -> int:
    """0o666 less the process umask: the mode a plain open(path, "w") would create."""
    mask = os.umask(0)  # the only portable way to read it: set, then restore at once
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> Path:
    return atomic_write_bytes(path, text.encode(encoding))


def write_model_atomic(model: onnx.ModelProto, path: str | os.PathLike[str]) -> Path:
    """Serialize ``model`` into ONE self-contained file (weights inline, no sidecar)."""
    return atomic_write_bytes(path, model.SerializeToString())


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    # Makes the rename itself durable; not supported everywhere (e.g. Windows), hence best effort.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
