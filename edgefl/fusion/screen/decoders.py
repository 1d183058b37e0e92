"""The decoders' screen: each judged on its images (nearest the other decoders' images of
the class asked for?) and by the classifiers kept (do they read its draws as the class asked
for?), set aside when neither finds knowledge in its draws; with no classifier in the
federation, on its images alone, by a committee of decoders."""

from __future__ import annotations

import numpy as np
import torch

from edgefl.fusion.screen.evidence import (
    COMMITTEE,
    KNOWS,
    PLAIN,
    _claimed,
    _informedness,
    _mean_and_worst,
    _shares,
    _uninformed,
)
from edgefl.fusion.screen.probe import Probe
from edgefl.fusion.screen.verdict import Verdict, _note

# A decoder whose draws vary with the latent under this share of what the plainly read
# decoders' draws vary is flat (measured: noise decoders 0.012-0.015; honest HAPT and MNIST
# decoders of 30 steps and up 0.4 or more, bench/results/robust_recheck.md)
FLAT = 0.1


def _screen_decoders_alone(decoders, probe: Probe) -> Verdict:
    if len(decoders) < COMMITTEE:
        return _note(
            f"decoders not screened: no classifier to judge their draws, and {len(decoders)} "
            f"are too few for a committee of their own (needs {COMMITTEE})"
        )
    return Verdict(_judge_decoders_alone(decoders, probe.x, probe.asked, probe.source), {}, [])


def _judge_decoders(decoders, x, source, asked, classifiers, probs, judges) -> dict[str, str]:
    """Each decoder judged on its images (`_image_scores`: do its draws lie nearest the other
    decoders' images of the class asked for?) and by the judging classifiers (indices into
    `classifiers`/`probs`, their mean probabilities on the probe: how much more often they read
    its draws for each class as that class than its draws of other classes,
    `_informedness`); set aside on the classifiers' rule when neither finds knowledge in its
    draws. Either can miss it: classifiers read generated samples of a sensor task poorly
    (measured, HAPT users: weakly trained honest decoders read at informedness -0.01 to +0.10;
    by their images +0.40 to +0.83), and a nearest-centroid reading in pixels misses sharp
    draws among blurred ones (MNIST: a decoder's 7s, read as 7 by every judge, at -0.04 by
    their images). A noise or random-weights decoder scored 0.00 by both on MNIST."""
    by_images = _image_scores(decoders, x, asked, source)
    by_judges = _judged_scores(decoders, source, asked, classifiers, probs, judges)
    flat = _flat(x, source, asked, by_judges)
    scores = [
        max((s for s in pair if s[0] is not None), key=lambda s: s[0], default=(None, None))
        if d not in flat
        else (None, None)
        for d, pair in enumerate(zip(by_images, by_judges, strict=True))
    ]
    out = _uninformed(
        decoders,
        scores,
        lambda s, c: (
            "its draws of the class asked for look no more like that class than its draws of "
            f"other classes do, to the other decoders' images and to the classifiers "
            f"(informedness {s:+.2f}, under {KNOWS:g}; its worst: class {c})"
        ),
    )
    # A flat decoder's draws differ by class by hundredths of a pixel, which a nearest
    # reference still tells apart: its images are no evidence, and the judges alone read it,
    # whatever the median decoder scores, since they read another plainly (measured, MNIST
    # Dir(0.5): two noise decoders, the only drawers of 1s and 9s, each other's reference at
    # +1.00 by images and read at 0.00 by every judge, seed 1; four of five, seed 0)
    for d in flat:
        s, c = by_judges[d]
        if s is not None and s < KNOWS:
            out[decoders[d].name] = (
                "its draws hardly vary with the latent (under a tenth of the spread of the "
                "decoders the classifiers read plainly) and the classifiers read them as no "
                f"class asked for (informedness {s:+.2f}, under {KNOWS:g}; its worst: class {c})"
            )
    return out


