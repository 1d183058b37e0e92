"""What an upload says it is, read without parsing it: the edgefl metadata an ONNX file declares,
found by walking the top-level fields of its protobuf encoding (ModelProto) and skipping every
other field by its length, the graph included. A few dozen small reads per file, whatever its
size: the server can count what a folder of 10,000 uploads declares before it validates any.

Nothing here is checked: a declaration is the client's word until ``validate_upload`` proves
it. The reader never raises on bad bytes, never reads past the file's size or the upload cap,
and never reads (or allocates) by a declared length that the bytes left do not hold: anything
malformed, truncated, oversized or absent is None.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import UploadRejected
from .folder import list_uploads
from .schema import METADATA_KEY, decode_metadata
from .validate import DEFAULT_MAX_UPLOAD_BYTES, open_upload

# onnx.proto: ModelProto.metadata_props = 14, each a StringStringEntryProto (key 1, value 2).
_METADATA_PROPS, _KEY, _VALUE = 14, 1, 2
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5  # protobuf wire types (3/4, groups: never in ONNX)
_FIXED = {_I64: 8, _I32: 4}
_OURS = METADATA_KEY.encode()
# Fields walked in one file, the metadata entries' own included: an ONNX file has about ten at
# its top level, three per metadata entry more; a file of millions of tiny fields is not read
# to its end (a few thousand small reads at most).
MAX_FIELDS = 4096
# The one metadata value read: edgefl's are a few kB (a 100,000-class task's names: ~1 MB).
MAX_METADATA_BYTES = 16 << 20

# (offset, n) -> at most n bytes at offset (fewer only at the end of the file)
Reader = Callable[[int, int], bytes]


def peek_kind(
    source: bytes | str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
) -> str | None:
    """The ``kind`` an upload's edgefl metadata declares ("classifier", ...), None if it
    declares none or cannot be read cheaply (see ``peek_metadata``)."""
    meta = peek_metadata(source, max_bytes=max_bytes)
    kind = meta.get("kind") if meta is not None else None
    return kind if isinstance(kind, str) else None


def peek_metadata(
    source: bytes | str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
) -> dict[str, Any] | None:
    """The edgefl metadata object an upload (its bytes, or a path) declares, unchecked; None
    when absent, repeated, not a JSON object, or the file is not one ingest would read (a
    symlink, not a regular file, hard-linked, over `max_bytes`) or its fields are malformed."""
    if isinstance(source, bytes | bytearray):
        data = bytes(source)
        if len(data) > max_bytes:
            return None
        return _decoded(lambda at, n: data[at : at + n], len(data))
    try:
        fd = open_upload(Path(source), max_bytes)
    except (UploadRejected, OSError, ValueError):  # ValueError: a NUL in the path
        return None
    try:
        size = min(os.fstat(fd).st_size, max_bytes)
        return _decoded(lambda at, n: _read_at(fd, at, n), size)
    except OSError:
        return None
    finally:
        os.close(fd)


def declared_kinds(
    directory: str | os.PathLike[str],
    *,
    recursive: bool = False,
    max_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
) -> Counter[str | None]:
    """How many of the files ``ingest_dir`` would validate in `directory` (same listing)
    declare each kind (None: no readable declaration). Empty if it cannot be listed: the
    ingest says why."""
    try:
        names = list_uploads(directory, recursive)
    except (OSError, ValueError):
        return Counter()
    return Counter(peek_kind(Path(directory, name), max_bytes=max_bytes) for name in names)


def _read_at(fd: int, at: int, n: int) -> bytes:
    os.lseek(fd, at, os.SEEK_SET)
    return os.read(fd, n)


def _decoded(read: Reader, size: int) -> dict[str, Any] | None:
    """The one edgefl metadata value of the message in [0, size), decoded; None otherwise."""
    spans = _metadata_spans(read, size)
    if spans is None or len(spans) != 1:  # get_metadata refuses a repeated key too
        return None
    start, end = spans[0]
    if end - start > MAX_METADATA_BYTES:
        return None
    data = read(start, end - start)
    if len(data) != end - start:  # the file shrank
        return None
    try:
        return decode_metadata(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def _metadata_spans(read: Reader, size: int) -> list[tuple[int, int]] | None:
    """(start, end) of the value of each metadata entry keyed METADATA_KEY, in file order; None
    if the top-level fields do not parse."""
    spans, budget = [], [MAX_FIELDS]  # fields left to walk, shared by every message
    for number, wire, start, end in _fields(read, 0, size, budget):
        if number < 0:
            return None
        if number == _METADATA_PROPS and wire == _LEN:
            entry = _entry(read, start, end, budget)
            if entry is None:
                return None
            key, value = entry
            if key is not None and key[1] - key[0] == len(_OURS) and read(*_span(key)) == _OURS:
                spans.append(value or (end, end))  # no value: "" (not JSON, refused)
    return spans


def _span(span: tuple[int, int]) -> tuple[int, int]:
    """(offset, length) of a (start, end) span, as a Reader takes it."""
    return span[0], span[1] - span[0]


def _entry(
    read: Reader, start: int, end: int, budget: list[int]
) -> tuple[tuple[int, int] | None, tuple[int, int] | None] | None:
    """(key span, value span) of the StringStringEntryProto in [start, end), the last of each
    as protobuf takes it; None if its fields do not parse."""
    key = value = None
    for number, wire, a, b in _fields(read, start, end, budget):
        if number < 0:
            return None
        if wire == _LEN and number == _KEY:
            key = (a, b)
        elif wire == _LEN and number == _VALUE:
            value = (a, b)
    return key, value


def _fields(read: Reader, pos: int, end: int, budget: list[int]):
    """(field number, wire type, payload start, payload end) of each field of the message in
    [pos, end); one (-1, ...) and stop at the first that does not parse, or once `budget[0]`
    fields (counted down, across messages) have been walked."""
    while pos != end and budget[0] > 0:
        budget[0] -= 1
        field = _field(read, pos, end)
        if field is None:
            break
        yield field
        pos = field[3]
    if pos != end:
        yield -1, -1, pos, pos


def _field(read: Reader, pos: int, end: int) -> tuple[int, int, int, int] | None:
    """The field at `pos` (its payload within [pos, end)), or None if malformed or truncated."""
    tag = _varint(read, pos, end)
    if tag is None or tag[0] >> 3 == 0 or tag[0] >= 1 << 32:  # field 0, or past 2**29 - 1
        return None
    number, wire, start = tag[0] >> 3, tag[0] & 7, tag[1]
    if wire == _VARINT:
        after = _varint(read, start, end)
        stop = after[1] if after is not None else None
    elif wire == _LEN:
        length = _varint(read, start, end)
        if length is None:
            return None
        start, stop = length[1], length[1] + length[0]
    else:
        stop = start + _FIXED[wire] if wire in _FIXED else None
    if stop is None or stop > end:
        return None
    return number, wire, start, stop


def _varint(read: Reader, pos: int, end: int) -> tuple[int, int] | None:
    """(value, position after it) of the base-128 varint at `pos`, at most 10 bytes and
    within `end`; None if it runs past either."""
    data = read(pos, min(10, end - pos))
    value = 0
    for i, byte in enumerate(data):
        value |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            return (value, pos + i + 1) if value < 1 << 64 else None
    return None
