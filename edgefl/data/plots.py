"""PNG figures for partitions and generated samples.

matplotlib is imported inside each function so `import edgefl` stays fast, and only through its
object API with the Agg canvas: pyplot's global backend and figure registry are never touched, so
plotting from a notebook or a worker thread is safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edgefl.errors import DataError
from edgefl.plots import save_figure

ANNOTATE_MAX_CELLS = 400  # beyond this many cells the numbers are unreadable anyway


def _new_figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def plot_label_heatmap(
    counts: np.ndarray,
    path: str | Path,
    class_names: Sequence[str] | None = None,
    title: str | None = None,
) -> Path:
    """Clients x classes heat map of label counts, annotated when small enough; returns the path."""
    counts = np.asarray(counts)
    if counts.ndim != 2:
        raise DataError(
            f"expected a (clients x classes) count matrix, got shape {counts.shape}",
            hint="build it with edgefl.data.label_count_matrix",
        )
    k, c = counts.shape
    fig = _new_figure(min(2.0 + 0.45 * c, 30.0), min(1.5 + 0.35 * k, 30.0))
    ax = fig.add_subplot()
    im = ax.imshow(counts, cmap="viridis", aspect="auto", interpolation="nearest")
    fig.colorbar(im, ax=ax, label="samples")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    if c <= 50:
        names = list(class_names) if class_names is not None else [str(i) for i in range(c)]
        ax.set_xticks(range(c), names, rotation=90 if max(map(len, names), default=0) > 3 else 0)
    if k <= 50:
        ax.set_yticks(range(k), [str(i) for i in range(k)])
    if k * c <= ANNOTATE_MAX_CELLS:
        mid = counts.max() / 2 if counts.size else 0
        for i in range(k):
            for j in range(c):
                ax.text(
                    j,
                    i,
                    str(int(counts[i, j])),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black" if counts[i, j] > mid else "white",
                )
    ax.set_title(title or f"label counts: {k} clients x {c} classes")
    return save_figure(fig, path)


def plot_image_grid(
    images: np.ndarray,
    path: str | Path,
    row_labels: Sequence[str] | None = None,
    title: str | None = None,
) -> Path:
    """Save a (rows, cols, C, H, W) array of [0, 1] images as one grid PNG; returns the path."""
    images = np.asarray(images, dtype=np.float32)
    if images.ndim != 5 or images.shape[2] not in (1, 3):
        raise DataError(
            f"expected images (rows, cols, C, H, W) with C in {{1, 3}}, got shape {images.shape}",
            hint="reshape the samples to (rows, cols, C, H, W)",
        )
    if row_labels is not None and len(row_labels) != images.shape[0]:
        raise DataError(
            f"{len(row_labels)} row labels for {images.shape[0]} rows",
            hint="pass one label per row",
        )
    rows, cols, ch, h, w = images.shape
    # One mosaic image with a 1-pixel white gutter draws far faster than rows x cols axes.
    pad = 1
    mosaic = np.ones((rows * (h + pad) - pad, cols * (w + pad) - pad, ch), dtype=np.float32)
    for r in range(rows):
        for c in range(cols):
            y0, x0 = r * (h + pad), c * (w + pad)
            mosaic[y0 : y0 + h, x0 : x0 + w] = images[r, c].transpose(1, 2, 0)
    mosaic = np.clip(np.nan_to_num(mosaic), 0.0, 1.0)

    scale = max(1.0, 48.0 / max(h, w))  # small images (8x8 digits) get more room per pixel
    width = min(1.5 + cols * w * scale / 100 * 1.2, 30.0)
    height = min(0.8 + rows * h * scale / 100 * 1.2, 30.0)
    fig = _new_figure(width, height)
    ax = fig.add_subplot()
    if ch == 1:
        ax.imshow(mosaic[:, :, 0], cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    else:
        ax.imshow(mosaic, interpolation="nearest")
    ax.set_xticks([])
    if row_labels is not None:
        ax.set_yticks([r * (h + pad) + (h - 1) / 2 for r in range(rows)], list(row_labels))
    else:
        ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)
    if title:
        ax.set_title(title)
    return save_figure(fig, path)


def plot_signal_grid(
    windows: np.ndarray,
    path: str | Path,
    row_labels: Sequence[str] | None = None,
    title: str | None = None,
    channel_names: Sequence[str] | None = None,
) -> Path:
    """Save a (rows, cols, C, 1, L) array of sensor windows in [0, 1] as a grid of small line
    plots, one line per channel (an image grid of a 1-pixel-high window shows nothing)."""
    windows = np.asarray(windows, dtype=np.float32)
    if windows.ndim != 5 or windows.shape[3] != 1:
        raise DataError(
            f"expected windows (rows, cols, C, 1, L), got shape {windows.shape}",
            hint="reshape the samples to (rows, cols, C, 1, L)",
        )
    rows, cols, ch, _, length = windows.shape
    if row_labels is not None and len(row_labels) != rows:
        raise DataError(f"{len(row_labels)} row labels for {rows} rows", hint="one per row")
    fig = _new_figure(min(1.5 + 1.6 * cols, 30.0), min(0.6 + 0.9 * rows, 30.0))
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
    t = np.arange(length)
    for r in range(rows):
        for c in range(cols):
            ax = axes[r, c]
            for k in range(ch):
                ax.plot(t, np.nan_to_num(windows[r, c, k, 0]), linewidth=0.7,
                        label=channel_names[k] if channel_names else None)  # fmt: skip
            ax.set_ylim(0.0, 1.0)
            ax.set_xticks([])
            ax.set_yticks([])
        if row_labels is not None:
            axes[r, 0].set_ylabel(row_labels[r], rotation=0, ha="right", va="center", fontsize=8)
    if channel_names:
        axes[0, -1].legend(fontsize=6, loc="upper right")
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)