def _flat(x: torch.Tensor, source, asked, by_judges) -> set[int]:
    """The decoders whose draws spread (their mean distance to their class's mean draw) under
    FLAT times that of the decoders the judges read plainly (their median): a noise decoder
    outputs its training noise's mean whatever the latent ({} with no decoder read plainly;
    the scale is theirs, so the rule holds for pixels and sensor windows alike)."""
    xs = x.reshape(len(x), -1).numpy()
    spread = []
    for d in range(len(by_judges)):
        mine = source == d
        per = [
            np.linalg.norm(xs[m] - xs[m].mean(0), axis=1).mean()
            for m in (mine & (asked == c) for c in np.unique(asked[mine]))
        ]
        spread.append(float(np.mean(per)) if per else 0.0)
    plain = [spread[d] for d, (s, _) in enumerate(by_judges) if s is not None and s >= PLAIN]
    if not plain:
        return set()
    bar = FLAT * float(np.median(plain))
    return {d for d, s in enumerate(spread) if s < bar}


def _judged_scores(decoders, source, asked, classifiers, probs, judges) -> list[tuple]:
    """(mean informedness of the judges' reading over the decoder's classes, its worst class)
    per decoder (`_judged_per_class`)."""
    per = _judged_per_class(decoders, source, asked, classifiers, probs, judges)
    return [_mean_and_worst(scores) for scores in per]


def _judged_per_class(decoders, source, asked, classifiers, probs, judges) -> list[dict]:
    """{class: informedness of the judges' reading of its draws} per decoder; a class is judged
    by the judges that hold it, else by all of them ({} without judges)."""
    if not judges:
        return [{} for _ in decoders]
    readings = {}  # the judges of a class -> their reading of the whole probe

    def read(who: tuple[int, ...]) -> np.ndarray:
        if who not in readings:
            readings[who] = np.mean([probs[i] for i in who], axis=0).argmax(1)
        return readings[who]

    scores = []
    for d in range(len(decoders)):
        mine, held = source == d, _shares(decoders[d])
        per = {}
        for c in np.unique(asked[mine]):
            who = tuple(i for i in judges if c in _claimed(classifiers[i])) or tuple(judges)
            per[int(c)] = _informedness(read(who), asked, mine, int(c), held)
        scores.append(per)
    return scores


def _judge_decoders_alone(decoders, probe: torch.Tensor, asked, source) -> dict[str, str]:
    """Decoders with no classifier to judge them (a CVAE-only federation), on their images
    alone (`_image_scores`)."""
    # Here the judged are their own reference: fewer than a committee's scores judge nothing.
    return _uninformed(
        decoders,
        _image_scores(decoders, probe, asked, source),
        lambda s, c: (
            "its draws lie nearest the other decoders' images of the class asked for about "
            f"as often as its draws of other classes do (informedness {s:+.2f}, under "
            f"{KNOWS:g}; its worst: class {c})"
        ),
        least=COMMITTEE,
    )


def _image_scores(decoders, probe: torch.Tensor, asked, source) -> list[tuple]:
    """(mean informedness over its classes, its worst class) per decoder, read by its images:
    each class's reference is the coordinate-wise median, over the decoders that draw it, of
    their mean draws; a draw is read as the class whose reference lies nearest (a noise
    decoder's or another class's images lie elsewhere; a weakly trained one draws near its
    classes' means). Under label skew a class drawn by one decoder alone is its own reference:
    that decoder is judged on its other classes, and not at all (None) without one."""
    x = probe.reshape(len(probe), -1).numpy()
    shared = [c for c in sorted(set(asked.tolist())) if len(np.unique(source[asked == c])) >= 2]
    if not shared:
        return [(None, None)] * len(decoders)
    means = {
        c: np.median(
            np.stack(
                [x[(asked == c) & (source == d)].mean(0) for d in np.unique(source[asked == c])]
            ),
            axis=0,
        )
        for c in shared
    }
    # Only shared classes are read (and judged): a class one decoder alone draws has its own
    # images for reference, which read its other classes' draws as that class (measured, a
    # decoder of 7s and 9s, 9 drawn by no other: its 7s, read as 7 by every judge, were all
    # nearest its own 9s)
    centres = np.stack([means[c] for c in shared])
    d2 = (x**2).sum(1, keepdims=True) - 2 * x @ centres.T + (centres**2).sum(1)
    read = np.asarray(shared)[d2.argmin(1)]
    asked = np.where(np.isin(asked, shared), asked, -1)
    scores = []
    for d in range(len(decoders)):
        mine, held = source == d, _shares(decoders[d])
        per = {
            int(c): _informedness(read, asked, mine, int(c), held)
            for c in np.unique(asked[mine])
            if c >= 0
        }
        scores.append(_mean_and_worst(per))
    return scores
