"""Atomic file writes: a crash leaves either the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
from pathlib import Path

import onnx


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temp file in the same directory and ``os.replace``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target)
    # Same directory so os.replace is a rename on one filesystem (atomic), not a copy. The
    # writer's pid in the name lets a later write tell a dead writer's leftover from a live one.
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.{os.getpid()}.",
                               suffix=".tmp")  # fmt: skip
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
    _fsync_dir(target.parent)
    return target


def remove_stale_temps(target: Path) -> None:
    """Delete the temp files of earlier writes of `target` whose writer is gone (a SIGKILL leaves
    them; nothing else can): never a live writer's, which a concurrent run may still rename."""
    for tmp in target.parent.glob(f".{glob.escape(target.name)}.*.tmp"):
        pid = tmp.name[len(target.name) + 2 :].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


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


def _fsync_dir(directory: Path) -> None:
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
