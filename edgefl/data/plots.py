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
from edgefl.plots import label_text, save_figure
from edgefl.plots import new_figure as _new_figure

ANNOTATE_MAX_CELLS = 400  # beyond this many cells the numbers are unreadable anyway
NOT_HELD = "not held"  # the mark on a sample row whose class the client never trained on
NOT_HELD_GREY = "0.55"
# An image grid is one mosaic image with a 1-pixel white gutter: far faster than rows x cols axes.
_PAD = 1


def plot_label_heatmap(
    counts: np.ndarray,
    path: str | Path,
    class_names: Sequence[str] | None = None,
    title: str | None = None,
    users: Sequence[int] | None = None,
) -> Path:
    """Clients x classes heat map of label counts, annotated when small enough; returns the path.
    `users`: the user each client is (a user partition), named beside its row."""
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
    _label_axes(ax, k, c, class_names, users)
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


def _label_axes(ax, k: int, c: int, class_names, users) -> None:
    """Classes along x, clients (and the user each is) along y; ticks where they fit."""
    ax.set_xlabel("class")
    ax.set_ylabel("client" if users is None else "client (user)")
    if c <= 50:
        names = list(class_names) if class_names is not None else [str(i) for i in range(c)]
        ax.set_xticks(range(c), names, rotation=90 if max(map(len, names), default=0) > 3 else 0)
    if k <= 50:
        rows = [str(i) if users is None else f"{i} ({users[i]})" for i in range(k)]
        ax.set_yticks(range(k), rows)


def plot_image_grid(
    images: np.ndarray,
    path: str | Path,
    row_labels: Sequence[str] | None = None,
    title: str | None = None,
    held: Sequence[bool] | None = None,
) -> Path:
    """Save a (rows, cols, C, H, W) array of [0, 1] images as one grid PNG; returns the path.
    Rows whose `held` is False are greyed and labelled "not held"."""
    return save_figure(image_grid_figure(images, row_labels, title, held), path)


def _check_rows(rows: int, row_labels, held) -> None:
    for what, given in (("row labels", row_labels), ("held flags", held)):
        if given is not None and len(given) != rows:
            raise DataError(f"{len(given)} {what} for {rows} rows", hint="pass one per row")


def _row_names(rows: int, row_labels, held) -> list[str] | None:
    """Row labels with the "not held" mark added (labels default to the row's index then)."""
    if row_labels is not None:
        names = [label_text(s) for s in row_labels]
    elif held is not None and not all(held):
        names = [str(r) for r in range(rows)]
    else:
        return None
    if held is None:
        return names
    return [n if h else f"{n} ({NOT_HELD})" for n, h in zip(names, held, strict=True)]


def _not_held_note(held) -> str | None:
    """The caption that says what a grey row means, when there is one."""
    if held is None or all(held):
        return None
    return f"grey rows ({NOT_HELD}): classes this client had no sample of, so never learnt"


def image_grid_figure(
    images: np.ndarray,
    row_labels: Sequence[str] | None = None,
    title: str | None = None,
    held: Sequence[bool] | None = None,
):
    """The Figure `plot_image_grid` saves (tests read its axes)."""
    images = np.asarray(images, dtype=np.float32)
    if images.ndim != 5 or images.shape[2] not in (1, 3):
        raise DataError(
            f"expected images (rows, cols, C, H, W) with C in {{1, 3}}, got shape {images.shape}",
            hint="reshape the samples to (rows, cols, C, H, W)",
        )
    rows, cols, ch, h, w = images.shape
    _check_rows(rows, row_labels, held)
    mosaic = _mosaic(images)
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
    names = _row_names(rows, row_labels, held)
    if names is not None:
        ax.set_yticks([r * (h + _PAD) + (h - 1) / 2 for r in range(rows)], names)
    else:
        ax.set_yticks([])
    _grey_rows(ax, held, rows, h, mosaic.shape[1])
    for spine in ax.spines.values():
        spine.set_visible(False)
    if title:
        ax.set_title(title)
    if note := _not_held_note(held):
        ax.set_xlabel(note, fontsize=8, color=NOT_HELD_GREY)
    return fig


def _mosaic(images: np.ndarray) -> np.ndarray:
    """(rows, cols, C, H, W) images as one (H', W', C) picture in [0, 1], white between them."""
    rows, cols, ch, h, w = images.shape
    pad = _PAD
    mosaic = np.ones((rows * (h + pad) - pad, cols * (w + pad) - pad, ch), dtype=np.float32)
    for r in range(rows):
        for c in range(cols):
            y0, x0 = r * (h + pad), c * (w + pad)
            mosaic[y0 : y0 + h, x0 : x0 + w] = images[r, c].transpose(1, 2, 0)
    return np.clip(np.nan_to_num(mosaic), 0.0, 1.0)


def _grey_rows(ax, held: Sequence[bool] | None, rows: int, h: int, width: int) -> None:
    """Grey the label of each row not held, and lay a veil over it."""
    from matplotlib.patches import Rectangle

    ticks = ax.get_yticklabels()
    for r in range(rows):
        if held is not None and not held[r]:  # a grey veil over the row: drawn, but not learnt
            ticks[r].set_color(NOT_HELD_GREY)
            ax.add_patch(
                Rectangle(
                    (-0.5, r * (h + _PAD) - 0.5),
                    width,
                    h,
                    facecolor=NOT_HELD_GREY,
                    alpha=0.7,
                    gid=NOT_HELD,
                )
            )


