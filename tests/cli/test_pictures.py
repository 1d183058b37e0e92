"""Pictures (issue 34 item 7): what is drawn, read from the matplotlib figures, not pixels.

Accuracy bars share one fixed 0-100 axis and mark the paper's number; decoder sample grids mark
the classes the client never held; the confusion matrix names every class.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
import pytest

import exporters
from edgefl.client.run import ClientJob, run_client
from edgefl.client.sample import held_classes, sample_figure
from edgefl.data.plots import NOT_HELD, image_grid_figure, signal_grid_figure
from edgefl.plots import (
    ACCURACY_LIMITS,
    PAPER_LABEL,
    accuracy_figure,
    confusion_figure,
    plot_accuracy_bars,
)
from edgefl.reproduce.render import table_figure


def _draws(fig) -> None:
    """The figure renders to PNG (a bad label fails here, not in a user's run)."""
    fig.savefig(io.BytesIO(), format="png")


def _paper_marks(ax) -> list[float]:
    """The heights of the paper's marks drawn on `ax`."""
    marks = [c for c in ax.collections if c.get_label() == PAPER_LABEL]
    return sorted(float(seg[0][1]) for c in marks for seg in c.get_segments())


def _legend(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().texts]


# --- accuracy bars ---------------------------------------------------------------------------


@pytest.mark.parametrize("values", [[0.21, 0.35, 0.12], [0.98, 0.91, 0.99]])
def test_accuracy_axis_is_fixed_whatever_the_values(values):
    fig = accuracy_figure(["fedavg", "ensemble", "fedmho"], values, title="digits")
    ax = fig.axes[0]
    assert ax.get_ylim() == ACCURACY_LIMITS == (0.0, 100.0)
    assert [round(p.get_height(), 6) for p in ax.patches] == [round(100 * v, 6) for v in values]
    assert _paper_marks(ax) == [] and PAPER_LABEL not in _legend(fig)
    _draws(fig)


def test_accuracy_bars_mark_the_paper_where_it_has_a_number(tmp_path):
    ref = {"fedavg": 72.5, "fedmho": 88.0, "not-in-this-run": 50.0}
    fig = accuracy_figure(["fedavg", "ensemble", "fedmho"], [0.3, None, 0.9], reference=ref)
    ax = fig.axes[0]
    assert _paper_marks(ax) == [72.5, 88.0]  # one per method with a number, none for ensemble
    assert set(_legend(fig)) == {"edgefl", PAPER_LABEL}
    assert ax.get_ylim() == (0.0, 100.0)
    _draws(fig)
    png = plot_accuracy_bars(["fedavg"], [0.5], tmp_path / "a.png", reference=ref)
    assert Path(png).read_bytes()[:4] == b"\x89PNG"


def _cell(mean, paper, error=None):
    return {"mean": mean, "std": None if mean is None else 1.5, "paper": paper, "error": error}


def test_reproduce_table_panels_share_the_axis_and_mark_the_paper():
    summary = {
        "title": "tiny",
        "budget": {"name": "cpu"},
        "partitions": ["dirichlet:0.1", "dirichlet:0.5"],
        "rows": [
            {
                "method": "fedavg",
                "partitions": {
                    "dirichlet:0.1": _cell(20.0, None),
                    "dirichlet:0.5": _cell(30.0, 61.2),
                },
            },
            {
                "method": "fedmho",
                "partitions": {
                    "dirichlet:0.1": _cell(None, 70.0, "refused"),
                    "dirichlet:0.5": _cell(35.0, 80.4),
                },
            },
        ],
    }
    fig = table_figure(summary)
    low, high = fig.axes[:2]
    assert low.get_ylim() == high.get_ylim() == (0.0, 100.0)
    assert _paper_marks(low) == [70.0] and _paper_marks(high) == [61.2, 80.4]
    assert "refused" in [t.get_text() for t in low.texts]
    assert PAPER_LABEL in _legend(fig)
    _draws(fig)


# --- confusion matrix ------------------------------------------------------------------------


@pytest.mark.parametrize("classes", [10, 14, 100])
def test_confusion_labels_every_class(classes):
    names = [f"class-{i}" for i in range(classes)]
    conf = np.random.default_rng(0).integers(0, 50, (classes, classes))
    fig = confusion_figure(conf, title="t", class_names=names)
    ax = fig.axes[0]
    for ticks in (ax.get_xticklabels(), ax.get_yticklabels()):
        assert [t.get_text() for t in ticks] == names
    sizes = {t.get_fontsize() for t in ax.get_xticklabels()}
    assert len(sizes) == 1 and 4 <= sizes.pop() <= 9
    assert {t.get_rotation() for t in ax.get_xticklabels()} == {90.0}  # long names stand up
    _draws(fig)


def test_confusion_without_names_numbers_every_class_and_draws_hostile_names():
    ax = confusion_figure(np.eye(12, dtype=int)).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(i) for i in range(12)]
    # Names from an upload: mathtext and control characters must not break the save.
    fig = confusion_figure(np.eye(3, dtype=int), class_names=["$\\frac$", "a\x1b[31m", "x" * 80])
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert "\x1b" not in labels[1] and len(labels[2]) <= 24
    _draws(fig)


