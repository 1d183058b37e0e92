"""Windows of a body-worn sensor aligned in time, class by class, before a CVAE learns them.

Why (issue 32, bench/results/hapt_decoders.md): a window starts wherever the recording was cut,
so the gait cycle inside it sits at a random phase. A CVAE's decoder returns the mean of what
it saw for a (z, class), and the mean of one oscillation at random phases is a flat line: the
wristbands' decoders kept every class's gravity vector exactly but 1/7 to 1/12 of the walking
classes' movement, and the phones labelled 0% of their drawn walking windows as walking.
Aligned, the oscillation survives the mean. Images need none of this: digits come centred.

Each class's windows are shifted circularly to best match the class's template (its most
energetic window, then the mean of the aligned windows, for a few rounds), by circular
cross-correlation of their movement (each channel minus its mean) over all channels. It runs
on the device, in O(N L log L), and changes nothing the server sees but the decoder's outputs.
"""

from __future__ import annotations

import numpy as np

ROUNDS = 3  # the template settles after two or three rounds


def _shifts(moving: np.ndarray, rounds: int = ROUNDS) -> np.ndarray:
    """Circular shift per window (N, C, L) that best matches the class template."""
    spectra = np.fft.rfft(moving, axis=-1)
    template = moving[np.argmax((moving**2).sum(axis=(1, 2)))]
    shifts = np.zeros(len(moving), dtype=np.int64)
    for _ in range(rounds):
        t = np.fft.rfft(template, axis=-1)
        corr = np.fft.irfft((spectra * np.conj(t)[None]).sum(axis=1), n=moving.shape[-1], axis=-1)
        shifts = -corr.argmax(axis=-1)
        template = np.mean(
            [np.roll(m, s, axis=-1) for m, s in zip(moving, shifts, strict=True)], axis=0
        )
    return shifts


def align_windows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A copy of windows `x` (N, C, 1, L) with each class's windows aligned in time."""
    out = np.array(x, copy=True)
    if len(x) == 0:
        return out
    flat = out[:, :, 0, :]
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        moving = flat[idx] - flat[idx].mean(axis=-1, keepdims=True)
        for i, s in zip(idx, _shifts(moving), strict=True):
            out[i] = np.roll(x[i], int(s), axis=-1)
    return out
