"""IDX files (the MNIST format), plain or gzipped: MNIST, Fashion-MNIST and EMNIST (balanced).

The four files of a dataset (train/test images and labels) are looked for in the data folder, its
`gzip/` (the official EMNIST zip), `<TorchvisionName>/raw/` (what `--download` writes) or `<name>/`.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from edgefl.data._common import fetch_hint, to_unit_float
from edgefl.data.registry import DATASETS
from edgefl.errors import DataError

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
    # and the system package's folder name (fashion-mnist/), so that a copy of it under ./data
    # or EDGEFL_DATA_DIR=/usr/share/datasets is found too
    packaged = DATASETS.get(name).system_folder
    return [
        root,
        root / "gzip",
        root / _TV_FOLDERS[name] / "raw",
        root / name,
        *([root / packaged] if packaged else []),
    ]


def find_idx_files(name: str, split: str, root: Path) -> tuple[tuple[Path, Path] | None, list[str]]:
    """Find (images, labels) for a split; else None and the names of the files not found (a
    folder holding the labels only lacks the images, not both), for error messages."""
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
    return None, [base for base, hit in zip(wanted, found, strict=True) if hit is None]


def has_idx_files(name: str, root: Path) -> bool:
    """Both splits' four files are under `root` (in any folder `find_idx_files` reads)."""
    return all(find_idx_files(name, split, root)[0] for split in ("train", "test"))


def read_idx_pair(images: Path, labels: Path, transpose: bool = False):
    """Images (N, 1, H, W) in [0, 1] and int64 labels from one split's two IDX files."""
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
    return to_unit_float(x)[:, None, :, :], y.astype(np.int64)


def lacking_idx_files(name: str, root: Path) -> list[str]:
    """The IDX files of `name`'s two splits that `root` lacks (each split's missing ones)."""
    lacked = []
    for split in ("train", "test"):
        found, missing = find_idx_files(name, split, root)
        lacked += [] if found else missing
    return lacked


def missing_idx_files(name: str, root: Path) -> str | None:
    """What `root` lacks of `name`'s two splits, with every folder looked in (None: nothing)."""
    lacked = lacking_idx_files(name, root)
    if not lacked:
        return None
    dirs = ", ".join(str(d) for d in _idx_dirs(name, root))
    return f"looked for {' and '.join(lacked)} (plain or .gz) in {dirs}"


def load_idx_dataset(name: str, split: str, root: Path) -> tuple[np.ndarray, np.ndarray]:
    found, wanted = find_idx_files(name, split, root)
    if found is None:
        dirs = ", ".join(str(d) for d in _idx_dirs(name, root))
        raise DataError(
            f"{name} {split} files not found: looked for {' and '.join(wanted)} "
            f"(plain or .gz) in {dirs}",
            hint=f"download the four {name} IDX files (train and test, images and labels) into "
            f"{root}, {fetch_hint(name, root)}",
        )
    # EMNIST stores each image transposed relative to MNIST; flip it upright.
    return read_idx_pair(*found, transpose=(name == "emnist"))
