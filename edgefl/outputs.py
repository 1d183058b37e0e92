"""Output paths and output sets: checked before any long work (so that a bad path costs
nothing), locked for the run that writes them, staged, and published only once complete."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from edgefl.errors import ConfigError
from edgefl.progress import printable
from exporters.atomic import fsync_dir, is_temp_name, make_temp_dir, remove_stale_temps

try:
    import fcntl
except ImportError:  # Windows: no flock; runs on the same outputs are not kept apart there
    fcntl = None

LOCK_PREFIX = ".edgefl-lock-"  # + 16 hex digits of the target's name: a fixed, short name


def check_writable(path: str | Path, flag_name: str, example: str, folder_ok: bool = False) -> None:
    """Fail now, naming the flag, if `path` cannot be created as a file (or, with `folder_ok`,
    used as a folder of outputs): a file where a folder is wanted or the reverse, or its
    nearest existing ancestor is not a writable folder (a regular file, /proc, read-only), or
    a name longer than that file system allows."""
    path = Path(path)
    check_name_lengths(path, flag_name, example)  # first: a stat would raise on a long name
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


# The PNG text chunk every picture edgefl saves carries (edgefl.plots.save_figure): a picture
# with it is edgefl's and its rerun may replace it; any other file at that path is the user's.
PNG_SOFTWARE = "edgefl"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check_png_out(path: str | Path, flag_name: str, example: str) -> None:
    """`check_writable` for a picture, and before any work: the name ends in .png (the bytes
    are PNG whatever the name says), and an existing file there is a picture edgefl saved (a
    rerun replaces it), never an upload, a model or the user's own file."""
    check_writable(path, flag_name, example)
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ConfigError(
            f"{flag_name} {path}: a PNG picture is written there; its name should end in .png",
            hint=f"e.g. {flag_name} {example}",
        )
    if path.is_file() and not saved_by_edgefl(path):
        raise ConfigError(
            f"{path} already holds a file edgefl did not draw; this run would replace it",
            hint=f"write the picture elsewhere (another {flag_name}), or remove that file "
            "yourself first",
        )


def saved_by_edgefl(path: Path) -> bool:
    """A PNG edgefl drew (its `Software` text chunk)."""
    try:
        with path.open("rb") as f:
            head = f.read(1 << 16)  # the text chunks come before the image data
    except OSError:
        return False
    return head.startswith(_PNG_MAGIC) and b"Software\x00" + PNG_SOFTWARE.encode() in head


# --- results another command made ------------------------------------------------------------


def existing_result(path: str | Path) -> dict | None:
    """What an existing output records of itself: an edgefl ONNX file's metadata or a JSON
    object (a report, a saved spec); None for anything else (not ours, unreadable)."""
    path = Path(path)
    if not path.is_file():
        return None
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return None
        return data if isinstance(data, dict) else None
    import exporters  # onnx and onnxruntime: only when an output exists

    try:
        return dict(exporters.read_artifact(path).metadata)
    except Exception:  # whatever it is, it is not an edgefl file this run can call its own
        return None


def describe_result(meta: dict | None) -> str:
    """`client-000's classifier upload (cnn, smartphone)`, `a fedmho global model`: what an
    existing output holds, from `existing_result`."""
    if meta is None:
        return "a file edgefl did not write"
    kind = meta.get("kind")
    spec = meta.get("spec") if isinstance(meta.get("spec"), dict) else {}
    model = meta.get("model") or spec.get("name")
    what = _result_kind(meta, kind)
    who = meta.get("client_id")
    owner = f"{who}'s " if isinstance(who, str) and kind != "global" and who != "server" else ""
    profile = meta.get("profile") if isinstance(meta.get("profile"), str) else None
    details = ", ".join(x for x in (model, profile) if isinstance(x, str))
    return f"{owner}{what}" + (f" ({details})" if details and "spec" not in what else "")


def _result_kind(meta: dict, kind) -> str:
    """`classifier upload`, `fedmho global model`, `model spec (cnn)`: what kind of result."""
    if meta.get("deployed"):
        return f"{kind} model deployed for {meta.get('target')}"
    if meta.get("personalized_from"):
        return "personalized model"
    if kind is None and "name" in meta and "input_shape" in meta:
        searched = meta.get("searched") if isinstance(meta.get("searched"), dict) else {}
        who = ", ".join(f"{k} {searched[k]}" for k in ("profile", "dataset") if k in searched)
        return f"model spec ({meta['name']}" + (f"; searched for {who})" if who else ")")
    if kind is None and "method" in meta:
        return f"{meta['method']} fusion report"
    return {
        "classifier": "classifier upload",
        "decoder": "decoder upload",
        "predictions": "predictions upload",
        "prototypes": "prototypes upload",
        "global": f"{meta.get('method')} global model",
    }.get(kind, f"{kind} file")


