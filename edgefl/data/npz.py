"""User data saved as one `.npz`: `x`, `y` (train), optional `x_test`, `y_test` and `class_names`.

The file is the user's own, passed by path (`path/to/data.npz[:test]`); written with
`np.savez(path, x=images, y=labels)`. Images are uint8 (0..255) or float (0..1), in any of the
layouts (N, H, W), (N, C, H, W) or (N, H, W, C).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgefl.data._common import as_int_labels, check_label_range, check_unit_range, to_unit_float
from edgefl.errors import DataError


def check_numpy_file(path: Path, kind: str, hint: str) -> None:
    """Refuse a file numpy did not write (`kind`: ".npy" or ".npz"), before np.load reads it as
    a pickle and says "pickled (object) data ... allow_pickle", which is not what is wrong."""
    try:
        with Path(path).open("rb") as f:
            magic = f.read(6)
    except OSError:  # a folder, unreadable: np.load's own message says which
        return
    if magic == b"\x93NUMPY" or magic.startswith(b"PK\x03\x04"):  # .npy header / zip (.npz)
        return
    raise DataError(
        f"{path} is not a {kind} file (it does not begin with numpy's header)", hint=hint
    )


def npz_images(x: np.ndarray, where: str) -> np.ndarray:
    """User images as float32 (N, C, H, W) in [0, 1]; `where` names the source in errors."""
    if x.ndim == 3:
        x = x[:, None, :, :]
    elif x.ndim == 4:
        if x.shape[1] not in (1, 3) and x.shape[3] in (1, 3):
            x = x.transpose(0, 3, 1, 2)  # NHWC -> NCHW
    else:
        raise DataError(
            f"{where}: expected images of shape (N, H, W), (N, C, H, W) or (N, H, W, C), "
            f"got {x.shape}",
            hint="save one image per row along the first axis",
        )
    if x.dtype == np.uint8:
        return to_unit_float(np.ascontiguousarray(x))
    if not np.issubdtype(x.dtype, np.floating):
        raise DataError(
            f"{where}: expected uint8 (0..255) or float (0..1) pixels, got dtype {x.dtype}",
            hint="convert with x.astype(np.uint8) or x.astype(np.float32) / x.max()",
        )
    x = np.ascontiguousarray(x, dtype=np.float32)
    check_unit_range(x, where)
    return x


def load_npz(path: Path, split: str) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    arrays = _read_arrays(path)
    x_key, y_key = ("x", "y") if split == "train" else ("x_test", "y_test")
    if x_key not in arrays or y_key not in arrays:
        raise DataError(
            f"{path} has no test split: expected arrays 'x_test' and 'y_test'",
            hint="add x_test/y_test to the .npz, or evaluate on a held-out part of its train split",
        )
    x = npz_images(arrays[x_key], f"{path} [{x_key}]")
    y = as_int_labels(arrays[y_key], f"{path} [{y_key}]", n=len(x))
    class_names = _class_names(arrays, y, split)
    check_label_range(y, len(class_names), f"{path} [{y_key}]")
    return x, y, class_names


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array in the .npz at `path`, which must hold at least `x` and `y`."""
    check_numpy_file(path, ".npz", "save user data with np.savez(path, x=images, y=labels)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(
            f"cannot read {path} as .npz: {exc}",
            hint="save user data with np.savez(path, x=images, y=labels)",
        ) from None
    if "x" not in arrays or "y" not in arrays:
        raise DataError(
            f"{path}: expected arrays 'x' and 'y', found {sorted(arrays) or 'none'}",
            hint="save user data with np.savez(path, x=images, y=labels[, class_names=names])",
        )
    return arrays


def _class_names(arrays: dict[str, np.ndarray], y: np.ndarray, split: str) -> tuple[str, ...]:
    """The file's `class_names`, else "0".."C-1" for the largest label in either split."""
    if "class_names" in arrays:
        return tuple(str(n) for n in np.asarray(arrays["class_names"]).reshape(-1))
    # Count classes over both splits so that train and test agree on C.
    other = "y_test" if split == "train" else "y"
    tops = [int(y.max())] if y.size else []
    if other in arrays and arrays[other].size and np.issubdtype(arrays[other].dtype, np.number):
        tops.append(int(np.nanmax(arrays[other])))
    return tuple(str(i) for i in range(max(tops, default=-1) + 1))
