"""Exported graphs kept on disk across processes (issue 59 item 4).

A process's first export traces the module with torch.export and builds the ONNX graph: about
2 s, most of it importing torch's dynamo and the exporter (bench/results/first_export.md),
paid by every `client train` and every simulate worker. The graph of a module structure
(`export._structure_key`) is the same in every process of the same software, so the first
process to export it keeps its weightless template here and later ones fill in their weights.

Safe by construction: the key adds to the structure the versions of torch, onnx and edgefl's
exporter and the source files of every module class in the model, so a changed forward never
meets an old graph; every export from a kept graph is parity-checked against the module (as
in-process templates are) and one that fails is deleted and traced afresh; a file that does
not parse is ignored. The cache is a speed-up only: any error reading or writing it is ignored.

Where: $EDGEFL_CACHE_DIR (`off` disables it), else $XDG_CACHE_HOME/edgefl, else ~/.cache/edgefl.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import struct
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from .atomic import atomic_write_bytes

_MAGIC = b"EDGEFL-GRAPH-1\n"
_HEADER = struct.Struct("<I")  # length of the JSON header that follows the magic


def folder() -> Path | None:
    """The cache folder, or None when disabled."""
    env = os.environ.get("EDGEFL_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "none") else Path(env) / "graphs"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgefl" / "graphs"


@functools.cache
def _file_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@functools.cache
def _software() -> str:
    import torch

    here = os.path.join(os.path.dirname(__file__), "export.py")
    return f"torch {torch.__version__}; onnx {onnx.__version__}; export.py {_file_digest(here)}"


def disk_key(structure_key: str, module) -> str | None:
    """The structure key extended by the software and every module class's source file; None
    when a class's source cannot be found (defined in a notebook cell, say): not kept."""
    digest = hashlib.sha256(f"{structure_key}; {_software()}".encode())
    for path in sorted({_source(type(sub)) for sub in module.modules()}):
        if path is None:
            return None
        digest.update(f"; {path} {_file_digest(path)}".encode())
    return digest.hexdigest()


def _source(cls) -> str | None:
    try:
        return inspect.getsourcefile(cls)
    except (TypeError, OSError):
        return None


def load(key: str) -> tuple[onnx.ModelProto, tuple[tuple[int, str], ...]] | None:
    """The kept (weightless graph, weights' (initializer index, name)) for `key`, or None."""
    where = folder()
    if where is None:
        return None
    try:
        data = (where / f"{key}.onnxt").read_bytes()
        if not data.startswith(_MAGIC):
            return None
        at = len(_MAGIC)
        (size,) = _HEADER.unpack_from(data, at)
        at += _HEADER.size
        header = json.loads(data[at : at + size])
        if header.get("key") != key:
            return None
        model = onnx.ModelProto()
        model.ParseFromString(data[at + size :])
        weights = tuple((int(i), str(name)) for i, name in header["weights"])
        count = len(model.graph.initializer)
        if any(not 0 <= i < count for i, _ in weights):
            return None
        return model, weights
    except (OSError, ValueError, KeyError, TypeError, struct.error, DecodeError):
        return None


def store(key: str, model: onnx.ModelProto, weights: tuple[tuple[int, str], ...]) -> None:
    where = folder()
    if where is None:
        return
    header = json.dumps({"key": key, "weights": [list(w) for w in weights]}).encode()
    # a read-only or full disk costs the next process its trace, nothing else
    with contextlib.suppress(OSError):
        atomic_write_bytes(
            where / f"{key}.onnxt",
            _MAGIC + _HEADER.pack(len(header)) + header + model.SerializeToString(),
        )


def forget(key: str) -> None:
    where = folder()
    if where is None:
        return
    with contextlib.suppress(OSError):
        (where / f"{key}.onnxt").unlink(missing_ok=True)
