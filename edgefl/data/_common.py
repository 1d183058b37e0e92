"""Checks and conversions that the core (`datasets`) and every file-format module share."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgefl.errors import DataError

SPLITS = ("train", "test")


def to_unit_float(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float32) / np.float32(255.0)) if x.dtype == np.uint8 else x


def check_unit_range(x: np.ndarray, where: str) -> None:
    """Float pixels in [0, 1], or one DataError naming what is not: NaN or infinite values by
    their count (a range of the others would hide them), else the range found."""
    if not x.size:
        return
    bad = int(x.size - np.count_nonzero(np.isfinite(x)))
    if bad:
        found = f"{bad:,} NaN or infinite value(s)"
    elif x.min() < 0.0 or x.max() > 1.0:
        found = f"{x.min():g}..{x.max():g}"
    else:
        return
    raise DataError(
        f"{where}: float pixels must lie in [0, 1], found {found}",
        hint="scale the images to [0, 1] (e.g. x / 255) or save them as uint8"
        + (", with no NaN" if bad else ""),
    )


def frozen(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    for a in arrays:
        a.flags.writeable = False
    return arrays


def fetch_hint(name: str, root: Path) -> str:
    """The one command that fetches a file-based dataset (only `data partition` downloads)."""
    return (
        f"or fetch them with `edgefl data partition --dataset {name} --data-dir {root} "
        "--download` (torchvision, internet)"
    )


def missing_files(name: str, files: list[str], dirs: list[Path], how: str) -> DataError:
    looked = ", ".join(str(d / f) for d in dirs for f in files)
    return DataError(f"{name} files not found; looked at: {looked}", hint=how)


def as_int_labels(
    y: np.ndarray,
    where: str,
    *,
    n: int | None = None,
    num_classes: int | None = None,
    shape_hint: str = "save one integer label per sample",
    range_hint: str | None = None,
) -> np.ndarray:
    """One int64 label per sample (whole-valued floats accepted), each in 0..num_classes-1."""
    if y.ndim != 1 or (len(y) != n if n is not None else len(y) == 0):
        what = (
            f"{n} images but labels of shape {y.shape}; expected ({n},)"
            if n is not None
            else f"expected integer labels of shape (N,), got shape {y.shape}"
        )
        raise DataError(f"{where}: {what}", hint=shape_hint)
    if np.issubdtype(y.dtype, np.floating) and np.all(np.mod(y, 1) == 0):
        y = y.astype(np.int64)
    if not np.issubdtype(y.dtype, np.integer):
        raise DataError(
            f"{where}: expected integer labels 0..C-1, got dtype {y.dtype}",
            hint="save integers, e.g. labels.astype(np.int64); class names map to integers "
            "with np.unique(y, return_inverse=True)",
        )
    y = y.astype(np.int64)
    if num_classes is not None:
        check_label_range(y, num_classes, where, range_hint)
    return y


def check_label_range(y: np.ndarray, num_classes: int, where: str, hint: str | None = None):
    bad = np.unique(y[(y < 0) | (y >= num_classes)])
    if bad.size:
        raise DataError(
            f"{where}: labels {bad[:10].tolist()} are outside the valid range 0..{num_classes - 1}",
            hint=hint or "labels must be 0..C-1 where C = len(class_names)",
        )
