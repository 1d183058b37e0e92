"""Server ingest: validate every untrusted upload of a directory (exporters does the checks),
rebuild each one that has an edgefl spec and check it against onnxruntime (edgefl.artifacts),
once per run however many methods then fuse them. Independent uploads are ingested in
parallel threads (`jobs`): parsing, checking, hashing, rebuilding and the parity run spend
their time in C++ (protobuf, onnx, onnxruntime, torch), not holding Python's lock for long.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; a killed run's parked folder stays in TMPDIR there
    fcntl = None

import exporters
from edgefl.artifacts import RebuildRejected, Upload, park, rebuild
from edgefl.bounds import Range
from edgefl.client.privacy import spent as privacy_spent
from edgefl.errors import ConfigError, FusionError
from edgefl.progress import printable


@dataclass
class Ingest:
    uploads: list[Upload] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0  # wall time of the whole ingest
    stages: dict[str, float] = field(default_factory=dict)  # summed over uploads (CPU-ish time)
    # The robust screen's verdicts on these uploads, by what they depend on (seed, probe): made
    # once for all methods of a run (edgefl.fusion.screen.Verdict).
    screens: dict = field(default_factory=dict)
    # Subfolders not read: (name + "/", why, with the fix); a run short of uploads names them.
    folders: list[tuple[str, str]] = field(default_factory=list)
    # What each accepted upload spent of its clients' privacy, recomputed from its record
    # (edgefl.client.privacy.spent), by file name; --max-epsilon, if given.
    privacy: dict = field(default_factory=dict)
    max_epsilon: float | None = None

    def of_kind(self, kind: str) -> list[Upload]:
        return [u for u in self.uploads if u.kind == kind]


def default_jobs() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def upload_bytes(d: Path, recursive: bool = False) -> int:
    """The size of the .onnx files an ingest of `d` reads: exporters' own walk (bounded, its
    skip rules), regular files only (a link or a folder so named is refused, not counted)."""
    try:
        names = exporters.list_uploads(d, recursive)
    except OSError:
        return 0  # the ingest says what is wrong with the folder
    total = 0
    for name in names:
        with contextlib.suppress(OSError):
            info = (d / name).lstat()
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return total


def inflight_budget(d: Path, recursive: bool = False) -> int:
    """Bytes of uploads checked at once. Checking one file holds ~3 copies of it (bytes, parsed
    model, onnxruntime session) until its rebuilt module (1 copy) replaces them; a quarter of
    the directory in flight keeps the peak near 2x the uploads' total (bench/results/fuse.md:
    5 VGG-9 uploads, 2.0x one at a time, 2.6x two at a time). Small uploads all run at once."""
    return max(64 * 2**20, upload_bytes(d, recursive) // 4)


# Bytes of uploads checked at once when they are parked: nothing piles up behind the checks
# then, so a small window suffices (small uploads still go many at a time; a larger one alone).
PARKED_INFLIGHT = 64 * 2**20

# Uploads held in memory after their checks, at most (`server fuse --resident-mib`): past it,
# every verified module is parked on the server's disk and read back when a method uses it.
DEFAULT_RESIDENT_MIB = 1024


def resident_limit(resident_mib: int | None, name: str = "--resident-mib") -> int:
    """The MiB of uploads held in memory for `--resident-mib` (None: the default; `name` is the
    setting as the user wrote it); refused when negative, with the fix."""
    limit = DEFAULT_RESIDENT_MIB if resident_mib is None else resident_mib
    Range(0).check(
        name,
        limit,
        hint="0 parks every checked upload on disk; N holds up to N MiB of them in memory",
    )
    return limit


@contextlib.contextmanager
def parking(directory: str | Path, resident_mib: int | None, recursive: bool = False):
    """The folder where an ingest of `directory` parks its verified modules, or None when its
    uploads fit in `resident_mib` MiB (None: DEFAULT_RESIDENT_MIB; 0: always park). The folder
    is the server's own, in the system's temporary directory (TMPDIR), removed with the run;
    refused up front when that disk cannot take the uploads."""
    limit = resident_limit(resident_mib)
    d = Path(directory)
    total = upload_bytes(d, recursive)
    if total <= limit * 2**20 and limit > 0:
        yield None
        return
    _sweep_dead_runs_folders()  # first: what a dead run parked is room for this one
    room = shutil.disk_usage(tempfile.gettempdir()).free
    if room < total:
        raise ConfigError(
            f"parking the uploads' weights after their checks needs up to {total / 2**20:,.1f} "
            f"MiB in {tempfile.gettempdir()}, which has {room / 2**20:,.1f} MiB free",
            hint="point TMPDIR at a disk with room, or hold them in memory with a larger "
            f"--resident-mib (they take {total / 2**20:,.1f} MiB as files)",
        )
    folder, held = _park_folder()
    owner = os.getpid()
    try:
        yield folder
    finally:
        if os.getpid() == owner:  # never a forked worker's to remove
            shutil.rmtree(folder, ignore_errors=True)
            if held is not None:
                os.close(held)


PARKED_PREFIX = "edgefl-parked-"
# In each parked folder, flocked by its run for as long as the run (or a forked worker of it)
# lives: the kernel drops the lock however the run dies, SIGKILL included.
HELD = ".held"


def _park_folder() -> tuple[Path, int | None]:
    """A new private folder in TMPDIR, with its HELD file locked before anyone can see it (made
    under another name, locked, then renamed), and the lock's descriptor."""
    folder = Path(tempfile.mkdtemp(prefix=PARKED_PREFIX))
    if fcntl is None:
        return folder, None
    making = folder / f"{HELD}-new"
    fd = os.open(making, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(making, folder / HELD)
    return folder, fd


def _sweep_dead_runs_folders() -> None:
    """Remove the parked folders in TMPDIR whose run is dead (its HELD lock is free): a
    SIGKILLed run, or one the out-of-memory killer ended, cannot remove its own. A folder
    without a HELD file (a run just making it, an older edgefl's) or not this user's is left."""
    if fcntl is None:
        return
    for path in Path(tempfile.gettempdir()).glob(PARKED_PREFIX + "*"):
        try:
            st = path.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue  # a link, a file, another user's
            flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(path / HELD, flags)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its run is alive
        else:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)


