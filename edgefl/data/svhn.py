"""SVHN cropped digits from the official MATLAB files `train_32x32.mat` / `test_32x32.mat`.

They come from http://ufldl.stanford.edu/housenumbers/ (or `--download`) and are looked for in
the data folder or its `svhn/` / `SVHN/`. Reading them needs scipy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgefl.data._common import fetch_hint, missing_files, to_unit_float
from edgefl.errors import DataError


def _first_existing(candidates: list[Path]) -> Path | None:
    return next((p for p in candidates if p.exists()), None)


def has_svhn(root: Path) -> bool:
    """The train split's .mat file is under `root` where `load_svhn` reads."""
    return (
        _first_existing([d / "train_32x32.mat" for d in (root, root / "svhn", root / "SVHN")])
        is not None
    )


def load_svhn(split: str, root: Path) -> tuple[np.ndarray, np.ndarray]:
    from scipy.io import loadmat

    fname = f"{split}_32x32.mat"
    dirs = [root, root / "svhn", root / "SVHN"]
    path = _first_existing([d / fname for d in dirs])
    if path is None:
        raise missing_files(
            "svhn",
            [fname],
            dirs,
            f"download {fname} from http://ufldl.stanford.edu/housenumbers/ into {root}, "
            + fetch_hint("svhn", root),
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
    x = to_unit_float(mat["X"].transpose(3, 2, 0, 1))  # HWCN -> NCHW
    y = mat["y"].reshape(-1).astype(np.int64)
    return x, np.where(y == 10, 0, y)  # SVHN writes digit 0 as label 10
