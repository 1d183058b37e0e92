"""Result pictures (confusion matrices, accuracy bars), saved atomically as PNG."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_confusion(confusion: np.ndarray, path, title: str = "") -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4.5))
    im = ax.imshow(confusion, cmap="Blues")
    fig.colorbar(im, ax=ax)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def plot_accuracy_bars(names: list[str], values: list[float], path, title: str = "",
                       reference: dict[str, float] | None = None) -> Path:  # fmt: skip
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5, len(names) * 0.9), 3.5))
    xs = np.arange(len(names))
    ax.bar(xs - 0.2 if reference else xs, [100 * v for v in values], 0.4, label="edgefl")
    if reference:
        ax.bar(xs + 0.2, [reference.get(n, np.nan) for n in names], 0.4, label="paper")
        ax.legend()
    ax.set_xticks(xs, names, rotation=30, ha="right")
    ax.set_ylabel("top-1 accuracy (%)")
    ax.set_title(title)
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)