def replacing_error(path: str | Path, flag: str, holds: str, other: str = "") -> ConfigError:
    """The refusal to replace `path` (named by `flag`), which holds what another command made."""
    elsewhere = f"another {flag}" + (f", or {other}" if other else "")
    return ConfigError(
        f"{path} already holds {holds}; this run would replace it",
        hint=f"keep it by writing this one elsewhere ({elsewhere}), or pass --overwrite to "
        "replace it",
    )


def check_replace(path: str | Path, flag: str, overwrite: bool, own) -> None:
    """Before any work: refuse to replace an existing `path` unless `own(record)` says it is
    this command's own result (its rerun replaces it) or `overwrite` is given. `own` gets
    `existing_result(path)` (None for a file edgefl cannot read)."""
    path = Path(path)
    if overwrite or not path.exists() or path.is_dir():
        return
    meta = existing_result(path)
    if meta is not None and own(meta):
        return
    raise replacing_error(path, flag, describe_result(meta))


def check_name_lengths(path: Path, flag_name: str, example: str) -> None:
    """Every name in `path` within the file system's limit (bytes, not characters: 255 on
    ext4, xfs, btrfs) where it will be created. The OS would refuse it only when the file is
    written, after the work, and Path.exists() raises on it."""
    existing = _nearest_existing(path)
    name_max = name_limit(existing)
    for i, name in enumerate(path.parts):
        size = len(os.fsencode(name))
        if size > name_max:
            short = f"{name[:20]}...{name[-12:]}"
            # The example: the same path with this name cut to 60 characters (suffix kept).
            cut = Path(name).stem[:60] + Path(name).suffix
            shorter = Path(*path.parts[:i], cut, *path.parts[i + 1 :])
            raise ConfigError(
                f"{flag_name} {short}: a name of {size} bytes, longer than the {name_max} bytes "
                f"the file system at {existing} allows",
                hint=f"use a shorter name, e.g. {flag_name} {shorter}",
            )
    path_max = _pathconf(existing, "PC_PATH_MAX", 4096)
    if len(os.fsencode(os.path.abspath(path))) >= path_max:
        raise ConfigError(
            f"{flag_name}: the path is longer than the {path_max} bytes the system allows",
            hint=f"use a shorter path, e.g. {flag_name} {example}",
        )


def name_limit(path: str | Path) -> int:
    """The longest file name, in bytes, the file system at `path` (or its nearest existing
    ancestor) allows."""
    return _pathconf(_nearest_existing(Path(path)), "PC_NAME_MAX", 255)


def _nearest_existing(path: Path) -> Path:
    while not os.path.exists(path) and path != path.parent:  # os.path.exists never raises
        path = path.parent
    return path


def _pathconf(folder: Path, name: str, default: int) -> int:
    try:
        value = os.pathconf(folder, name)
    except (OSError, ValueError, AttributeError):  # unknown here (Windows, some mounts)
        return default
    return value if value and value > 0 else default


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


