"""CIFAR-10 and CIFAR-100 from their official python-pickle batches.

The extracted `cifar-10-python.tar.gz` / `cifar-100-python.tar.gz` archives (what `--download`
writes) are looked for in the data folder: `cifar-10-batches-py/` and `cifar-100-python/`.
Class names come from the batches' meta file when present, else from the registry.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from edgefl.data._common import fetch_hint, missing_files, to_unit_float
from edgefl.data.registry import DATASETS
from edgefl.errors import DataError


def _unpickle(path: Path) -> dict:
    # The official CIFAR format is a python pickle; only load files from a source you trust.
    try:
        with open(path, "rb") as f:
            obj = pickle.load(f, encoding="bytes")
    except (OSError, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise DataError(
            f"cannot read CIFAR batch {path}: {exc}", hint="re-download and re-extract the archive"
        ) from None
    if not isinstance(obj, dict):
        raise DataError(
            f"{path} holds a {type(obj).__name__}, expected a CIFAR batch dict",
            hint="point --data-dir at the extracted python version of the dataset",
        )
    # Official files have bytes keys; re-pickled ones may have str keys. Accept both.
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in obj.items()}


def _batch_arrays(batch: dict, label_key: str, path: Path) -> tuple[np.ndarray, np.ndarray]:
    if "data" not in batch or label_key not in batch:
        raise DataError(
            f"CIFAR batch {path} lacks 'data' or {label_key!r} (has {sorted(batch)})",
            hint="point --data-dir at the extracted python version of the dataset",
        )
    data = np.asarray(batch["data"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(
            f"CIFAR batch {path}: expected uint8 data of shape (N, 3072), got {data.dtype} "
            f"{data.shape}",
            hint="point --data-dir at the extracted python version of the dataset",
        )
    x = data.reshape(-1, 3, 32, 32)
    return to_unit_float(x), np.asarray(batch[label_key], dtype=np.int64)


def _names(meta: dict | None, key: str) -> tuple[str, ...] | None:
    if not meta or key not in meta:
        return None
    return tuple(n.decode() if isinstance(n, bytes) else str(n) for n in meta[key])


def has_cifar(name: str, root: Path) -> bool:
    """The train split's files are under `root` where `load_cifar10`/`load_cifar100` read."""
    if name == "cifar10":
        return any((d / "data_batch_1").is_file() for d in (root, root / "cifar-10-batches-py"))
    return any((d / "train").is_file() for d in (root / "cifar-100-python", root))


def load_cifar10(split: str, root: Path):
    files = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    dirs = [root, root / "cifar-10-batches-py"]
    folder = next((d for d in dirs if all((d / f).is_file() for f in files)), None)
    if folder is None:
        raise missing_files(
            "cifar10",
            files,
            dirs,
            f"download cifar-10-python.tar.gz and extract it into {root}, "
            + fetch_hint("cifar10", root),
        )
    parts = [_batch_arrays(_unpickle(folder / f), "labels", folder / f) for f in files]
    meta_path = folder / "batches.meta"
    names = _names(_unpickle(meta_path), "label_names") if meta_path.is_file() else None
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    return x, y, names or DATASETS.get("cifar10").class_names


def load_cifar100(split: str, root: Path):
    dirs = [root / "cifar-100-python", root]
    folder = next((d for d in dirs if (d / split).is_file()), None)
    if folder is None:
        raise missing_files(
            "cifar100",
            [split],
            dirs,
            f"download cifar-100-python.tar.gz and extract it into {root}, "
            + fetch_hint("cifar100", root),
        )
    x, y = _batch_arrays(_unpickle(folder / split), "fine_labels", folder / split)
    meta_path = folder / "meta"
    names = _names(_unpickle(meta_path), "fine_label_names") if meta_path.is_file() else None
    return x, y, names or DATASETS.get("cifar100").class_names
