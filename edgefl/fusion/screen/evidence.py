"""What every step judges with: the classes a client is judged on (its label counts), its
probabilities on the probe, a committee's reference label, and how much outputs know of a class
(an informedness, 2 x AUC - 1: 0 for outputs that say nothing of the input) under the screen's
one rule (`_uninformed`: an absolute bar, KNOWS). Shared by the classifiers' and decoders'
steps, so it sits below both."""

from __future__ import annotations

import numpy as np
import torch

from edgefl.artifacts import Upload
from edgefl.fusion.teachers import teacher_logits

MIN_SHARE = 0.05  # a class a client holds less of than this is not one it is judged on
MIN_SAMPLES = 20  # probe samples a class needs before anyone is judged on it
SURE = 0.5  # committee probability a probe sample needs to count (it looks like that class)
KNOWS = 0.1  # set aside under this informedness (0: outputs that say nothing of the input)
COMMITTEE = 3  # a median of fewer than this is moved by one poisoned member
PLAIN = 0.5  # judges that read a decoder's draws this well know its classes in generated samples


def _shares(u: Upload) -> np.ndarray:
    """The share of the client's data in each class, by its label counts (0s if it has none)."""
    counts = np.asarray(u.label_counts, dtype=np.float64)
    return counts / counts.sum() if counts.sum() > 0 else np.zeros_like(counts)


def _claimed(u: Upload) -> list[int]:
    return [int(c) for c in np.flatnonzero(_shares(u) >= MIN_SHARE)]


def _classify(u: Upload, x: torch.Tensor, device) -> tuple[np.ndarray, float]:
    logits = teacher_logits(u, x, device).float().cpu()
    scale = float(logits.std(1).median())
    return torch.softmax(logits, 1).numpy(), scale


def _committee(probs: list[np.ndarray]) -> np.ndarray:
    """The coordinate-wise median of everyone's probabilities, its class where it is sure
    (-1 elsewhere)."""
    median = np.median(np.stack(probs), axis=0)
    median /= np.maximum(median.sum(1, keepdims=True), 1e-12)
    return np.where(median.max(1) >= SURE, median.argmax(1), -1)


def _agreement(answers: np.ndarray, committee: np.ndarray, classes: list[int]):
    """(mean over the client's classes of its agreement with the committee, its worst class).
    The mean, not the worst: an honest classifier often reads one class of generated samples
    its own way (measured: each of four honest digits clients had one class at 3-62 %)."""
    per = {}
    for c in classes:
        mask = committee == c
        if mask.sum() >= MIN_SAMPLES:
            per[c] = float((answers[mask] == c).mean())
    return _mean_and_worst(per)


def _mean_and_worst(per: dict[int, float]):
    """(the mean of the per-class scores, the class scored worst), (None, None) for none."""
    if not per:
        return None, None
    return float(np.mean(list(per.values()))), min(per, key=per.get)


def _ranking(probs: np.ndarray, reference: np.ndarray, classes: list[int]):
    """(mean over the client's classes of how well its probability of the class ranks that
    class's samples above the other judged samples, as an informedness 2 x AUC - 1: 0 for
    outputs that carry nothing of the input, negative for outputs that point elsewhere; its
    worst class; that class's score). Ranking, not the argmax: a weakly trained client often answers its majority
    class for every sample (its prior) while its probabilities still order the samples right
    (measured, MNIST clients of 30 optimiser steps: argmax agreement 17%, informedness +0.60;
    random weights: -0.07 and +0.04)."""
    judged = reference >= 0
    p = probs[judged].astype(np.float64)
    per = {}
    for c in classes:
        pos = reference[judged] == c
        if pos.sum() >= MIN_SAMPLES and (~pos).sum() >= MIN_SAMPLES:
            per[c] = 2 * _auc(_log_odds(p, c), pos) - 1
    mean, worst = _mean_and_worst(per)
    return mean, worst, None if worst is None else per[worst]


def _log_odds(p: np.ndarray, c: int) -> np.ndarray:
    """log p_c - log(the other classes' sum), from the others' own probabilities: a client
    that holds one class answers it with p_c = 1.0 in float32 for every sample, and only the
    others' (tiny) probabilities still order the samples."""
    others = np.delete(p, c, axis=1).sum(1)
    return np.log(np.maximum(p[:, c], 1e-300)) - np.log(np.maximum(others, 1e-300))


def _auc(score: np.ndarray, positive: np.ndarray) -> float:
    """P(a positive sample scores above a negative one), ties counted half (Mann-Whitney)."""
    from scipy.stats import rankdata  # imported here: scipy.stats costs every process ~0.5 s

    ranks = rankdata(score)
    n1, n0 = int(positive.sum()), int((~positive).sum())
    return float((ranks[positive].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def _informedness(read: np.ndarray, asked: np.ndarray, mine: np.ndarray, c: int, held) -> float:
    """How much more often the draws asked for class c (of the decoder `mine` marks, whose
    share of each class is `held`) are read as c than its draws of the classes it holds as
    much of or more; for its main class, than the other decoders' draws of other classes. 0:
    its draws say nothing of the class asked for (noise, random weights: the same reading
    whatever was asked). Not its draws of classes it holds less of: under label skew an honest
    decoder draws its main class for a label it barely saw (measured, MNIST Dir(0.1): a
    decoder of 500 steps drew 3s when asked for 3 or 7, and all its draws counted gave it 0)."""
    pos = mine & (asked == c)
    more = [a for a in np.unique(asked[mine]) if a >= 0 and a != c and held[a] >= held[c]]
    neg = mine & np.isin(asked, more)
    if not neg.any():
        neg = (asked != c) & (asked >= 0) & ~mine
    hit = float((read[pos] == c).mean())
    return hit - (float((read[neg] == c).mean()) if neg.any() else 0.0)


def informative(scores) -> bool:
    """The probe tells knowledge apart: the median upload's informedness reaches KNOWS. The
    screen's premise is an honest majority; when the median upload looks as uninformed as
    chance, the probe (barely trained decoders' draws, say) is what knows nothing, and no
    upload is set aside by it (measured: clients of one local epoch on 300 digits, probed with
    one-epoch decoders' draws, scored -0.00 to +0.07 and all five classifiers were set aside,
    the three honest ones with the attackers; docs/security.md's commands at test scale)."""
    return bool(len(scores)) and float(np.median(scores)) >= KNOWS


def _uninformed(uploads, scores, why, least: int = 1) -> dict[str, str]:
    """The screen's one rule: {name: why(score, worst class)} for each upload whose score (an
    informedness: 0 is an upload whose outputs say nothing of the input, 1 a perfect one; None:
    not judged) is under KNOWS, when at least `least` are known. An absolute rule, not one
    relative to the median upload: a weakly trained honest client knows less than the
    others but still more than chance, and what it knows of its classes may be the
    federation's only knowledge of them (measured: a rule at half the median's score set aside
    3 of 20 honest classifiers of 100 optimiser steps and cost an ensemble 1.8 points,
    bench/results/scale.md). Classifiers and decoders judged by the decoders' labels or by other
    classifiers have a reference outside themselves, so few still judge them."""
    known = [s for s, _ in scores if s is not None]
    if not known or len(known) < least or not informative(known):
        return {}
    return {
        u.name: why(s, c)
        for u, (s, c) in zip(uploads, scores, strict=True)
        if s is not None and s < KNOWS
    }
