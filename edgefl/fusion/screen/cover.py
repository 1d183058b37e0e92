"""Covering, for the classifiers' repair only, the classes the probe lacks: images inverted
from the judges that hold the class. Run only when some classifier looks relabelled (inverting
costs ~45 s a class on 2 CPUs)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from edgefl.artifacts import Upload
from edgefl.fusion.inversion import invert
from edgefl.fusion.screen.evidence import (
    COMMITTEE,
    MIN_SAMPLES,
    SURE,
    _claimed,
    _classify,
    _shares,
)
from edgefl.progress import no_progress

INVERSION_STEPS = 200  # Adam steps per inverted image (pFedZKD's default inversion_steps)
INVERSION_LR = 0.1  # pFedZKD's default inversion_lr; tau 1: plain cross-entropy to the class
COVER = 40  # inverted images per class the probe lacks (MIN_SAMPLES twice; cost is per image)


class Cover(NamedTuple):
    """`_cover`'s images, the class each was inverted for, a source < 0 per judge and class,
    and the note that says which classes were covered from whom."""

    x: torch.Tensor
    asked: np.ndarray
    source: np.ndarray
    note: str


def _cover(reference, classifiers, judges, shape, k, seed, device, progress=None) -> Cover | None:
    """Images of each class the probe lacks (fewer than MIN_SAMPLES reference samples) that a
    judge holds: COVER in all, inverted from the (at most COMMITTEE) judges holding most of it
    in turn (Adam on the input, as Multi-ZSKD does), those it then reads as the class: a Cover
    (images, their class, a source < 0 per judge and class, so `_most` counts judges as it
    counts decoders and `_relabelling` tells them from draws; the note), or None. Inverted images of
    one small CNN are read as their class by others that hold it (measured on the bench's
    MNIST clients: 64 of 64 for 6 of 8 classes; not always, so they only serve as a target).
    Deterministic for a seed on a CPU (a GPU's convolution gradients are not bit-exact)."""
    gen = torch.Generator().manual_seed(seed + 1)  # the probe's own draws stay as they were
    progress = progress or no_progress
    xs, ys, src, covered = [], [], [], {}
    todo = [
        (a, _holders(classifiers, judges, a))
        for a in range(k)
        if (reference == a).sum() < MIN_SAMPLES
    ]
    total, done = sum(len(holders) for _, holders in todo), 0
    for a, holders in todo:
        for j, i in enumerate(holders):
            progress(
                "robust screen: inversion",
                done,
                total,
                f"class {a} from {classifiers[i].client_id}",
            )
            n = COVER // len(holders) + (j < COVER % len(holders))
            x = _inverted(classifiers[i], a, n, k, shape, gen, device)
            done += 1
            if not len(x):
                continue
            xs.append(x)
            ys.append(np.full(len(x), a))
            src.append(np.full(len(x), -1 - len(src)))  # decoders' sources are >= 0
            covered.setdefault(a, []).append(classifiers[i].client_id)
    if total:
        progress("robust screen: inversion", total, total)
    if not xs:
        return None
    note = (
        "for the repair, classes no probe sample showed were covered by images "
        "inverted from classifiers that hold them: "
        + "; ".join(f"{a} ({', '.join(who)})" for a, who in covered.items())
    )
    return Cover(torch.cat(xs), np.concatenate(ys), np.concatenate(src), note)


def _holders(classifiers, judges, a: int) -> list[int]:
    """The judges (at most COMMITTEE) with a rebuilt module that hold class a, most of it first."""
    held = [i for i in judges if classifiers[i].rebuilt and a in _claimed(classifiers[i])]
    return sorted(held, key=lambda i: -_shares(classifiers[i])[a])[:COMMITTEE]


def _inverted(u: Upload, a: int, n: int, k: int, shape, gen, device) -> torch.Tensor:
    """n images inverted from the classifier for class a, those it then reads as a."""
    x = invert(
        u.module,  # read once; `_classify` reads it again, once
        torch.eye(k)[[a] * n],
        shape,
        steps=INVERSION_STEPS,
        lr=INVERSION_LR,
        tau=1.0,
        gen=gen,
        device=device,
    )
    return x[torch.from_numpy(_classify(u, x, device)[0][:, a] >= SURE)]