def ingest(
    directory: str | Path,
    *,
    max_upload_bytes: int,
    strict: bool = False,
    jobs: int | None = None,
    progress=None,
    recursive: bool = False,
    park_in: Path | None = None,
    max_epsilon: float | None = None,
) -> Ingest:
    """Every upload in `directory` checked once; with `recursive`, in its subfolders too (each
    named by its path there: "phones/client-000.onnx"), else each subfolder is named, with the
    .onnx files it holds and how to read them. With `park_in` (`parking`), each verified
    module is written there and not held in memory. An upload whose privacy record contradicts
    itself is rejected; with `max_epsilon`, so is one not private as a whole or that spent
    more (`privacy_screen`)."""
    d = Path(directory)
    if not d.is_dir():
        raise ConfigError(
            f"upload directory {d} does not exist or is not a directory",
            hint="pass the directory holding the clients' .onnx uploads",
        )
    check_jobs(jobs)
    check_max_epsilon(max_epsilon)
    start = time.perf_counter()
    stages: dict[str, float] = {}
    result = exporters.ingest_dir(
        d,
        max_bytes=max_upload_bytes,
        jobs=jobs or default_jobs(),
        timings=stages,
        then=functools.partial(_rebuilt, park_in=park_in),
        inflight_bytes=inflight_budget(d, recursive) if park_in is None else PARKED_INFLIGHT,
        recursive=recursive,
        on_file=(lambda done, total: progress("ingest upload", done, total)) if progress else None,
    )
    if result.tied:
        raise _tied(result.tied)
    out = _gathered(result, d, stages, recursive)
    privacy_screen(out, max_epsilon)
    out.seconds = time.perf_counter() - start
    if strict and out.rejected:
        listing = "; ".join(f"{printable(n)}: {r}" for n, r in out.rejected)
        raise FusionError(
            f"--strict: {len(out.rejected)} upload(s) rejected: {listing}",
            hint="remove the rejected files or run without --strict to fuse the accepted ones",
        )
    if not out.uploads:
        raise _none_usable(out, d, recursive, any(count for _, count, _ in result.folders))
    return out


def _tied(groups: list[tuple[str, list[str]]]) -> FusionError:
    """Uploads of two or more tasks in equal numbers: none is the federation's (a majority
    would have settled it), so nothing is fused rather than half the uploads dropped at random."""
    said = "; ".join(
        f"{printable(task)}: {', '.join(printable(n) for n in files[:5])}"
        + (f" and {len(files) - 5} more" if len(files) > 5 else "")
        for task, files in groups[:5]
    ) + (f"; and {len(groups) - 5} more tasks" if len(groups) > 5 else "")
    return FusionError(
        f"the uploads are of {len(groups)} tasks in equal numbers ({said}): none is the "
        "federation's",
        hint="fuse each task's uploads from a folder of their own, or remove the ones that do "
        "not belong to this federation",
    )


MAX_EPSILON = Range(0, low_open=True)


def check_jobs(jobs: int | None) -> None:
    """--jobs: a count of workers, or unset for the default."""
    if jobs is not None:
        Range(1, integer=True).check(
            "--jobs", jobs, hint="e.g. --jobs 2, or leave it out for the default"
        )


def check_max_epsilon(max_epsilon: float | None) -> None:
    if max_epsilon is not None:
        MAX_EPSILON.check(
            "--max-epsilon",
            max_epsilon,
            hint="e.g. --max-epsilon 8 (uploads spending more, "
            "or trained without DP, are set aside)",
        )