def plot_signal_grid(
    windows: np.ndarray,
    path: str | Path,
    row_labels: Sequence[str] | None = None,
    title: str | None = None,
    channel_names: Sequence[str] | None = None,
    held: Sequence[bool] | None = None,
) -> Path:
    """Save a (rows, cols, C, 1, L) array of sensor windows in [0, 1] as a grid of small line
    plots, one line per channel (an image grid of a 1-pixel-high window shows nothing). Rows
    whose `held` is False are greyed and labelled "not held"."""
    return save_figure(signal_grid_figure(windows, row_labels, title, channel_names, held), path)


def signal_grid_figure(
    windows: np.ndarray,
    row_labels: Sequence[str] | None = None,
    title: str | None = None,
    channel_names: Sequence[str] | None = None,
    held: Sequence[bool] | None = None,
):
    """The Figure `plot_signal_grid` saves (tests read its axes). One axes, each window in its
    own framed cell, one line collection per channel: an axes per cell made a HAPT simulate's
    12 x 8 grids cost ~0.8 s each, most of its pictures' time."""
    windows = np.asarray(windows, dtype=np.float32)
    if windows.ndim != 5 or windows.shape[3] != 1:
        raise DataError(
            f"expected windows (rows, cols, C, 1, L), got shape {windows.shape}",
            hint="reshape the samples to (rows, cols, C, 1, L)",
        )
    rows, cols, _, _, length = windows.shape
    _check_rows(rows, row_labels, held)
    fig = _new_figure(min(1.5 + 1.6 * cols, 30.0), min(0.6 + 0.9 * rows, 30.0))
    ax = fig.add_subplot()
    cells = _Cells(rows, cols, length)
    greyed = [held is not None and not held[r] for r in range(rows)]
    values = np.clip(np.nan_to_num(windows[:, :, :, 0, :]), 0.0, 1.0)  # (rows, cols, C, L)
    _draw_windows(ax, cells, values, greyed, channel_names)
    _row_ticks(ax, cells, _row_names(rows, row_labels, held), greyed)
    for spine in ax.spines.values():
        spine.set_visible(False)
    if channel_names:
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if title:
        ax.set_title(title)
    if note := _not_held_note(held):
        ax.set_xlabel(note, fontsize=8, color=NOT_HELD_GREY)
    return fig


class _Cells:
    """Where each window sits: cell (r, c) spans x in [x0[c], x0[c] + length - 1] and y in
    [y0[r], y0[r] + 1] (values in [0, 1]), row 0 at the top, gutters between cells."""

    def __init__(self, rows: int, cols: int, length: int):
        self.length = length
        self.step_x = max(length - 1, 1) * 1.15
        self.x0 = np.arange(cols) * self.step_x
        self.y0 = (rows - 1 - np.arange(rows)) * 1.3
        self.right = self.x0[-1] + length - 1

    def frames(self) -> list[np.ndarray]:
        box = np.array([(0, 0), (self.length - 1, 0), (self.length - 1, 1), (0, 1), (0, 0)])
        return [box + (x, y) for y in self.y0 for x in self.x0]


def _draw_windows(ax, cells: _Cells, values: np.ndarray, greyed: list[bool], channel_names):
    """Each channel's windows as one line collection (rows not held fainter, over a grey band),
    the cells' frames, and the limits."""
    from matplotlib.collections import LineCollection
    from matplotlib.colors import to_rgba
    from matplotlib.patches import Rectangle

    rows, cols, ch, length = values.shape
    alpha = np.repeat([0.4 if g else 1.0 for g in greyed], cols)
    segs = np.empty((rows, cols, length, 2), dtype=np.float32)
    segs[..., 0] = cells.x0[None, :, None] + np.arange(length)
    for k in range(ch):
        segs[..., 1] = cells.y0[:, None, None] + values[:, :, k]
        colors = np.repeat(np.array(to_rgba(f"C{k % 10}"))[None], rows * cols, axis=0)
        colors[:, 3] = alpha
        label = label_text(channel_names[k]) if channel_names else None
        lines = LineCollection(segs.reshape(-1, length, 2), colors=colors, linewidths=0.7)
        lines.set_label(label)
        ax.add_collection(lines)
    ax.add_collection(LineCollection(cells.frames(), colors="black", linewidths=0.6))
    margin = 0.05 * cells.step_x
    for r in np.flatnonzero(greyed):  # a grey band behind the row: drawn, but not learnt
        band = Rectangle((-margin, cells.y0[r] - 0.1), cells.right + 2 * margin, 1.2)
        band.set(facecolor="0.85", zorder=0, gid=NOT_HELD)
        ax.add_patch(band)
    ax.set_xlim(-2 * margin, cells.right + 2 * margin)
    ax.set_ylim(-0.2, cells.y0[0] + 1.2)


def _row_ticks(ax, cells: _Cells, names: list[str] | None, greyed: list[bool]) -> None:
    ax.set_xticks([])
    ax.tick_params(left=False)
    if names is None:
        ax.set_yticks([])
        return
    ax.set_yticks(cells.y0 + 0.5, names, fontsize=8)
    for tick, grey in zip(ax.get_yticklabels(), greyed, strict=True):
        tick.set_color(NOT_HELD_GREY if grey else "black")
