"""exporters.peek: the kind an upload declares, read from the top-level protobuf fields of its
ONNX file without parsing the graph. On real uploads of every kind it says what read_artifact
says; on any bytes at all it returns a dict or None (never raises), agrees with onnx's own
parser wherever that parser accepts the bytes, and reads no more than the file holds."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from fed_fixtures import HOSTILE_SETTINGS, build_federation, copy_uploads, pred_meta, proto_meta
from hypothesis import given, settings
from hypothesis import strategies as st

import exporters
from exporters import peek
from exporters.peek import declared_kinds, peek_kind, peek_metadata


@pytest.fixture(scope="session")
def federation(tmp_path_factory):
    return build_federation(tmp_path_factory.mktemp("fed"))


@pytest.fixture(scope="module")
def every_kind(federation, tmp_path_factory) -> dict[str, Path]:
    """A real file of each kind: the client path's classifier and decoder, an int8 classifier,
    predictions and prototypes as clients write them, and a global model `server fuse` wrote."""
    from edgefl.server.fuse import FuseJob, run_fuse

    out = tmp_path_factory.mktemp("kinds")
    files = {
        "classifier": federation / "client-000.onnx",
        "decoder": federation / "client-002.onnx",
        "predictions": out / "predictions.onnx",
        "prototypes": out / "prototypes.onnx",
        "int8": out / "int8.onnx",
        "global": out / "global.onnx",
    }
    probs = np.random.default_rng(0).dirichlet(np.ones(10), size=20).astype(np.float32)
    exporters.write_constant_artifact(
        files["predictions"], {"predictions": probs}, pred_meta("p", n=20)
    )
    means = np.random.default_rng(1).normal(size=(3, 6)).astype(np.float32)
    exporters.write_constant_artifact(files["prototypes"], {"prototypes": means}, proto_meta("q"))
    exporters.quantize_int8(files["classifier"], files["int8"])
    job = FuseJob(uploads=str(federation), method="fedavg", out=str(files["global"]), device="cpu")
    run_fuse(job)
    return files


# --- a tiny protobuf writer for hand-made messages ----------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _len(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _entry(key: bytes, value: bytes) -> bytes:
    """A metadata_props entry (ModelProto field 14)."""
    return _len(14, _len(1, key) + _len(2, value))


META = {"kind": "classifier", "num_classes": 3}
OURS = _entry(b"edgefl", json.dumps(META).encode())


def _parser_says(data: bytes):
    """What onnx's own parser and get_metadata make of `data`: the metadata dict, None (no
    metadata, or metadata ingest refuses), or "unparsed"."""
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:
        return "unparsed"
    try:
        return exporters.get_metadata(model)
    except (ValueError, UnicodeDecodeError):
        return None


def _agrees(data: bytes, exact: bool = True) -> None:
    """Never raises; where the parser reads the bytes, peek says what get_metadata says. Not
    `exact`: peek may also say None where the parser reads metadata (protobuf's deprecated
    groups, which no ONNX file holds, are malformed to peek): it never counts a kind that ingest
    would not see, only misses one, which the check after the ingest then refuses."""
    got = peek_metadata(data)
    assert got is None or isinstance(got, dict)
    want = _parser_says(data)
    if want != "unparsed" and (exact or got is not None):
        assert got == want


# --- real uploads -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["classifier", "decoder", "predictions", "prototypes", "int8", "global"]
)
def test_real_files_of_every_kind_declare_what_read_artifact_reads(every_kind, name):
    path = every_kind[name]
    art = exporters.read_artifact(path)
    assert art.kind == ("classifier" if name == "int8" else name)
    assert peek_kind(path) == art.kind
    assert peek_metadata(path) == art.metadata
    assert peek_metadata(path.read_bytes()) == art.metadata


def test_reads_a_few_hundred_bytes_beside_the_metadata(every_kind, monkeypatch):
    """The graph (weights) is skipped by its length, never read."""
    asked: list[int] = []
    real = peek._read_at

    def counted(fd, at, n):
        data = real(fd, at, n)
        asked.append(len(data))
        return data

    monkeypatch.setattr(peek, "_read_at", counted)
    path = every_kind["decoder"]
    meta_bytes = len(exporters.read_artifact(path).model.metadata_props[0].value)
    assert peek_kind(path) == "decoder"
    assert sum(asked) < meta_bytes + 512 < path.stat().st_size // 10
    assert max(asked) == meta_bytes


def test_declared_kinds_lists_what_ingest_lists(federation, tmp_path):
    root = copy_uploads(federation, tmp_path / "up")
    copy_uploads(federation, root / "phones", ["client-000.onnx", "client-001.onnx"])
    (root / "notes.txt").write_text("not an upload")
    (root / ".hidden.onnx").write_bytes((federation / "client-000.onnx").read_bytes())
    (root / "junk.onnx").write_bytes(b"\x00not onnx")
    assert declared_kinds(root) == Counter({"classifier": 2, "decoder": 2, None: 1})
    assert declared_kinds(root, recursive=True) == Counter({"classifier": 4, "decoder": 2, None: 1})
    assert declared_kinds(tmp_path / "missing") == Counter()
    assert sum(declared_kinds(root, recursive=True).values()) == len(
        exporters.list_uploads(root, recursive=True)
    )


@pytest.mark.skipif(sys.platform != "linux", reason="FIFOs and hard links as on the server")
def test_files_ingest_would_not_read_declare_nothing(federation, tmp_path):
    src = federation / "client-000.onnx"
    (tmp_path / "copy.onnx").write_bytes(src.read_bytes())
    assert peek_kind(tmp_path / "copy.onnx") == "classifier"
    assert peek_kind(tmp_path / "copy.onnx", max_bytes=src.stat().st_size - 1) is None
    assert peek_kind(src.read_bytes(), max_bytes=100) is None
    os.symlink(tmp_path / "copy.onnx", tmp_path / "link.onnx")
    os.link(tmp_path / "copy.onnx", tmp_path / "hard.onnx")
    os.mkfifo(tmp_path / "fifo.onnx")
    (tmp_path / "dir.onnx").mkdir()
    for name in ("link.onnx", "hard.onnx", "fifo.onnx", "dir.onnx", "missing.onnx"):
        assert peek_kind(tmp_path / name) is None, name
    assert peek_kind("nul\x00.onnx") is None


# --- hand-made messages: protobuf's rules, as onnx's parser applies them ------------------------


@pytest.mark.parametrize(
    "data, expected",
    [
        (OURS, META),
        (b"", None),
        (_varint(1 << 3) + _varint(9) + _len(7, _len(2, b"g" * 300)) + OURS, META),  # graph
        (_entry(b"other", b"x") + OURS + _entry(b"more", b"{}"), META),
        (_len(14, _len(2, json.dumps(META).encode()) + _len(1, b"edgefl")), META),  # value first
        (_len(14, _len(1, b"x") + _len(1, b"edgefl") + _len(2, b"{}")), {}),  # last key wins
        (_len(14, _len(1, b"edgefl") + _len(2, b"[]") + _len(2, b"{}")), {}),  # last value wins
        (_len(14, _len(1, b"edgefl") + _varint(3 << 3) + _varint(5) + _len(2, b"{}")), {}),
        (OURS + OURS, None),  # repeated: get_metadata refuses it
        (_entry(b"edgefl", b"[1]"), None),
        (_entry(b"edgefl", b'{"a": NaN}'), None),
        (_entry(b"edgefl", b'{"a": "\xff"}'), None),  # not UTF-8
        (_len(14, _len(1, b"edgefl")), None),  # no value: ""
        (_entry(b"edgefl ", b"{}") + _entry(b"EDGEFL", b"{}"), None),
        (_varint(14 << 3) + _varint(5) + OURS, META),  # field 14 as a varint: not an entry
        (OURS[:-1], None),  # truncated
        (OURS + b"\x80", None),  # a tag cut short
        (_varint(0) + OURS, None),  # field 0
        (_varint(1 << 3 | 3) + OURS, None),  # a group
        (_varint(1 << 3 | 7) + OURS, None),  # no such wire type
        (b"\xff" * 11 + OURS, None),  # a varint longer than 10 bytes
    ],
)
def test_hand_made_messages(data, expected):
    assert peek_metadata(data) == expected
    _agrees(data)


def test_a_declared_length_past_the_end_is_never_read(monkeypatch):
    huge = _varint(7 << 3 | 2) + _varint(1 << 62) + b"\x00" * 8 + OURS
    assert peek_metadata(huge) is None
    asked = []
    monkeypatch.setattr(peek, "_decoded", _spy(peek._decoded, asked))
    assert peek_metadata(huge) is None
    assert max(asked) <= len(huge)


def _spy(decoded, asked: list[int]):
    def wrapped(read, size):
        def counted(at, n):
            asked.append(n)
            return read(at, n)

        return decoded(counted, size)

    return wrapped


def test_bounded_field_count_and_value_size(monkeypatch):
    chaff = (_varint(1 << 3) + _varint(1)) * (peek.MAX_FIELDS + 1)
    assert peek_metadata(chaff + OURS) is None
    # MAX_FIELDS in all: the chaff, the entry, its key and its value
    assert peek_metadata(chaff[: 2 * (peek.MAX_FIELDS - 3)] + OURS) == META
    # ... counted across messages: entries full of fields they need not hold
    stuffed = _len(14, _len(1, b"other") + (_varint(3 << 3) + _varint(1)) * 50)
    assert peek_metadata(stuffed * 10 + OURS) == META
    assert peek_metadata(stuffed * (peek.MAX_FIELDS // 50) + OURS) is None
    monkeypatch.setattr(peek, "MAX_METADATA_BYTES", 10)
    assert peek_metadata(OURS) is None
    assert peek_metadata(_entry(b"edgefl", b"{}")) == {}


def test_kind_is_a_string_or_none():
    assert peek_kind(_entry(b"edgefl", b'{"kind": "decoder"}')) == "decoder"
    assert peek_kind(_entry(b"edgefl", b'{"kind": 3}')) is None
    assert peek_kind(_entry(b"edgefl", b"{}")) is None
    assert peek_kind(b"\x0a\x05hello") is None


# --- hostile bytes: never raises, agrees with the parser wherever the parser reads them --------


@settings(max_examples=300, **HOSTILE_SETTINGS)
@given(st.binary(max_size=512))
def test_random_bytes(data):
    for message in (data, OURS + data, data + OURS):
        _agrees(message, exact=False)


@pytest.fixture(scope="module")
def sources(federation) -> dict[str, bytes]:
    return {n: (federation / f"{n}.onnx").read_bytes() for n in ("client-000", "client-002")}


@settings(max_examples=200, **HOSTILE_SETTINGS)
@given(
    name=st.sampled_from(["client-000", "client-002"]),
    edits=st.lists(
        st.tuples(
            st.integers(0, 1500),  # from the end: the metadata and the fields before it
            st.sampled_from([0x00, 0x02, 0x0A, 0x12, 0x72, 0x7A, 0x80, 0xFF, 0x22, 0x5B]),
        ),
        min_size=1,
        max_size=4,
    ),
    cut=st.one_of(st.none(), st.integers(0, 1 << 20)),
)
def test_edited_real_uploads(sources, name, edits, cut):
    data = bytearray(sources[name])
    for back, byte in edits:
        data[max(0, len(data) - 1 - back)] = byte
    data = bytes(data if cut is None else data[: cut % (len(data) + 1)])
    _agrees(data)


def test_every_truncation_of_a_real_upload(sources):
    data = sources["client-000"]
    meta = exporters.get_metadata(_model(data))
    assert peek_metadata(data) == meta
    cuts = list(range(0, 64)) + list(range(len(data) - 1500, len(data)))
    for cut in cuts:
        assert peek_metadata(data[:cut]) is None, cut  # the metadata entry is last


def _model(data: bytes) -> onnx.ModelProto:
    model = onnx.ModelProto()
    model.ParseFromString(data)
    return model