def sha256_file(path: str | Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


# --- one run's outputs: a lock ----------------------------------------------------------------


@contextlib.contextmanager
def lock_outputs(targets: Iterable[str | Path]) -> Iterator[None]:
    """Hold every target for this run, or fail at once naming the run that holds one.

    One small lock file per target, beside it (flock: the kernel drops it when its holder dies,
    however it dies). The lock is on the open file, so forked workers share it; it is removed
    by its holder on the way out. Taken in one order, so that two runs that want overlapping
    sets cannot each hold half. A dead run's temporary files beside the targets go first."""
    paths = sorted({_lock_path(Path(t)) for t in targets})
    held: list[tuple[Path, int]] = []
    made: list[Path] = []  # folders made for a lock: gone again if the run wrote nothing there
    owner = os.getpid()
    try:
        for lock, target in paths:
            made += _make_folder(lock.parent)
            held.append((lock, _acquire(lock, target)))
        for folder in {lock.parent for lock, _ in paths}:
            remove_stale_temps(folder)
        yield
    finally:
        if os.getpid() == owner:  # a forked child leaving this block releases nothing
            for folder in {lock.parent for lock, _ in held} if len(held) == len(paths) else ():
                remove_stale_temps(folder)  # e.g. what a worker stopped by SIGTERM staged
            for lock, fd in reversed(held):
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()  # while still held: a waiting run then makes a new file
                os.close(fd)
            for folder in reversed(made):  # a run refused before it wrote leaves no folder
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only if empty


def _make_folder(folder: Path) -> list[Path]:
    """Make `folder` and its missing parents; the ones made, outermost first."""
    missing = [f for f in (folder, *folder.parents) if not f.exists()][::-1]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file where a folder should be, a read-only place
        raise ConfigError(
            f"cannot write into {printable(str(folder))}: {e.strerror}",
            hint="write the outputs to a folder you can write to",
        ) from None
    return missing


def _lock_path(target: Path) -> tuple[Path, Path]:
    folder = target.parent.resolve()
    digest = hashlib.sha256(os.fsencode(target.name)).hexdigest()[:16]
    return folder / f"{LOCK_PREFIX}{digest}", folder / target.name


def _acquire(lock: Path, target: Path) -> int:
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if fcntl is None:
            return fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0)
            os.close(fd)
            raise _held(target, holder) from None
        # The holder before us may have removed the file between our open and our lock: the
        # lock is then on a file nobody else will open. Only the file at the path counts.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    info = {"pid": os.getpid(), "started": started, "command": " ".join(sys.argv)}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    return fd


def _held(target: Path, holder: bytes) -> ConfigError:
    try:
        info = json.loads(holder)
        who = f"pid {int(info['pid'])}, started {info['started']}: {info['command']}"
        stop = f" (or stop it: kill {int(info['pid'])})"
    except (ValueError, KeyError, TypeError):
        who, stop = "one that is just starting", ""
    return ConfigError(
        f"{target} is being written by another run ({who})",
        hint=f"wait for that run to finish{stop}, or write the outputs to another path",
    )


# --- one run's outputs: staged, then published together --------------------------------------


class Staging:
    """New outputs written into private folders beside their targets (one per target folder,
    short temporary names) and moved onto the targets only when all are complete: until
    `publish`, the previous outputs stay byte-identical; leaving the block without it discards
    everything staged (a dead run's folders go with its temporary files)."""

    def __init__(self) -> None:
        self._dirs: dict[Path, Path] = {}  # target folder -> its staging folder

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc) -> None:
        self.discard()

    def path(self, target: str | Path) -> Path:
        """Where to write what will become `target`."""
        target = Path(target)
        folder = target.parent
        if folder not in self._dirs:
            folder.mkdir(parents=True, exist_ok=True)
            self._dirs[folder] = make_temp_dir(folder)
        return self._dirs[folder] / target.name

    def final(self, staged: str | Path) -> Path:
        """The target a staged path becomes (any other path: itself)."""
        staged = Path(staged)
        for folder, tmp in self._dirs.items():
            if staged.parent == tmp:
                return folder / staged.name
        return staged

    def publish(self, last: str | Path) -> None:
        """Move every staged file onto its target, `last` (the report: the record that the rest
        is complete) after all others. A previous `last` goes first, so that nothing short of a
        power cut or SIGKILL in between can leave it beside outputs it does not describe; Ctrl-C
        and SIGTERM wait until the moves are done."""
        last = Path(last)
        moves = [
            (tmp / name, folder / name)
            for folder, tmp in self._dirs.items()
            for name in sorted(os.listdir(tmp))
            if not is_temp_name(name)
        ]
        moves.sort(key=lambda move: move[1] == last)
        with deferred_signals():
            last.unlink(missing_ok=True)
            for src, dst in moves:
                with contextlib.suppress(FileNotFoundError):  # keep a replaced file's mode
                    os.chmod(src, os.stat(dst).st_mode & 0o777)
                os.replace(src, dst)
            for folder in self._dirs:
                fsync_dir(folder)
        self.discard()

    def discard(self) -> None:
        for tmp in self._dirs.values():
            shutil.rmtree(tmp, ignore_errors=True)
        self._dirs.clear()


@contextlib.contextmanager
def deferred_signals(signums=(signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """SIGINT and SIGTERM received inside the block act when it ends (a few renames must not be
    split). Handlers can only be set in the main thread; elsewhere the block is unprotected."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in signums}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(got):
            if old[s] is not signal.SIG_IGN:
                signal.raise_signal(s)
