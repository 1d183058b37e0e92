"""Result pictures (confusion matrices, accuracy bars), saved atomically as PNG."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from exporters.atomic import atomic_write_bytes


def save_figure(fig, path, dpi: int = 120) -> Path:
    """Save a matplotlib figure as PNG atomically (a reader never sees half a file), with the
    mode a plain write would give (the user's umask)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return atomic_write_bytes(path, buf.getvalue())


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
        return save_figure(fig, path)
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
        return save_figure(fig, path)
    finally:
        plt.close(fig)