def privacy_screen(found: Ingest, max_epsilon: float | None) -> None:
    """Each accepted upload's privacy, recomputed from its record (never its word): a record
    that contradicts itself is rejected always; with `max_epsilon`, an upload not private as a
    whole (no DP, exact label counts) or whose recomputed epsilon is above it, too. Rejected
    like any upload, by name with the reason."""
    found.max_epsilon = max_epsilon
    kept = []
    for u in found.uploads:
        spent = privacy_spent(u.meta)
        found.privacy[u.name] = spent
        if spent.problem is not None:
            why = spent.problem
        elif max_epsilon is None:
            why = None
        elif spent.epsilon is None or spent.replayable:
            why = f"--max-epsilon {max_epsilon:g}: not differentially private: {spent.why}"
        elif spent.epsilon > max_epsilon:
            why = (
                f"--max-epsilon {max_epsilon:g}: spent epsilon {spent.epsilon:.4g} at delta "
                f"{spent.delta:.3g} (recomputed from its record)"
            )
        else:
            why = None
        if why is None:
            kept.append(u)
        else:
            found.rejected.append((u.name, printable(why)))
    found.uploads = kept
    found.rejected.sort()


def _rebuilt(
    art: exporters.Artifact, park_in: Path | None = None
) -> tuple[Upload | None, tuple[str, str] | None, dict]:
    """(the upload, None, its timings) or (None, (file, why rejected), its timings)."""
    # In the validating worker, right after the checks: the rebuilt module then holds the
    # weights and the file's bytes are released before more files are read.
    times: dict[str, float] = {}
    try:
        module, why = rebuild(art, timings=times)
    except RebuildRejected as exc:
        return None, (art.name, str(exc)), times
    except Exception as exc:  # a hostile spec must never crash the server
        reason = f"cannot rebuild from its spec: {type(exc).__name__}: {str(exc)[:200]}"
        return None, (art.name, reason), times
    upload = Upload(art, module, why)
    if park_in is not None:
        with exporters.timed(times, "park"):
            upload = park(upload, park_in)
    return upload, None, times


def _gathered(result, d: Path, stages: dict[str, float], recursive: bool) -> Ingest:
    """The checked and rebuilt uploads, the rejected ones and the folders not read, as an
    Ingest whose stages are `stages` with each upload's rebuild times added."""
    # A reason is one line of the server's own words, whatever upload text it quotes (a graph's
    # value names, a torch error on a hostile spec): its control characters are escaped once,
    # here, for the report, the console and the log alike. File names stay exact (the report
    # names the file on disk); whoever prints one escapes it.
    out = Ingest(
        rejected=[(n, printable(r)) for n, r in result.rejected],
        notes=[printable(n) for n in result.notes],
        stages=stages,
    )
    fix = "give that folder itself" if recursive else "pass --recursive, or give the folder itself"
    out.folders = [
        (name, f"{why}; it holds {count} .onnx file(s): {fix} ({Path(d, name)})")
        for name, count, why in result.folders
    ]
    for art in result.accepted:  # those that also passed the cross-checks of the set
        upload, rejected, times = result.then[art.name]
        exporters.add_times(stages, times)
        if upload is not None:
            out.uploads.append(upload)
        else:
            out.rejected.append((rejected[0], printable(rejected[1])))
    out.rejected.sort()
    return out


def _none_usable(out: Ingest, d: Path, recursive: bool, in_folders: bool) -> FusionError:
    """Why a directory gave no usable upload: it holds none (`in_folders`: its subfolders do),
    or every one was rejected."""
    folders = "".join(f"; folder {printable(n)} not read ({w})" for n, w in out.folders)
    if not out.rejected:
        return FusionError(
            f"no uploads in {d}: it holds no .onnx files" + folders,
            hint="pass --recursive to read its subfolders"
            if not recursive and in_folders
            else "point at the folder of edgefl uploads (.onnx files written by `edgefl client "
            "train`)",
        )
    # The reasons go in the message itself: nothing else is printed before it fails.
    shown = [f"{printable(n)}: {r}" for n, r in out.rejected[:10]]
    more = len(out.rejected) - len(shown)
    listing = "; ".join(shown) + (f"; and {more} more" if more > 0 else "")
    hint = (
        "fix or remove the rejected files, or point at the folder of edgefl uploads "
        "(.onnx files written by `edgefl client train`)"
    )
    if all(r.startswith("--max-epsilon") for _, r in out.rejected):  # sound files, screened
        spent = [s.epsilon for s in out.privacy.values() if s.epsilon and not s.replayable]
        hint = (
            (f"raise --max-epsilon (the least spent here: {min(spent):.4g}), " if spent else "")
            + "leave --max-epsilon out to fuse them as they are, or have the devices train "
            "with `edgefl client train --dp EPSILON`"
        )
    return FusionError(
        f"no usable uploads in {d}: {len(out.rejected)} rejected ({listing})" + folders,
        hint=hint,
    )
