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


def _fit(moving: np.ndarray, rounds: int = ROUNDS) -> tuple[np.ndarray, np.ndarray]:
    """(the shifts, the template the last round matched them to)."""
    template = moving[np.argmax((moving**2).sum(axis=(1, 2)))]
    shifts = np.zeros(len(moving), dtype=np.int64)
    for _ in range(rounds):
        used = template
        shifts = _match(moving, used)
        template = np.mean(
            [np.roll(m, s, axis=-1) for m, s in zip(moving, shifts, strict=True)], axis=0
        )
    return shifts, used


def _match(moving: np.ndarray, template: np.ndarray) -> np.ndarray:
    """Shift per window maximising its circular cross-correlation with `template`."""
    spectra = np.fft.rfft(moving, axis=-1)
    t = np.fft.rfft(template, axis=-1)
    corr = np.fft.irfft((spectra * np.conj(t)[None]).sum(axis=1), n=moving.shape[-1], axis=-1)
    return -corr.argmax(axis=-1)


def align_windows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A copy of windows `x` (N, C, 1, L) with each class's windows aligned in time."""
    return _rolled(x, y, lambda c, moving: _fit(moving)[0])


def align_like(x_ref: np.ndarray, y_ref: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A copy of windows `x` aligned to the class templates `align_windows(x_ref, y_ref)` ends
    with: a window of `x_ref` is shifted exactly as it was there, any other as it would have
    been (a decoder's audit queries its training windows as it saw them). A class `x_ref`
    lacks is left as recorded."""
    ref = np.asarray(x_ref)[:, :, 0, :]

    def shifts(c, moving: np.ndarray) -> np.ndarray | None:
        own = ref[y_ref == c]
        if len(own) == 0:
            return None
        return _match(moving, _fit(own - own.mean(axis=-1, keepdims=True))[1])

    return _rolled(x, y, shifts)


def _rolled(x: np.ndarray, y: np.ndarray, shifts) -> np.ndarray:
    """A copy of `x` with each class c's windows rolled by shifts(c, their movement) (None:
    left as they are); the movement is each channel minus its mean."""
    out = np.array(x, copy=True)
    if len(x) == 0:
        return out
    flat = out[:, :, 0, :]
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        found = shifts(c, flat[idx] - flat[idx].mean(axis=-1, keepdims=True))
        if found is None:
            continue
        for i, s in zip(idx, found, strict=True):
            out[i] = np.roll(x[i], int(s), axis=-1)
    return out
