"""Result pictures (confusion matrices, accuracy bars), saved atomically as PNG.

Each picture is built by a `*_figure` function that returns the matplotlib Figure (tests read
its axes, not its pixels) and saved by a `plot_*` function. Figures are made through the object
API on the Agg canvas: pyplot's global backend and figure registry are never touched, so drawing
from a notebook or a worker thread is safe and nothing needs closing.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from exporters.atomic import atomic_write_bytes

# Every accuracy picture shares one axis, so two runs' pictures compare at a glance.
ACCURACY_LIMITS = (0.0, 100.0)
PAPER_LABEL = "paper"


def save_figure(fig, path, dpi: int = 120) -> Path:
    """Save a matplotlib figure as PNG atomically (a reader never sees half a file), with the
    mode a plain write would give (the user's umask)."""
    from edgefl.outputs import PNG_SOFTWARE

    buf = io.BytesIO()
    # marked as edgefl's: a rerun may replace this picture, never a file edgefl did not draw
    fig.savefig(
        buf, format="png", dpi=dpi, bbox_inches="tight", metadata={"Software": PNG_SOFTWARE}
    )
    return atomic_write_bytes(path, buf.getvalue())


def new_figure(width: float, height: float):
    """A Figure on its own Agg canvas, outside pyplot."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def label_text(text, limit: int = 24) -> str:
    """A name from an upload as a tick label that draws as written: control characters escaped,
    `$` kept from starting mathtext (which fails the whole save), cut to `limit` characters."""
    from edgefl.progress import printable

    text = printable(text)
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return text.replace("$", r"\$")


def class_tick_style(names: Sequence[str], pitch_pt: float) -> dict:
    """Font size and rotation for one tick per class, `pitch_pt` points apart: the font follows
    the room a class has (4-9 pt), long names or many classes turn upright."""
    longest = max((len(s) for s in names), default=1)
    size = min(9.0, max(4.0, 0.55 * pitch_pt))
    return {"fontsize": size, "rotation": 90 if longest > 3 or len(names) > 20 else 0}


# --- accuracy bars -------------------------------------------------------------------------


def draw_accuracy_bars(
    ax,
    names: Sequence[str],
    ours: Sequence[float | None],
    paper: Sequence[float | None] | None = None,
    err: Sequence[float | None] | None = None,
    label: str = "edgefl",
) -> None:
    """Our accuracies (%) as bars on the fixed 0-100 axis, the paper's number (%) as a black
    line across each bar that has one; a missing value of ours leaves its slot empty."""
    xs = np.arange(len(names))
    heights = [np.nan if v is None else float(v) for v in ours]
    yerr = None if err is None else [0.0 if e is None else float(e) for e in err]
    bars = ax.bar(xs, heights, 0.6, yerr=yerr, capsize=3 if yerr else 0, label=label)
    ax.bar_label(
        bars,
        labels=["" if np.isnan(h) else f"{h:.1f}" for h in heights],
        label_type="center",
        fontsize=7,
        color="white",
    )
    _draw_paper_marks(ax, xs, paper)
    ax.set_xticks(xs, list(names), rotation=30, ha="right")
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_ylim(*ACCURACY_LIMITS)
    ax.set_yticks(np.arange(0, 101, 20))
    ax.set_ylabel("top-1 accuracy (%)")


def _draw_paper_marks(ax, xs: np.ndarray, paper: Sequence[float | None] | None) -> None:
    """The paper's number (%) as a black line across each bar that has one."""
    marks = [(x, float(p)) for x, p in zip(xs, paper or [], strict=False) if p is not None]
    if marks:
        ax.hlines(
            [p for _, p in marks],
            [x - 0.4 for x, _ in marks],
            [x + 0.4 for x, _ in marks],
            colors="black",
            linewidth=2.5,
            label=PAPER_LABEL,
            zorder=3,
        )


def accuracy_legend(ax, panels: Sequence = ()) -> None:
    """The legend above `ax`'s right corner, where no bar (however tall) can hide it; with
    `panels`, every entry any of them drew (a paper mark may exist in one panel only)."""
    seen: dict[str, object] = {}
    for a in list(panels) or [ax]:
        for handle, text in zip(*a.get_legend_handles_labels(), strict=True):
            seen.setdefault(text, handle)
    ax.legend(
        list(seen.values()),
        list(seen),
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        ncol=2,
        fontsize=8,
        frameon=False,
    )


def accuracy_figure(
    names: list[str],
    values: list[float | None],
    title: str = "",
    reference: dict[str, float] | None = None,
):
    """Accuracies (fractions) per method, with the paper's number (%) for each method that has
    one in `reference`."""
    fig = new_figure(max(5.0, len(names) * 0.9), 3.5)
    ax = fig.add_subplot()
    ours = [None if v is None else 100 * v for v in values]
    paper = [(reference or {}).get(n) for n in names]
    draw_accuracy_bars(ax, names, ours, paper)
    ax.set_title(title, loc="left")
    accuracy_legend(ax)
    return fig


def plot_accuracy_bars(
    names: list[str],
    values: list[float | None],
    path,
    title: str = "",
    reference: dict[str, float] | None = None,
) -> Path:
    return save_figure(accuracy_figure(names, values, title, reference), path)


# --- confusion matrix ----------------------------------------------------------------------


def confusion_figure(
    confusion: np.ndarray, title: str = "", class_names: Sequence[str] | None = None
):
    """Counts of (true, predicted) with a tick and a name on every class."""
    confusion = np.asarray(confusion)
    c = confusion.shape[0]
    if class_names is not None and len(class_names) == c:
        names = [label_text(n) for n in class_names]
    else:
        names = [str(i) for i in range(c)]
    side = min(max(4.5, 2.0 + 0.2 * c), 24.0)  # inches; about 1.5 of them are not the matrix
    fig = new_figure(side + 0.8, side)
    ax = fig.add_subplot()
    im = ax.imshow(confusion, cmap="Blues", interpolation="nearest")
    fig.colorbar(im, ax=ax, label="samples")
    style = class_tick_style(names, pitch_pt=(side - 1.5) * 72 / c)
    ax.set_xticks(range(c), names, **style)
    ax.set_yticks(range(c), names, fontsize=style["fontsize"])
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    return fig


def plot_confusion(
    confusion: np.ndarray, path, title: str = "", class_names: Sequence[str] | None = None
) -> Path:
    return save_figure(confusion_figure(confusion, title, class_names), path)
