"""Folder policy over UNTRUSTED uploads: which files of an upload folder are read (a bounded
walk), how many bytes are checked at once, and which valid uploads fit the set (the majority
task, one upload per client and kind). Each file's own checks are validate.validate_upload's."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UploadRejected
from .read import Artifact
from .timing import add_times
from .validate import validate_upload


@dataclass
class IngestResult:
    accepted: list[Artifact] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # What ``then`` returned for each validated file, by its name (accepted ones included).
    then: dict[str, Any] = field(default_factory=dict)
    # Subfolders not read (not recursive, or too deep): (name + "/", .onnx files it holds,
    # counted up to MAX_LISTED_ENTRIES, why it was not read).
    folders: list[tuple[str, int, str]] = field(default_factory=list)
    # Uploads of two or more tasks (or class namings) in equal numbers: no majority, so no
    # federation to fuse. (the task as the files say it, their names) per group.
    tied: list[tuple[str, list[str]]] = field(default_factory=list)


# What one ingest may list, folders included: a directory of millions of entries (or a deep
# tree of folders) costs the server a bounded walk, whatever the clients put there.
MAX_LISTED_ENTRIES = 100_000
MAX_DEPTH = 4  # folder levels read below the upload directory with recursive=True


def _list_uploads(root: Path, recursive: bool, result: IngestResult) -> list[str]:
    """The .onnx names to validate, relative to `root` ("a.onnx", "phones/b.onnx"), sorted;
    notes for what is left out. Nothing is followed through a symlink: a symlinked folder is
    named; anything named *.onnx is listed, so that validate_upload rejects a symlink, a
    folder or a FIFO so named with its reason."""
    names: list[str] = []
    listed = 0

    def entries(folder: Path) -> list[os.DirEntry]:
        nonlocal listed
        out = []
        with os.scandir(folder) as it:
            for entry in it:
                listed += 1
                if listed > MAX_LISTED_ENTRIES:
                    break
                out.append(entry)
        return sorted(out, key=lambda e: e.name)

    def walk(folder: Path, prefix: str, depth: int) -> None:
        for entry in entries(folder):
            name = prefix + entry.name
            if entry.name.startswith("."):
                continue
            if entry.name.lower().endswith(".onnx"):  # a folder or link so named: rejected
                names.append(name)
                continue
            if entry.is_dir(follow_symlinks=False):
                if recursive and depth < MAX_DEPTH:
                    walk(Path(entry.path), name + "/", depth + 1)
                else:
                    why = (
                        f"folders deeper than {MAX_DEPTH} levels are not read"
                        if recursive
                        else "subfolders are not read"
                    )
                    result.folders.append((name + "/", _count_onnx(Path(entry.path)), why))
                continue
            if entry.is_symlink():
                result.notes.append(f"ignored '{name}': a symlink, not followed")
                continue
            result.notes.append(f"ignored '{name}': not an .onnx file")

    walk(root, "", 0)
    if listed > MAX_LISTED_ENTRIES:
        result.notes.append(
            f"listing stopped at {MAX_LISTED_ENTRIES:,} entries: the rest was not read"
        )
    for name, count, why in result.folders:
        result.notes.append(f"skipped folder '{name}': {why}; it holds {count} .onnx file(s)")
    return names


def list_uploads(directory: str | os.PathLike[str], recursive: bool = False) -> list[str]:
    """The .onnx names ``ingest_dir`` would validate in ``directory`` (same walk, same skip
    rules, same bounds), relative to it and sorted; OSError if it cannot be listed."""
    return _list_uploads(Path(directory), recursive, IngestResult())


def _count_onnx(folder: Path) -> int:
    """.onnx files directly in `folder`, counted over at most MAX_LISTED_ENTRIES entries."""
    count = 0
    try:
        with os.scandir(folder) as it:
            for i, entry in enumerate(it):
                if i >= MAX_LISTED_ENTRIES:
                    break
                count += entry.name.lower().endswith(".onnx") and not entry.name.startswith(".")
    except OSError:
        return 0
    return count


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # validate_upload says what is wrong with it


class _ByteBudget:
    """At most `limit` bytes of files in flight (None: no limit); one larger file runs alone."""

    def __init__(self, limit: int | None):
        self.limit, self.used = limit, 0
        self.cond = threading.Condition()

    @contextlib.contextmanager
    def hold(self, size: int) -> Iterator[None]:
        if self.limit is None:
            yield
            return
        want = min(size, self.limit)
        with self.cond:
            self.cond.wait_for(lambda: self.used + want <= self.limit)
            self.used += want
        try:
            yield
        finally:
            with self.cond:
                self.used -= want
                self.cond.notify_all()


def shape_text(shape: tuple[int, ...]) -> str:
    """An input shape as users read it: 1x28x28."""
    return "x".join(str(d) for d in shape)


def ingest_dir(
    directory: str | os.PathLike[str],
    *,
    jobs: int = 1,
    timings: dict[str, float] | None = None,
    then: Callable[[Artifact], Any] | None = None,
    inflight_bytes: int | None = None,
    on_file: Callable[[int, int], None] | None = None,
    recursive: bool = False,
    **validate_kwargs: Any,
) -> IngestResult:
    """Validate every ``*.onnx`` in ``directory``, then cross-check the set. Subfolders are
    read only if ``recursive`` (up to MAX_DEPTH levels, each upload named by its path in the
    directory: "phones/client-000.onnx"); otherwise each is named in ``folders`` with the
    number of .onnx files it holds. Symlinked folders are never followed.
    ``jobs`` files are validated at once in threads (the checks run in C++); ``timings``
    accumulates seconds per stage over all files. ``then(artifact)`` runs on each valid file
    in the same worker, right after its checks (its result in ``IngestResult.then``): a caller
    that turns each file into something smaller can do so before the next files pile up.
    ``inflight_bytes`` caps the total size of the files being worked on at once (a larger file
    runs alone): checking a file holds several copies of it, so parallel big files cost memory.
    ``on_file(done, total)`` is called as the files are finished, in order (progress).

    The directory is only listed and read; nothing in it is created, moved or modified.
    """
    result = IngestResult()
    names = _list_uploads(Path(directory), recursive, result)
    outcomes = _validate_each(
        directory,
        names,
        jobs=jobs,
        timings=timings,
        then=then,
        inflight_bytes=inflight_bytes,
        on_file=on_file,
        validate_kwargs=validate_kwargs,
    )
    candidates: list[Artifact] = []
    for name, art, reason, after in outcomes:
        if art is None:
            result.rejected.append((name, reason))
        else:
            candidates.append(art)
            result.then[name] = after
    majority, note = _majority(candidates)
    if note is not None:
        result.notes.append(note)
    once = _one_per_client(candidates)  # copies of one client's upload are one vote
    result.tied = _tied(once, _task, _described) or _tied(
        [a for a in once if _task(a) == majority], _names, _named
    )
    accepted, rejected = _admit(candidates, majority)
    result.accepted.extend(accepted)
    result.rejected.extend(rejected)
    result.rejected.sort()
    result.notes.append(f"{len(result.accepted)} accepted, {len(result.rejected)} rejected")
    return result


def _check_one(
    directory: str | os.PathLike[str],
    budget: _ByteBudget,
    then: Callable[[Artifact], Any] | None,
    validate_kwargs: dict[str, Any],
    name: str,
) -> tuple[str, Artifact | None, str | None, dict[str, float], Any]:
    """(name, artifact or None, reason or None, seconds per stage, what ``then`` returned)."""
    own: dict[str, float] = {}
    with budget.hold(_size(Path(directory, name))):
        try:
            art = validate_upload(Path(directory, name), timings=own, **validate_kwargs)
        except UploadRejected as exc:
            return name, None, exc.reason, own, None
        art.name = name
        return name, art, None, own, then(art) if then else None


def _validate_each(
    directory: str | os.PathLike[str],
    names: list[str],
    *,
    jobs: int,
    timings: dict[str, float] | None,
    then: Callable[[Artifact], Any] | None,
    inflight_bytes: int | None,
    on_file: Callable[[int, int], None] | None,
    validate_kwargs: dict[str, Any],
) -> Iterator[tuple[str, Artifact | None, str | None, Any]]:
    """Each file's (name, artifact or None, reason or None, then's result), in `names` order,
    reported to ``on_file`` and ``timings`` as it comes."""
    check = functools.partial(
        _check_one, directory, _ByteBudget(inflight_bytes), then, validate_kwargs
    )
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        # map keeps the sorted order
        for i, (name, art, reason, own, after) in enumerate(pool.map(check, names)):
            if on_file is not None:
                on_file(i + 1, len(names))
            add_times(timings, own)
            yield name, art, reason, after


def _task(a: Artifact) -> tuple[tuple[int, ...], int] | None:
    if "input_shape" not in a.metadata:  # only with require_metadata=False
        return None
    return tuple(a.metadata["input_shape"]), a.metadata["num_classes"]


def _names(a: Artifact) -> tuple[str, ...] | None:
    names = a.metadata.get("class_names")
    return tuple(str(n) for n in names) if names else None


_Task = tuple[tuple[int, ...], int]


def _majority(candidates: list[Artifact]) -> tuple[_Task | None, str | None]:
    """The most common task (input shape, class count) and a note when uploads disagree on it."""
    # Uploads that disagree with the majority on the task cannot be fused with it.
    tally = Counter(t for t in map(_task, candidates) if t is not None)
    majority = tally.most_common(1)[0][0] if tally else None
    if majority is None or len(tally) <= 1:
        return majority, None
    return majority, (
        f"majority task: input shape {shape_text(majority[0])}, {majority[1]} classes "
        f"({tally[majority]} of {sum(tally.values())} uploads)"
    )


def _tied(candidates: list[Artifact], key: Callable[[Artifact], Any], describe) -> list:
    """[(describe(the group), its files)] when two or more values of `key` are each shared by
    the most uploads (a tie: 1 MNIST and 1 Fashion upload), else []."""
    groups: dict[Any, list[Artifact]] = {}
    for a in candidates:
        if (k := key(a)) is not None:
            groups.setdefault(k, []).append(a)
    top = max(map(len, groups.values()), default=0)
    tied = [g for g in groups.values() if len(g) == top]
    return [(describe(g), [a.name for a in g]) for g in tied] if len(tied) > 1 else []


def _one_per_client(candidates: list[Artifact]) -> list[Artifact]:
    """The first upload of each (client id, kind), as `_admit` keeps them."""
    seen: set[tuple[str, str | None]] = set()
    kept = []
    for a in candidates:
        key = (a.client_id, a.kind)
        if a.client_id is None or key not in seen:
            seen.add(key)
            kept.append(a)
    return kept


def _described(group: list[Artifact]) -> str:
    """What a group of uploads of one task says it is: the dataset they name, or its shape."""
    named = {_dataset(a) for a in group}  # upload text: a str or None, never a list
    (one,) = named if len(named) == 1 else (None,)
    if one is not None:
        return one
    task = _task(group[0])
    return f"{shape_text(task[0])} / {task[1]} classes"


def _named(group: list[Artifact]) -> str:
    """A group of uploads of one task and one naming of its classes: the first names."""
    names = _names(group[0]) or ()
    return "classes named " + ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def _dataset(a: Artifact) -> str | None:
    name = a.metadata.get("dataset")
    return name if isinstance(name, str) and name else None


def _majority_names(candidates: list[Artifact], task: _Task | None) -> tuple[str, ...] | None:
    """The class names most uploads of the majority task declare: the global model carries
    them, so an upload that names class 0 "T-shirt" among uploads naming it "0" is another
    task with the same shapes."""
    tally = Counter(_names(a) for a in candidates if _task(a) == task and _names(a) is not None)
    return tally.most_common(1)[0][0] if tally else None


def _names_differ(own: tuple[str, ...] | None, majority: tuple[str, ...] | None) -> str | None:
    if own is None or majority is None or own == majority:
        return None
    i = next(i for i, (a, b) in enumerate(zip(own, majority, strict=True)) if a != b)
    return f"class {i} is named {own[i]!r}, the majority's {majority[i]!r}"


def _other_data(artifact: Artifact, majority: str | None) -> str:
    """ "trained on X, the majority on Y: " where both name their dataset and they differ."""
    own = _dataset(artifact)
    if own is None or majority is None or own == majority:
        return ""
    return f"trained on {own!r}, the majority on {majority!r}: "


def _admit(
    candidates: list[Artifact], majority: _Task | None
) -> tuple[list[Artifact], list[tuple[str, str]]]:
    """The valid uploads that fit the set (accepted) and the others with why (rejected)."""
    accepted: list[Artifact] = []
    rejected: list[tuple[str, str]] = []
    names = _majority_names(candidates, majority)
    data = Counter(
        _dataset(a) for a in candidates if _task(a) == majority and _names(a) == names
    ).most_common(1)
    majority_data = data[0][0] if data else None
    # One client may send one artifact of each kind (e.g. a classifier and its predictions).
    seen_clients: dict[tuple[str, str | None], str] = {}
    for artifact in candidates:
        name = artifact.name
        own = _task(artifact)
        if majority is not None and own is not None and own != majority:
            detail = (
                f"input shape {shape_text(own[0])} / class count {own[1]} disagrees with "
                f"the majority {shape_text(majority[0])} / {majority[1]}"
            )
            rejected.append((name, _other_data(artifact, majority_data) + detail))
            continue
        if own is not None and (differ := _names_differ(_names(artifact), names)) is not None:
            rejected.append((name, _other_data(artifact, majority_data) + differ))
            continue
        client = artifact.client_id
        key = (client, artifact.kind)
        if client is not None and key in seen_clients:
            rejected.append(
                (
                    name,
                    f"duplicate client id '{client}' for a {artifact.kind} "
                    f"(already uploaded as {seen_clients[key]})",
                )
            )
            continue
        if client is not None:
            seen_clients[key] = name
        accepted.append(artifact)
    return accepted, rejected
