"""Where a registered dataset's files are, without a flag: the search path.

In order: `--data-dir` when given (then only it: a folder the user names is the one meant);
else each folder of the environment variable EDGEFL_DATA_DIR (os.pathsep-separated), `./data`,
and the system folder a package installs (`/usr/share/datasets/<folder>`, e.g. Debian's
`dataset-fashion-mnist`). The first folder holding the dataset's files is used.
"""

from __future__ import annotations

import os
from pathlib import Path

from edgefl.data.cifar import has_cifar
from edgefl.data.idx import has_idx_files, lacking_idx_files, missing_idx_files
from edgefl.data.registry import DATASETS
from edgefl.data.svhn import has_svhn
from edgefl.errors import DataError
from edgefl.progress import printable

ENV = "EDGEFL_DATA_DIR"
SYSTEM_ROOT = Path("/usr/share/datasets")

# The files each dataset is read from, as a person finds them.
FILES = {
    "fmnist": "the four IDX files train-/t10k-images-idx3-ubyte, -labels-idx1-ubyte (or .gz)",
    "emnist": "the four emnist-balanced-train-/test-images/-labels IDX files (or .gz)",
    "cifar10": "cifar-10-batches-py/ (cifar-10-python.tar.gz extracted)",
    "cifar100": "cifar-100-python/ (cifar-100-python.tar.gz extracted)",
    "svhn": "train_32x32.mat and test_32x32.mat",
}
# How to tell a folder holds a file-based dataset (the loaders' own places within it).
_PROBES = {
    "fmnist": lambda root: has_idx_files("fmnist", root),
    "emnist": lambda root: has_idx_files("emnist", root),
    "cifar10": lambda root: has_cifar("cifar10", root),
    "cifar100": lambda root: has_cifar("cifar100", root),
    "svhn": has_svhn,
}


def file_based(name: str) -> bool:
    """The dataset is read from files found on the search path (not built in)."""
    return name in _PROBES


def search_path(name: str, data_dir: str | Path | None = None) -> list[Path]:
    """The folders looked in for dataset `name`, in order."""
    if data_dir is not None:
        return [Path(data_dir)]
    env = _env_folders()
    info = DATASETS.get(name)
    system = [SYSTEM_ROOT / (info.system_folder or name)]
    return [*env, Path("data"), *system]


def _env_folders() -> list[Path]:
    """The folders of $EDGEFL_DATA_DIR, in order."""
    return [Path(p) for p in os.environ.get(ENV, "").split(os.pathsep) if p]


def unusable_folders(data_dir: str | Path | None = None) -> list[str]:
    """The folders the user named (--data-dir, $EDGEFL_DATA_DIR) that are not folders: the
    search passes over them, and `data list` says so (a typo read as "not found")."""
    named = [Path(data_dir)] if data_dir is not None else _env_folders()
    flag = "--data-dir" if data_dir is not None else f"${ENV}"
    return [f"{flag} names {p}, which is not a folder" for p in named if not p.is_dir()]


def builtin_reads(name: str, data_dir: str | Path) -> bool:
    """A built-in dataset reads its files from `data_dir` (when named, the loaders read that
    folder or refuse: MNIST's IDX files, HAPT's UCI files; digits reads none)."""
    from edgefl.data import hapt  # its layouts are many: its own reader says

    root = Path(data_dir)
    if name == "mnist":
        return has_idx_files("mnist", root)
    if name in ("hapt", "hapt-gyro"):
        return hapt.in_folder(root) is not None
    return False


def find(name: str, data_dir: str | Path | None = None) -> Path | None:
    """The first folder of the search path holding `name`'s files, or None."""
    probe = _PROBES[name]
    return next((root for root in search_path(name, data_dir) if probe(root)), None)


def install_hint(name: str) -> str:
    """The one command (or step) that provides `name`'s files."""
    info = DATASETS.get(name)
    if info.package:
        return (
            f"install the system package {info.package} (as root: apt-get install -y "
            f"{info.package}; `make setup` does it where apt-get is allowed), or put the files "
            f"in a folder and pass --data-dir or set {ENV}"
        )
    return (
        f"put {FILES[name]} in a folder and pass --data-dir or set {ENV} (or fetch them with "
        f"`edgefl data partition --dataset {name} --download`: torchvision, internet)"
    )


def _missing(name: str, root: Path) -> str:
    """What `root` lacks of `name` (each IDX file by its name, with the folders looked in)."""
    if name in ("fmnist", "emnist"):
        return missing_idx_files(name, root) or FILES[name]
    return f"{FILES[name]} in {root}"


def partly_there(name: str, root: Path) -> list[str]:
    """The files an IDX dataset's folder lacks when it holds some of them ([] when it holds
    all, none, or the dataset is not read from IDX files): `data list` names them."""
    if name not in ("fmnist", "emnist"):
        return []
    lacked = lacking_idx_files(name, root)
    return lacked if len(lacked) < 4 else []


def require(name: str, data_dir: str | Path | None = None) -> Path:
    """The folder to read `name` from: with --data-dir that folder, if it holds every file of
    both splits (a folder with the training files only failed at the evaluation, after the
    training); else the first on the search path that holds the files, or one message naming
    every folder looked in and the package that provides them."""
    if data_dir is not None:
        if not Path(data_dir).is_dir():  # not "lacks its files ... install the package"
            what = "is a file, not a folder" if Path(data_dir).exists() else "does not exist"
            raise DataError(
                f"{name}: --data-dir {printable(str(data_dir))} {what}",
                hint=f"name the folder that holds {name}'s files, or leave --data-dir out to "
                "search the standard places (`edgefl data list` shows them)",
            )
        if not _PROBES[name](Path(data_dir)):
            raise DataError(
                f"{name}: --data-dir {data_dir} lacks its files: {_missing(name, Path(data_dir))}",
                hint=install_hint(name),
            )
        return Path(data_dir)
    root = find(name)
    if root is None:
        looked = ", ".join(str(p) for p in search_path(name))
        raise DataError(
            f"{name}: its files were not found; looked in {looked}", hint=install_hint(name)
        )
    return root