def test_eval_plot_names_the_classes(cli, tmp_path, monkeypatch, artifacts):
    import edgefl.plots

    seen = {}
    monkeypatch.setattr(
        edgefl.plots,
        "plot_confusion",
        lambda conf, path, title="", class_names=None: (
            seen.update(names=class_names, shape=conf.shape) or Path(path)
        ),
    )
    clf, _ = artifacts
    r = cli("eval", str(clf), "--dataset", "digits", "--plot", str(tmp_path / "c.png"))
    assert r.exit_code == 0, r.output
    assert seen["shape"] == (10, 10) and [str(n) for n in seen["names"]] == [
        str(i) for i in range(10)
    ]


# --- decoder sample grids --------------------------------------------------------------------


def test_held_classes_from_label_counts():
    assert held_classes({"num_classes": 3, "label_counts": [4, 0, 1]}) == [True, False, True]
    assert held_classes({"num_classes": 3}) is None  # an upload that does not say: no marks
    assert held_classes({"num_classes": 3, "label_counts": [1, 2]}) is None


def test_image_grid_marks_rows_not_held():
    images = np.random.default_rng(0).random((3, 4, 1, 8, 8))
    fig = image_grid_figure(images, row_labels=["zero", "one", "two"], held=[True, False, True])
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["zero", f"one ({NOT_HELD})", "two"]
    veils = [p for p in ax.patches if p.get_gid() == NOT_HELD]
    assert len(veils) == 1 and veils[0].get_y() == pytest.approx(9 - 0.5)  # row 1: (8 + 1) * 1
    assert NOT_HELD in ax.get_xlabel()  # the caption says what grey means
    _draws(fig)
    # Every class held (or no counts): nothing marked.
    ax = image_grid_figure(images, row_labels=["a", "b", "c"], held=[True] * 3).axes[0]
    assert not [p for p in ax.patches if p.get_gid() == NOT_HELD] and not ax.get_xlabel()
    assert NOT_HELD not in " ".join(t.get_text() for t in ax.get_yticklabels())


def test_signal_grid_marks_rows_not_held():
    windows = np.random.default_rng(0).random((3, 2, 3, 1, 16))
    fig = signal_grid_figure(
        windows, row_labels=["walk", "sit", "lie"], held=[False, True, True], channel_names="xyz"
    )
    (ax,) = fig.axes
    veils = [p for p in ax.patches if p.get_gid() == NOT_HELD]
    assert len(veils) == 1 and veils[0].get_y() > 2 * 1.0  # behind the top row only
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"walk ({NOT_HELD})", "sit", "lie"]
    assert NOT_HELD in ax.get_xlabel()
    # Every window drawn, channel by channel: 3 x 2 cells of 16 steps in each channel's lines,
    # the not-held row fainter.
    lines = [c for c in ax.collections if c.get_label() in ("x", "y", "z")]
    assert [len(c.get_segments()) for c in lines] == [6, 6, 6]
    assert {len(s) for c in lines for s in c.get_segments()} == {16}
    alphas = lines[0].get_colors()[:, 3]
    assert list(alphas) == [0.4, 0.4, 1.0, 1.0, 1.0, 1.0]
    top = lines[0].get_segments()[0][:, 1]
    want = windows[0, 0, 0, 0]
    np.testing.assert_allclose(top - top.min() + want.min(), want, atol=1e-5)  # float32 offset
    _draws(fig)
    # Every class held: nothing marked.
    ax = signal_grid_figure(windows, row_labels=["a", "b", "c"], held=[True] * 3).axes[0]
    assert not [p for p in ax.patches if p.get_gid() == NOT_HELD] and not ax.get_xlabel()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """A small classifier and a small decoder trained on digits through the client path."""
    out = tmp_path_factory.mktemp("uploads")
    common = dict(profile="wristband", dataset="digits", out_dir=str(out), num_clients=4, epochs=1)
    clf = run_client(ClientJob(**common, model="scnn:width=8", client_id="clf"))
    dec = run_client(ClientJob(**common, model="cvae-mlp:hidden=16", client_id="dec"))
    return clf.path, dec.path


def test_decoder_grid_marks_the_classes_its_client_never_held(cli, artifacts, tmp_path):
    _, dec = artifacts
    model = onnx.load(dec)
    meta = exporters.get_metadata(model)
    counts = list(meta["label_counts"])
    counts[3] = counts[7] = 0  # as if the partition had left this client without 3 and 7
    exporters.set_metadata(model, dict(meta, label_counts=counts))
    path = tmp_path / "dec.onnx"
    onnx.save(model, path)

    ax = sample_figure(str(path), per_class=2).axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert [i for i, s in enumerate(labels) if NOT_HELD in s] == [3, 7]
    assert len([p for p in ax.patches if p.get_gid() == NOT_HELD]) == 2
    r = cli("client", "sample", str(path), "--per-class", "2", "--out", str(tmp_path / "g.png"))
    assert r.exit_code == 0, r.output
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
