"""The probe every upload is judged on: each decoder's draws of the classes it claims,
labelled with the class asked for (a reference a minority cannot move), else the method's public
set, labelled later by a committee of the classifiers."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from edgefl.artifacts import Upload
from edgefl.fusion.samples import decode
from edgefl.fusion.screen.evidence import _claimed

PER_CLASS = 64  # probe samples a decoder draws per class it claims


class Probe(NamedTuple):
    """What every upload is judged on: inputs, the class each decoder draw was asked for (None
    for a public set, labelled by a committee), and the decoder that drew each (0 for a public
    set; `_cover`'s inverted images, kept outside the probe, use -1 - j)."""

    x: torch.Tensor
    asked: np.ndarray | None
    source: np.ndarray


def _make_probe(decoders, gen, device, public) -> Probe | None:
    """The decoders' draws of every class each claims; else the method's public set."""
    probe = _probe(decoders, gen, device)
    if probe is not None:
        return probe
    x = public() if public is not None else None
    return None if x is None else Probe(torch.from_numpy(x), None, np.zeros(len(x), np.int64))


def _probe(decoders: list[Upload], gen, device) -> Probe | None:
    """Draws of every decoder for each class it claims, with the class each was asked for and
    the index of the decoder that drew it (None: no decoder claims a class)."""
    xs, ys, src = [], [], []
    for i, u in enumerate(decoders):
        with u.loaded():  # one read of a parked decoder for all its classes
            for c in _claimed(u):
                xs.append(decode(u, np.full(PER_CLASS, c), gen, device).cpu())
                ys.append(np.full(PER_CLASS, c))
                src.append(np.full(PER_CLASS, i))
    if not xs:
        return None
    return Probe(torch.cat(xs), np.concatenate(ys), np.concatenate(src))
