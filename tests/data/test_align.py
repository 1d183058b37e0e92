"""Sensor windows aligned class by class before a CVAE learns them (edgefl.data.align): the
mean of aligned windows keeps the movement that the mean of windows cut at random phases loses."""

from __future__ import annotations

import numpy as np

from edgefl.data.align import align_windows


def _gait(n: int, phase_seed: int, freq: float = 2.0, channels: int = 3) -> np.ndarray:
    """n windows (n, C, 1, 128) of a 50 Hz oscillation plus a harmonic, each cut at a random
    phase, on an offset (gravity) per channel."""
    t = np.arange(128) / 50.0
    phases = np.random.default_rng(phase_seed).uniform(0, 2 * np.pi, n)
    wave = np.sin(2 * np.pi * freq * t[None] + phases[:, None])
    wave += 0.5 * np.sin(4 * np.pi * freq * t[None] + 2 * phases[:, None] + 0.3)
    gains = np.array([0.10, 0.05, 0.03])[:channels]
    offsets = np.array([0.75, 0.45, 0.47])[:channels]
    return (offsets[None, :, None] + gains[None, :, None] * wave[:, None]).astype(np.float32)[
        :, :, None, :
    ]


def _movement(x: np.ndarray) -> float:
    """Std over time of the class mean window: what a decoder's mean can keep."""
    mean = x.mean(axis=0)[:, 0, :]
    return float(mean.std(axis=-1).sum())


def test_aligned_windows_keep_their_movement_in_the_mean():
    x = np.concatenate([_gait(200, 0), _gait(200, 1, freq=1.0)])
    y = np.repeat([0, 1], 200)
    out = align_windows(x, y)
    for c in (0, 1):
        one = _movement(x[y == c][:1])  # a single window's movement
        assert _movement(x[y == c]) < 0.2 * one  # random phases: the mean is nearly flat
        assert _movement(out[y == c]) > 0.9 * one  # aligned: it keeps the oscillation
    # Each window is its own, shifted in time: values and gravity unchanged, order kept.
    for a, b in zip(x, out, strict=True):
        assert any(np.array_equal(np.roll(a, s, axis=-1), b) for s in range(128))
    np.testing.assert_allclose(out.mean(axis=-1), x.mean(axis=-1), atol=1e-6)
    assert np.array_equal(align_windows(x, y), out)  # deterministic


def test_classes_are_aligned_apart_and_nothing_is_changed_in_place():
    x = _gait(30, 2)
    y = np.zeros(30, dtype=np.int64)
    y[::2] = 1
    before = x.copy()
    out = align_windows(x, y)
    assert np.array_equal(x, before)
    assert np.array_equal(out[y == 1], align_windows(x[y == 1], y[y == 1]))
    assert align_windows(x[:0], y[:0]).shape == (0, 3, 1, 128)


def test_window_jitter_starts_each_window_at_its_own_time():
    # Decoders that learnt aligned windows draw them all at one phase; the jitter every model
    # of windows trains with starts each window anywhere, as a recording is cut.
    import torch

    from edgefl.models.augment import rotate_windows

    x = torch.from_numpy(_gait(64, 3))
    out = rotate_windows(x, torch.Generator().manual_seed(0), degrees=0.0, gain=0.0)
    shifts = set()
    for a, b in zip(x, out, strict=True):
        found = [s for s in range(128) if torch.allclose(torch.roll(a, s, dims=-1), b, atol=1e-6)]
        assert found, "each output is its own window shifted in time"
        shifts.add(found[0])
    assert len(shifts) > 32


def test_auto_pixels_draw_images_but_not_windows():
    from edgefl.fusion.samples import _draws

    assert _draws("auto", (1, 28, 28)) and not _draws("auto", (3, 1, 128))
    assert _draws("bernoulli", (3, 1, 128)) and not _draws("mean", (1, 28, 28))


def test_align_like_shifts_a_reference_window_as_its_own_alignment_did():
    from edgefl.data import load_dataset
    from edgefl.data.align import align_like

    ds = load_dataset("hapt")
    x, y = ds.x[:600], ds.y[:600]
    ref = align_windows(x, y)
    assert np.array_equal(align_like(x, y, x, y), ref)
    # a few of the windows queried alone, with others the reference never held
    pick = np.r_[0:40, 300:320]
    queries = np.concatenate([x[pick], ds.x[4000:4040]])
    labels = np.concatenate([y[pick], ds.y[4000:4040]])
    got = align_like(x, y, queries, labels)
    assert np.array_equal(got[: len(pick)], ref[pick])
