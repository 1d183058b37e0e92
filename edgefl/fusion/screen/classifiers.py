"""The classifiers' and prediction tables' screen: set aside those whose outputs rank the
samples of their classes no better than chance (or one class clearly below it), temper those
whose logits spread far over the median client's (sound knowledge, outsized weight in an
average), and say so when there are too few to judge."""

from __future__ import annotations

import itertools

import numpy as np

import exporters
from edgefl.artifacts import Upload
from edgefl.fusion.screen.copies import _adjusted
from edgefl.fusion.screen.evidence import (
    COMMITTEE,
    KNOWS,
    _claimed,
    _classify,
    _committee,
    _ranking,
    _uninformed,
    informative,
)
from edgefl.fusion.screen.verdict import Verdict, _note

SCALE_RATIO = 5.0


def _unscreenable(classifiers, probe) -> Verdict | None:
    """The note saying why the classifiers cannot be screened, or None when they can."""
    if probe is None:
        return _note(
            "classifiers not screened: no decoder in the federation and no public set to "
            "probe them with"
        )
    if probe.asked is None and len(classifiers) < COMMITTEE:
        return _note(
            f"classifiers not screened: {len(classifiers)} are too few for a committee that "
            f"one poisoned cannot outvote (needs {COMMITTEE}, or a decoder whose draws say "
            "their class)"
        )
    return None


def _tempered(current, rescale, probs, x, device) -> tuple[Verdict, list[np.ndarray]]:
    """(the tempered copies of the classifiers in `rescale` and their notes, screened out where
    one cannot be changed; the probabilities on the probe `x` with the copies')."""
    verdict, probs = Verdict({}, {}, []), list(probs)
    for i, u in enumerate(current):
        if u.name not in rescale:
            continue
        # its knowledge is sound, only its confidence is off: tempered
        factor, why = rescale[u.name]
        tempered = _adjusted(u, factor=factor)
        if tempered is None:
            verdict.out[u.name] = why
            continue
        verdict.swap[u.name] = tempered
        probs[i] = _classify(tempered, x, device)[0]
        note = f"{u.client_id}: logits divided by {1 / factor:.3g} ({why})"
        verdict.notes.append((u.name, note))
    return verdict, probs


def _screen_predictions(predictions) -> Verdict:
    if 0 < len(predictions) < COMMITTEE:
        return _note(
            f"predictions not screened: {len(predictions)} are too few for a committee "
            f"(needs {COMMITTEE})"
        )
    if predictions:
        probs = [_prediction_probs(u) for u in predictions]
        if len({p.shape for p in probs}) == 1:  # one public set (fedol checks fingerprints)
            return Verdict(_judge(predictions, probs, None)[0], {}, [])
    return Verdict({}, {}, [])


def _prediction_probs(u: Upload) -> np.ndarray:
    p = exporters.read_constant_outputs(u.artifact.model)["predictions"].astype(np.float32)
    p = np.clip(p, 0.0, None)
    return p / np.maximum(p.sum(-1, keepdims=True), 1e-12)


def _judge(uploads: list[Upload], probs: list[np.ndarray], scale, asked=None):
    """How much each client's outputs know of its own classes (`_ranking`) against a reference
    label: the class a decoder was asked for (`asked`), or else the coordinate-wise median of
    everyone's probabilities on the samples that committee is sure of. Under label skew a
    median committee is weak (a class few clients hold gets a low median), so decoder labels
    come first: a poisoned decoder's draws cost every classifier alike and move no one relative
    to the others. -> ({name: why} set aside, {name: (factor, why)} to temper)."""
    committee = asked if asked is not None else _committee(_common_scale(probs, scale))
    ranked = [_ranking(p, committee, _claimed(u)) for u, p in zip(uploads, probs, strict=True)]
    bad = _uninformed(
        uploads,
        [(s, c) for s, c, _ in ranked],
        lambda s, c: (
            f"its outputs rank the samples of its classes above the others' about as well as "
            f"chance (informedness {s:+.2f}, under {KNOWS:g}; its worst: class {c})"
        ),
    )
    bad |= _below_chance(uploads, ranked, bad)
    rescale = {}  # name -> (factor to the median scale, why)
    if scale is not None:
        typical = float(np.median(scale))
        for u, s in zip(uploads, scale, strict=True):
            # Only a loud one: logits spread far under the others' weigh less in an average,
            # never more (a weakly trained client's are small; scaled up, its prior would
            # outvote the others).
            if u.name not in bad and typical > 0 and s > typical * SCALE_RATIO:
                rescale[u.name] = (
                    typical / s,
                    f"its logits spread {s / typical:.1f}x the median "
                    f"client's, over {SCALE_RATIO:g}x",
                )
        rescale |= _loud_majority(uploads, scale, [r[0] for r in ranked], bad, rescale)
    return bad, rescale


