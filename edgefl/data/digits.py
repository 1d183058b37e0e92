"""Built-in digits, offline: scikit-learn's 8x8 handwritten digits, split once into train/test."""

from __future__ import annotations

import functools

import numpy as np


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


def load_sklearn_digits(split: str) -> tuple[np.ndarray, np.ndarray]:
    return _digits_splits()[split]