def _common_scale(probs: list[np.ndarray], scale) -> list[np.ndarray]:
    """The probabilities as each client would give them with the median client's logit spread
    (`scale`: each one's; None: as they are), for a committee that loud clients do not sway:
    near one-hot answers of five x20 clients of eight outvoted the rest, and a weak honest
    client ranked its class against them looked below chance (-0.33)."""
    if scale is None:
        return probs
    typical = float(np.median(scale))
    out = []
    for p, s in zip(probs, scale, strict=True):
        z = np.log(np.maximum(p.astype(np.float64), 1e-300)) * (typical / s if s > 0 else 1.0)
        z = np.exp(z - z.max(1, keepdims=True))
        out.append(z / z.sum(1, keepdims=True))
    return out


def _loud_majority(uploads, scale, known, bad, rescale) -> dict:
    """{name: (factor, why)} for the clients above a gap of more than SCALE_RATIO in the kept
    clients' logit scales, when they are most of them (the median rule cannot see them) and
    the quiet ones below know their classes about as well (their median informedness within
    2 x KNOWS of the loud ones'): tempered to the loudest quiet one. Honest scales form a
    continuum (measured, nine clean federations of weak and strong clients: no gap over 3.5x
    between neighbours); a multiplied head leaves a gap of its factor (four x20 attackers of
    five: 19.4x; the median rule tempered none and FedMHO lost 6.5 points). The knowledge test
    keeps a quiet network that learned little (random weights kept at +0.35, scale 0.08, under
    honest clients at +1.00, 3.6-4.9) from taming the honest clients to its scale."""
    kept = sorted(
        (s, k, u.name)
        for u, s, k in zip(uploads, scale, known, strict=True)
        if u.name not in bad and u.name not in rescale and k is not None and s > 0
    )
    if len(kept) < 2:
        return {}
    ratios = [b[0] / a[0] for a, b in itertools.pairwise(kept)]
    i = int(np.argmax(ratios))
    quiet, loud = kept[: i + 1], kept[i + 1 :]
    if ratios[i] <= SCALE_RATIO or 2 * len(loud) <= len(kept):
        return {}
    if np.median([k for _, k, _ in quiet]) < np.median([k for _, k, _ in loud]) - 2 * KNOWS:
        return {}
    target = quiet[-1][0]
    return {
        name: (
            target / s,
            f"its logits spread {s / target:.1f}x the quieter clients', with a "
            f"gap over {SCALE_RATIO:g}x between the two",
        )
        for s, _, name in loud
    }


def _below_chance(uploads, ranked, bad) -> dict[str, str]:
    """{name: why} of the uploads (not already in `bad`) that rank one of their classes clearly
    below chance. An honest client ranks every class it holds at least as well as chance; a
    network that learned nothing ranks each arbitrarily, some far below (measured, MNIST random
    weights: mean +0.10 over its 5 classes, one at -0.33; honest clients of 100 steps: every
    class >= +0.09). -KNOWS is ~3 standard errors of one class's score at the probe's sizes.
    Judged only where the probe tells knowledge apart (`informative`)."""
    if not informative([s for s, _, _ in ranked if s is not None]):
        return {}
    return {
        u.name: (
            f"its outputs rank the samples of its class {c} below the others' (informedness "
            f"{w:+.2f} there, under {-KNOWS:g}; {s:+.2f} over its classes)"
        )
        for u, (s, c, w) in zip(uploads, ranked, strict=True)
        if u.name not in bad and w is not None and w < -KNOWS
    }
