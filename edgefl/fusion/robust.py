"""Screening poisoned uploads in output space (`--robust screen`, issue 18): one mechanism for
every method that consumes classifiers, decoders or predictions, judged once per ingest
(`judge` -> Verdict) and applied to each method's uploads (`apply`).

Robust aggregators such as Krum or the trimmed mean compare parameter vectors, which
heterogeneous classifiers, CVAE decoders and prediction tables are not. What every upload has
in common is what it outputs on the task's inputs, so each is judged there, against a reference
that a minority cannot move:

- the probe: draws of every decoder for each class it claims, labelled with the class asked
  for; else the method's public set (FedDF's), labelled by the median committee of the
  classifiers' probabilities where it is sure (3 at least: a median of 2 is moved by one).
  When some classifier looks relabelled, a class the probe lacks is covered, for the repair
  only, by images inverted from the classifiers not doubted that hold it (`_cover`);
- classifiers are judged on each class they claim (>= MIN_SHARE of their data) by how well
  their probability of the class ranks the reference's samples of it above the others (an
  informedness, 2 x AUC - 1: 0 for outputs that say nothing of the input); the score is the
  mean over those classes; set aside under KNOWS (or with one class under -KNOWS: ranked below
  chance, as a random network ranks some), an absolute bar, not one relative to the
  median client: a weakly trained honest client knows less than the others but more than
  chance (measured: half the median's agreement set aside 3 of 20 honest classifiers of 100
  optimiser steps and cost an ensemble 1.8 points; bench/results/robust_clean.md). One whose
  logits spread more than SCALE_RATIO times the median's is kept, tempered to the median
  scale: its knowledge is sound, only its weight in a logit average is not (measured: two x20
  attackers lifted a 5-teacher ensemble from 71.9 to 85.1 %, and screening them cost 6 points);
- repaired, not dropped: a classifier whose answers are a relabelling of the reference's (its
  classes permuted: trained on flipped or swapped labels) or their reverse (negated logits) is
  used as a copy whose head rows are permuted (and negated), its label counts relabelled with
  it. Dropping it would throw away the images of its classes, which under label skew no other
  client may hold (measured: screening two flipped teachers of five cost an ensemble 6 points;
  repairing them, 1.6). The reference for the repair leaves out the draws of decoders a first
  judgement doubts, and a move needs clear evidence (`_relabelling`), so an honest client that
  reads an unseen class as a similar one it holds is left as sent;
- decoders: the kept classifiers that hold a class read each decoder's draws of it; a decoder
  whose draws they read consistently as other classes (trained on flipped labels) is repaired
  like a classifier, as a copy that routes each class to the label that draws it. Each is then
  judged on its images, against the other decoders' (each shared class's median image,
  nearest-centroid reading), and by the classifiers' reading; with no classifier in the
  federation, on its images alone. Set aside on the same bar when neither finds its draws of a
  class read as that class more often than its draws of other classes;
- predictions uploads: judged like classifiers, on the public set they share.

Under label skew an honest client is judged only on the classes it holds, so its missing
classes never count against it; an attacker's lie about its labels is consistent with its
poisoned training, which is what it is judged on. Not repairable: an upload whose outputs
carry no knowledge (random weights, a noise decoder): screened, and its data lost to the
federation. A majority of attackers breaks any committee (measured: 4 of 5); when most uploads
of a kind would need a repair, the reference is taken to be the odd one and none is repaired.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from scipy.stats import rankdata

import exporters
from edgefl.artifacts import Upload
from edgefl.fusion.base import decode, invert, teacher_logits
from edgefl.progress import no_progress

MIN_SHARE = 0.05  # a class a client holds less of than this is not one it is judged on
MIN_SAMPLES = 20  # probe samples a class needs before anyone is judged on it
PER_CLASS = 64  # probe samples a decoder draws per class it claims
SURE = 0.5  # committee probability a probe sample needs to count (it looks like that class)
KNOWS = 0.1  # set aside under this informedness (0: outputs that say nothing of the input)
SCALE_RATIO = 5.0
COMMITTEE = 3  # a median of fewer than this is moved by one poisoned member
INVERSION_STEPS = 200  # Adam steps per inverted image (pFedZKD's default inversion_steps)
INVERSION_LR = 0.1  # pFedZKD's default inversion_lr; tau 1: plain cross-entropy to the class
COVER = 40  # inverted images per class the probe lacks (MIN_SAMPLES twice; cost is per image)
REPAIR_GAIN = 0.3  # a class moves when read as another this much more often than as itself
# Every classifier reads every decoder's draws, so one judgement costs uploads^2 (20.8 s at
# 100 uploads, past 600 s at 1,000: bench/results/scale.md). A larger federation is judged as
# seeded shards of at most this many, each kind dealt evenly over them: linear in the uploads,
# and each shard's committee as large as a 100-upload federation's (a minority of attackers
# overall is a minority of a shard but by a rare draw).
SHARD = 100


class Relabelling(NamedTuple):
    """A classifier's repair: its logit k becomes sign x its logit perm[k]; outputs in
    `abstain` (no evidence what they stand for) give the mean logit."""

    perm: np.ndarray
    sign: int
    before: float  # agreement on its classes, as sent
    after: float  # and repaired
    abstain: set[int]


@dataclasses.dataclass
class Verdict:
    """The screen's judgement of a whole federation, made once per ingest and applied to each
    method's own uploads: who is left out and why, who is used changed (repaired, tempered)."""

    out: dict[str, str]  # upload name -> why it is screened out
    swap: dict[str, Upload]  # upload name -> the changed copy used in its place
    notes: list[tuple[str | None, str]]  # (the upload it is about, or None for all; the note)
    seconds: float = 0.0

    def merge(self, other: Verdict) -> None:
        self.out |= other.out
        self.swap |= other.swap
        self.notes += other.notes


def apply(verdict: Verdict, usable: list[Upload], log=None):
    """A method's share of the verdict: (its uploads kept, changed ones swapped in, [{file,
    client_id, kind, reason}] for its uploads screened out, the notes)."""
    log = log or (lambda msg: None)
    kept = [verdict.swap.get(u.name, u) for u in usable if u.name not in verdict.out]
    screened = [
        {"file": u.name, "client_id": u.client_id, "kind": u.kind, "reason": verdict.out[u.name]}
        for u in usable
        if u.name in verdict.out
    ]
    for s in screened:
        log(f"screened out {s['file']} ({s['kind']}): {s['reason']}")
    names = {u.name for u in usable}
    return kept, screened, [text for name, text in verdict.notes if name is None or name in names]


def judge(
    federation: list[Upload],
    device,
    seed: int = 0,
    public: Callable[[], np.ndarray | None] | None = None,
    progress=None,
    shard: int = SHARD,
) -> Verdict:
    """Judge every upload of the federation. `public()`: the method's public set, the probe when
    the federation has no decoder (read only then: a 5,000-sample set costs a dataset load).
    `progress(task, done, total, note)`: the shards of a large federation, and the steps of
    its one long part (`_cover`)."""
    start = time.perf_counter()
    parts = shards(federation, shard, seed)
    if len(parts) == 1:
        verdict = _judge_shard(federation, device, seed, public, progress)
        verdict.seconds = time.perf_counter() - start
        return verdict
    read = functools.cache(public) if public is not None else None
    progress = progress or no_progress
    verdict = Verdict({}, {}, [])
    progress("robust screen: shard", 0, len(parts))
    for i, part in enumerate(parts):
        v = _judge_shard(part, device, seed + i, read)
        # a federation-wide note holds for its shard only
        v.notes = [(n, t if n else f"shard {i + 1} of {len(parts)}: {t}") for n, t in v.notes]
        verdict.merge(v)
        progress(
            "robust screen: shard", i + 1, len(parts), f"{len(verdict.out)} screened out so far"
        )
    verdict.seconds = time.perf_counter() - start
    return verdict


def shards(federation: list[Upload], size: int, seed: int) -> list[list[Upload]]:
    """The federation in ceil(n / size) seeded shards, each kind shuffled and dealt round-robin
    so that every shard holds its share of classifiers, decoders and predictions."""
    n = max(1, math.ceil(len(federation) / size))
    if n == 1:
        return [federation]
    rng = np.random.default_rng(seed)
    parts: list[list[Upload]] = [[] for _ in range(n)]
    dealt = 0
    for kind in sorted({u.kind for u in federation}):
        group = [u for u in federation if u.kind == kind]
        for j, k in enumerate(rng.permutation(len(group))):
            parts[(dealt + j) % n].append(group[k])
        dealt += len(group)
    return parts


class Probe(NamedTuple):
    """What every upload is judged on: inputs, the class each decoder draw was asked for (None
    for a public set, labelled by a committee), and the decoder that drew each (0 for a public
    set; `_cover`'s inverted images, kept outside the probe, use -1 - j)."""

    x: torch.Tensor
    asked: np.ndarray | None
    source: np.ndarray


def _judge_shard(federation, device, seed, public, progress=None) -> Verdict:
    """One judgement over all of `federation` (quadratic: see SHARD): probe -> classifiers
    (reference, repairs, screen, tempering) -> decoders -> predictions."""
    decoders = [u for u in federation if u.kind == "decoder"]
    classifiers = [u for u in federation if u.kind == "classifier"]
    predictions = [u for u in federation if u.kind == "predictions"]
    probe = _make_probe(decoders, torch.Generator().manual_seed(seed), device, public)
    verdict = Verdict({}, {}, [])
    if classifiers:
        verdict.merge(_screen_classifiers(classifiers, decoders, probe, device, seed, progress))
    if decoders and not classifiers and probe is not None and probe.asked is not None:
        verdict.merge(_screen_decoders_alone(decoders, probe))
    verdict.merge(_screen_predictions(predictions))
    verdict.notes = [(name, text) for name, text in verdict.notes if name not in verdict.out]
    return verdict  # a repaired upload that was screened out after all has no note


def _make_probe(decoders, gen, device, public) -> Probe | None:
    """The decoders' draws of every class each claims; else the method's public set."""
    probe = _probe(decoders, gen, device)
    if probe is not None:
        return probe
    x = public() if public is not None else None
    return None if x is None else Probe(torch.from_numpy(x), None, np.zeros(len(x), np.int64))


def _screen_classifiers(classifiers, decoders, probe, device, seed, progress) -> Verdict:
    """Probe -> reference -> findings (repairs, then the screen and tempering) -> verdict; then
    the decoders, judged by the classifiers kept."""
    unscreened = _unscreenable(classifiers, probe)
    if unscreened is not None:
        return unscreened
    probs, scale = map(
        list, zip(*(_classify(u, probe.x, device) for u in classifiers), strict=True)
    )
    reference, judges = _trusted_reference(classifiers, decoders, probs, probe)
    found, notes = _relabellings(
        classifiers, probs, reference, judges, probe, seed, device, progress
    )
    repairs, probs = _repaired(classifiers, found, probs, probe.x, device)
    current = [repairs.swap.get(u.name, u) for u in classifiers]
    # without decoders, the committee of the repaired clients
    bad, rescale = _judge(current, probs, scale, reference if probe.asked is not None else None)
    tempering, probs = _tempered(current, rescale, probs, probe.x, device)
    verdict = Verdict(bad, {}, notes)
    verdict.merge(repairs)
    verdict.merge(tempering)
    if decoders and probe.asked is not None:
        verdict.merge(_screen_decoders(decoders, probe, current, probs, verdict.out))
    return verdict


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


def _repaired(classifiers, found, probs, x, device) -> tuple[Verdict, list[np.ndarray]]:
    """(the repaired copies of the classifiers a Relabelling was found for and their notes, the
    probabilities on the probe `x` with the copies')."""
    verdict, probs = Verdict({}, {}, []), list(probs)
    for i, (u, fix) in enumerate(zip(classifiers, found, strict=True)):
        repaired = (
            None if fix is None else _adjusted(u, perm=fix.perm, sign=fix.sign, abstain=fix.abstain)
        )
        if repaired is None:  # as sent (an onnxruntime-only upload cannot be changed)
            continue
        verdict.swap[u.name] = repaired
        probs[i] = _classify(repaired, x, device)[0]
        verdict.notes.append((u.name, _repair_note(u, fix)))  # dropped if it is screened
    return verdict, probs


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


def _screen_decoders(decoders, probe: Probe, classifiers, probs, out) -> Verdict:
    """The decoders judged with the classifiers not screened out (`out`): repaired where they
    draw other classes than asked for, then screened on what the repaired ones were asked."""
    judges = [i for i, u in enumerate(classifiers) if u.name not in out]
    verdict, asked = _repair_decoders(
        decoders, probe.source, probe.asked, classifiers, probs, judges
    )
    current = [verdict.swap.get(u.name, u) for u in decoders]  # label counts relabelled too
    verdict.out = _judge_decoders(current, probe.x, probe.source, asked, classifiers, probs, judges)
    return verdict


def _trusted_reference(classifiers, decoders, probs, probe) -> tuple[np.ndarray, list[int]]:
    """(the label of each probe sample for the repair, -1 where none; the judges: classifiers
    a first judgement does not doubt). The decoders' draws count where the judges read them as
    asked (a flipped decoder's draws would make honest classifiers look relabelled); without
    decoders, the committee of the judges (half of them poisoned would move a median of all)."""
    first = _judge(classifiers, probs, None, probe.asked)[0]
    judges = [i for i, u in enumerate(classifiers) if u.name not in first]
    if probe.asked is not None:
        doubted = _judge_decoders(
            decoders, probe.x, probe.source, probe.asked, classifiers, probs, judges
        )
        mask = np.isin(probe.source, [i for i, d in enumerate(decoders) if d.name in doubted])
        return np.where(mask, -1, probe.asked), judges
    return _committee([probs[i] for i in judges] if judges else probs), judges


def _relabellings(classifiers, probs, reference, judges, probe, seed, device, progress):
    """(each classifier's repair (a Relabelling) or None, the notes); none at all when most
    would need one."""
    found = [_relabelling(u, probs[i], reference, probe.source) for i, u in enumerate(classifiers)]
    notes = []
    # The probe covers only classes some decoder draws (or the public set holds); a
    # relabelled classifier's class outside them cannot be placed, so when one is found,
    # each such class a judge holds gets images inverted from the judges that hold it most
    # (measured, seed-1 bench uploads: an attacker's 1,350 8s, no decoder drawing 8, was an
    # ensemble's 8-point loss). Not otherwise: inverting a VGG-9 costs ~45 s a class on 2
    # CPUs, and a clean federation, or one whose attackers are only screened, has nobody
    # to place.
    extra = None
    if any(f is not None for f in found):
        shape, k = probe.x.shape[1:], probs[0].shape[1]
        extra = _cover(reference, classifiers, judges, shape, k, seed, device, progress)
    if extra is not None:  # judged again with the inverted images as move targets
        notes.append((None, extra.note))
        ref_r = np.concatenate([reference, extra.asked])
        src_r = np.concatenate([probe.source, extra.source])
        found = [
            _relabelling(
                u, np.concatenate([probs[i], _classify(u, extra.x, device)[0]]), ref_r, src_r
            )
            for i, u in enumerate(classifiers)
        ]
    wanted = sum(f is not None for f in found)
    if 2 * wanted > len(classifiers):
        # A repair says this classifier is the odd one out; when most would need one, the
        # reference is (measured: 4 flipped decoders of 5 had every honest classifier
        # "repaired", costing an ensemble that uses no decoder 24 points).
        notes.append(
            (
                None,
                f"no classifier repaired: {wanted} of {len(classifiers)} disagree with the "
                "decoders' draws the same way, so the draws are the odd ones",
            )
        )
        return [None] * len(classifiers), notes
    return found, notes


def _screen_decoders_alone(decoders, probe: Probe) -> Verdict:
    if len(decoders) < COMMITTEE:
        return _note(
            f"decoders not screened: no classifier to judge their draws, and {len(decoders)} "
            f"are too few for a committee of their own (needs {COMMITTEE})"
        )
    return Verdict(_judge_decoders_alone(decoders, probe.x, probe.asked, probe.source), {}, [])


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


def _note(text: str) -> Verdict:
    return Verdict({}, {}, [(None, text)])


def _repair_note(u: Upload, fix: Relabelling) -> str:
    perm, abstain = fix.perm, fix.abstain
    moved = ", ".join(
        f"{int(perm[k])}->{k}" for k in range(len(perm)) if perm[k] != k and k not in abstain
    )
    what = "; ".join(
        x
        for x in (
            "logits negated" if fix.sign < 0 else "",
            f"classes relabelled {moved}" if moved else "",
            f"abstains on {', '.join(map(str, sorted(abstain)))}" if abstain else "",
        )
        if x
    )
    return (
        f"{u.client_id}: outputs repaired ({what}): agreement on its classes "
        f"{100 * fix.before:.0f}% -> {100 * fix.after:.0f}%"
    )


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
    committee = asked if asked is not None else _committee(probs)
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
    return bad, rescale


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


def _committee(probs: list[np.ndarray]) -> np.ndarray:
    """The coordinate-wise median of everyone's probabilities, its class where it is sure
    (-1 elsewhere)."""
    median = np.median(np.stack(probs), axis=0)
    median /= np.maximum(median.sum(1, keepdims=True), 1e-12)
    return np.where(median.max(1) >= SURE, median.argmax(1), -1)


def _relabelling(
    u: Upload, probs: np.ndarray, reference: np.ndarray, source: np.ndarray
) -> Relabelling | None:
    """The repair when the classifier's answers are clearly a relabelling of the reference's
    (or their negation); else None.
    Its output classes are matched to the reference classes they answer most (an assignment, so
    no two share one). A repair needs clear evidence on a class it claims; once found, the
    classes it holds too little of to be judged on follow the same assignment where it reads
    them better (a flip moves every class, and a weakly held one left in place answers wrong
    with confidence: measured, 13 points of a repaired teacher's accuracy).

    An honest client under label skew reads a class it never saw as a similar one it holds
    (measured: generated 4s read as 9, 6s as 5 or 0), so a move of output c to class a also
    needs: c answers a's samples at least twice as often as a's share of the probe (not a
    constant answer, as random weights give, measured at 44% on a flip); most
    decoders' draws of a read as c (`source`: one bad decoder's draws are not the client's
    fault); and c not answering most decoders' draws of c itself (else c means c)."""
    claimed = _claimed(u)
    k = probs.shape[1]
    rows = [a for a in range(k) if (reference == a).sum() >= MIN_SAMPLES]
    # Classes with real probe samples (drawn; inverted ones have sources < 0): only there can
    # a client show what its own output means; inverted images serve as the target of a move
    # (an inverted class may not transfer to every client: read as itself only 20% of the
    # time, an honest client's output for it would look free to move).
    real = source >= 0
    drawn = [a for a in rows if ((reference == a) & real).sum() >= MIN_SAMPLES]
    if not claimed or not any(c in drawn for c in claimed):
        return None
    before = _agreement(probs.argmax(1), np.where(real, reference, -1), claimed)[0] or 0.0
    basis = _Basis(reference, source, k, rows, drawn, claimed)
    best = None
    for sign in (1, -1):
        answers = probs.argmax(1) if sign > 0 else probs.argmin(1)  # argmin: negated logits
        fix = _signed_relabelling(answers, sign, before, basis)
        if fix is not None and (best is None or fix.after > best.after):
            best = fix
    return best


class _Basis(NamedTuple):
    """What `_relabelling` judges a classifier against: each sample's reference label and
    source, the number of classes, those with enough samples to be judged on (`rows`), those of
    them with enough drawn ones, and the classes the client claims."""

    reference: np.ndarray
    source: np.ndarray
    k: int
    rows: list[int]
    drawn: list[int]
    claimed: list[int]


def _signed_relabelling(answers, sign: int, before: float, b: _Basis) -> Relabelling | None:
    """The repair found for the classifier's `answers` (its logits as sent for sign 1, negated
    for -1), or None when they give no clear evidence of one."""
    own, match, moves = _moves(answers, b)
    clear = _clear(b, own, match, moves)
    # as sent, unless one clear move rests on more than one decoder's draws (`_sourced`); once
    # one does, the others may rest on one (a flip read through weak decoders: measured on the
    # digits attack test, a flipped client left unrepaired was screened out)
    if sign > 0 and not any(_sourced(answers, b, c, moves[c]) for c in clear):
        return None
    # A client that relabels most of what it holds (a flip) relabels what it barely holds
    # too; one that relabels a few classes (a swap) or none (a negation) leaves the rest,
    # and an unseen class its answers happen to match is not moved (measured: moving them
    # cost a repaired swap's or negation's ensemble 5-6 points on one seed).
    mostly = 2 * len(clear) >= len([c for c in b.claimed if c in b.drawn])
    if not mostly:
        moves = {c: a for c, a in moves.items() if c in clear}
    after = _agreement_as_moved(b, own, match, moves)
    # negating every logit is one global change: it must lift the whole client clearly
    if sign < 0 and after < before + REPAIR_GAIN:
        return None
    # Relabelled throughout, an output it gave no evidence for could stand for any class (its
    # true class not drawn here): it abstains (the mean logit) rather than answer a guessed
    # class with confidence.
    unsure = {a for a in range(b.k) if a not in moves.values()} if mostly else set()
    return Relabelling(_permutation(b.k, moves), sign, before, after, unsure)


def _clear(b: _Basis, own, match, moves) -> list[int]:
    """The claimed outputs whose move has clear evidence: read as their new class at least SURE
    of the time and REPAIR_GAIN more often than as their own."""
    # evidence only where c's own samples were drawn too: unseen, what c means is unknown
    return [
        c
        for c in b.claimed
        if c in moves
        and c in b.drawn
        and match[c][1] >= SURE
        and match[c][1] >= own[c] + REPAIR_GAIN
    ]


def _agreement_as_moved(b: _Basis, own, match, moves) -> float:
    """The mean agreement over the claimed classes that are drawn or moved, each output read
    as the class it is moved to."""
    read = [match[c][1] if c in moves else own[c] for c in b.claimed if c in moves or c in b.drawn]
    return float(np.mean(read))


def _moves(answers, b: _Basis):
    """(how often each output answers its own class's samples, 0 where they are not drawn;
    {output c: (the class a it is matched to, how often it answers a's samples)}; {output c:
    the class a it clearly stands for})."""
    rate = np.array(
        [[float((answers[b.reference == a] == c).mean()) for c in range(b.k)] for a in b.rows]
    )
    own = {c: rate[b.rows.index(c), c] if c in b.drawn else 0.0 for c in range(b.k)}
    match = {
        c: (b.rows[i], rate[i, c])
        for i, c in zip(*linear_sum_assignment(rate, maximize=True), strict=True)
    }
    judged = np.isin(b.reference, b.rows)
    moves = {
        c: a
        for c, (a, r) in match.items()
        if a != c and r >= SURE and r > own[c] and _stands_for(answers, b, judged, c, a)
    }
    return own, match, moves


def _stands_for(answers, b: _Basis, judged: np.ndarray, c: int, a: int) -> bool:
    """Whether output c answers class a's samples beyond chance (at least twice a's share of
    the judged samples), most decoders' draws of a read as c, and not most of those of c."""
    says_c = judged & (answers == c)
    return bool(
        says_c.any()
        and (b.reference[says_c] == a).mean() >= 2 * (b.reference[judged] == a).mean()
        and _most(answers, b.reference, b.source, a, c)
        and not _most(answers, b.reference, b.source, c, c)
    )


def _sourced(answers, b: _Basis, c: int, a: int) -> bool:
    """Whether output c answering class a's samples rests on two sources at least, or on one
    and the swap's other half (output a answering c's samples, on two sources): an honest
    client reads a class it never saw as one it holds, and one decoder's draws cannot tell that
    from a relabelling (measured, MNIST Dir(0.1) seed 1: an honest client's output 7 read the
    one 3-drawing decoder's 3s as 7; its output 3 answered nothing). A probe of one source (a
    public set, labelled by the committee; one decoder) has no second to ask."""
    ref, src = b.reference, b.source
    if len(np.unique(src[src >= 0])) < 2:
        return _most(answers, ref, src, a, c)
    if _most(answers, ref, src, a, c, least=2):
        return True
    return _most(answers, ref, src, a, c) and _most(answers, ref, src, c, a, least=2)


def _most(answers, reference, source, a: int, c: int, least: int = 1) -> bool:
    """Whether most of the sources (decoders) that drew class a, and at least `least` of them,
    have their draws read as c at least SURE of the time."""
    blocks = [answers[(reference == a) & (source == s)] for s in np.unique(source[reference == a])]
    blocks = [b for b in blocks if len(b)]
    agree = sum((b == c).mean() >= SURE for b in blocks)
    return agree >= least and agree > len(blocks) / 2


def _permutation(k: int, moves: dict[int, int]) -> np.ndarray:
    """perm with perm[a] = c for each output class c moved to a; the other outputs keep their
    place where it is free, the rest fill the free places in order."""
    perm = np.full(k, -1)
    for c, a in moves.items():
        perm[a] = c
    used = set(moves)
    for a in range(k):
        if perm[a] < 0 and a not in used:
            perm[a] = a
            used.add(a)
    rest = iter(c for c in range(k) if c not in used)
    for a in range(k):
        if perm[a] < 0:
            perm[a] = next(rest)
    return perm


def _adjusted(
    u: Upload,
    factor: float = 1.0,
    perm: np.ndarray | None = None,
    sign: int = 1,
    abstain: set[int] = frozenset(),
) -> Upload | None:
    """A copy of the upload whose classifier's logit k is sign x factor x its logit perm[k] (its
    head's rows permuted and scaled; label counts relabelled alike), or None when it has no
    rebuilt head to change (an onnxruntime-only upload)."""
    held = u.module  # once: a parked upload's is read from disk at each access
    head = getattr(held, "head", None)
    if not isinstance(head, torch.nn.Linear):
        return None
    module = copy.deepcopy(held)  # never the shared upload's: other methods use it as sent
    index = torch.as_tensor(perm if perm is not None else np.arange(head.out_features))
    with torch.no_grad():
        module.head.weight.copy_(sign * factor * head.weight[index])
        module.head.bias.copy_(sign * factor * head.bias[index])
        w, b = module.head.weight.mean(0), module.head.bias.mean()
        for a in abstain:  # its logit: the mean of all, so it never stands out
            module.head.weight[a], module.head.bias[a] = w, b
    out = u.with_module(module)
    counts = u.meta.get("label_counts")
    if perm is not None and counts and len(counts) == len(perm):
        meta = dict(u.meta, label_counts=[counts[int(c)] for c in perm])
        out = dataclasses.replace(out, artifact=dataclasses.replace(u.artifact, metadata=meta))
    return out


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
    scores = [
        max((s for s in pair if s[0] is not None), key=lambda s: s[0], default=(None, None))
        for pair in zip(by_images, by_judges, strict=True)
    ]
    return _uninformed(
        decoders,
        scores,
        lambda s, c: (
            "its draws of the class asked for look no more like that class than its draws of "
            f"other classes do, to the other decoders' images and to the classifiers "
            f"(informedness {s:+.2f}, under {KNOWS:g}; its worst: class {c})"
        ),
    )


def _judged_scores(decoders, source, asked, classifiers, probs, judges) -> list[tuple]:
    """(mean informedness of the judges' reading over the decoder's classes, its worst class)
    per decoder; a class is judged by the judges that hold it, else by all of them."""
    if not judges:
        return [(None, None)] * len(decoders)
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
        scores.append(_mean_and_worst(per))
    return scores


def _repair_decoders(decoders, source, asked, classifiers, probs, judges):
    """Decoders whose draws the judges read as other classes, consistently (a flip: asked for
    label l it draws class c), used relabelled: a copy that, asked for c, is given l (its label
    counts relabelled alike). Dropping one loses the data behind it (measured: two flipped
    decoders of five screened cost FedMHO 6 points on one seed). -> (a Verdict with the copies
    and their notes, the probe's labels as the repaired decoders would have been asked for
    them)."""
    verdict = Verdict({}, {}, [])
    if not judges:
        return verdict, asked
    k = probs[judges[0]].shape[1]
    holders = {c: tuple(i for i in judges if c in _claimed(classifiers[i])) for c in range(k)}

    @functools.cache
    def read_for(a: int) -> np.ndarray:  # the reading of the judges that hold label a
        return np.mean([probs[i] for i in holders[a]], axis=0).argmax(1)

    found = {}
    for d, u in enumerate(decoders):
        got = _decoder_relabelling(d, source, asked, read_for, k, holders)
        if got is not None and u.rebuilt:
            found[d] = got
    if 2 * len(found) > len(decoders):  # honest majority: then the judges are the odd ones
        return _note(
            f"no decoder repaired: {len(found)} of {len(decoders)} draw other "
            "classes than asked for, by the classifiers' reading"
        ), asked
    asked = asked.copy()
    for d, (perm, seen) in found.items():
        u = decoders[d]
        inverse = np.argsort(perm)  # old label -> the class it draws
        mask = source == d
        asked[mask] = inverse[asked[mask]]
        verdict.swap[u.name] = _relabelled_decoder(u, perm, seen)
        moved = ", ".join(f"{int(perm[c])}->{c}" for c in range(k) if perm[c] != c and c in seen)
        verdict.notes.append(
            (
                u.name,
                f"{u.client_id}: draws repaired (labels relabelled {moved}: "
                "asked for the class on the right, it is given the label on the left)",
            )
        )
    return verdict, asked


def _decoder_relabelling(d, source, asked, read_for, k, holders):
    """(perm: new label c -> the decoder's label perm[c], the classes whose label is known)
    when the judges read its draws for some label l clearly as another class c (`_draws_as`).
    A label's draws are read by the judges that hold it (`holders`, `read_for(l)`), and one no
    judge holds never moves: judges that never saw an l read one as the class they know nearest
    it (measured, MNIST Dir(0.1): honest decoders' 2s, held by one judge of ten, read by all as
    3 or 8 and "repaired", which then set aside a third decoder whose 2s were judged against
    them).

    Whether the decoder is relabelled at all is decided on the labels where the judges' reading
    can be trusted (`_plain`: two judges at least, who read the other decoders' draws of l as
    l): a weak judge reads every l as a class it knows better, and one weak decoder's poor
    draws look relabelled to it (measured, MNIST Dir(0.1): an honest decoder "repaired" 8->2
    on one judge's word cost FedMHO 4.4 points). Once it is, its other moves follow on the
    looser evidence (a flipped decoder's labels no other decoder draws move too: measured,
    leaving them screened a flipped decoder out, 1.6 points of FedMHO)."""
    mine = source == d
    labels = [int(a) for a in np.unique(asked[mine]) if holders[int(a)]]
    if not labels:
        return None
    rate, moves = _label_moves(labels, mine, asked, read_for, k)
    trusted = [a for a in labels if _plain(a, mine, asked, read_for(a), holders)]
    sure = {a: c for a, c in moves.items() if a in trusted}
    # A relabelled decoder moves most of its labels (a flip) or a closed set of them (a swap);
    # one label read as a similar class the judges hold better is not a relabelling (measured:
    # an honest decoder's 6s read as 5 and "repaired" cost FedMHO 2.7 points).
    if not _relabelled(sure, trusted) or not _relabelled(moves, labels):
        return None
    # Classes whose label is known: the moved ones, and those read as themselves. A label it
    # holds too little of to draw here (a flip moved it too) stays unknown: counted 0, never
    # asked for (measured: left in place, it gave another class's images 147 times).
    seen = set(moves.values()) | {a for i, a in enumerate(labels) if rate[i, a] >= SURE}
    return _permutation(k, moves), seen


def _label_moves(labels, mine, asked, read_for, k) -> tuple[np.ndarray, dict[int, int]]:
    """(rate[i, c]: how often the decoder's draws of labels[i] are read as c; {label: the class
    c its draws are, where `_draws_as` finds it clearly another}), labels matched to classes
    by an assignment so that no two share one."""
    rate = np.array(
        [[float((read_for(a)[mine & (asked == a)] == c).mean()) for c in range(k)] for a in labels]
    )
    moves = {
        labels[i]: c  # the label draws class c: asked for c, it is to be given that label
        for i, c in zip(*linear_sum_assignment(rate, maximize=True), strict=True)
        if _draws_as(labels, rate, i, c, mine, asked, read_for(labels[i]))
    }
    return rate, moves


def _relabelled(moves: dict[int, int], labels: list[int]) -> bool:
    """Whether `moves` relabel most of `labels` or a closed set of them."""
    return bool(moves) and (2 * len(moves) >= len(labels) or set(moves) == set(moves.values()))


def _plain(a: int, mine, asked, reading, holders) -> bool:
    """Whether the judges' reading of label a can be trusted: two judges hold it, and they read
    the other decoders' draws of a as a."""
    others = ~mine & (asked == a)
    return len(holders[a]) >= 2 and others.any() and (reading[others] == a).mean() >= SURE


def _draws_as(labels, rate, i, c, mine, asked, reading) -> bool:
    """Whether the decoder's (`mine`) label a = labels[i] clearly draws another class c: most of
    its draws of a read as c, c read for a's draws and rarely for its others (not a constant
    reading, as of noise), its own draws of c (if it has any) not read as c, and the other
    decoders' draws of a not read as c too (else the judges confuse a with c, or every
    decoder's a looks like c). `rate[i, c]`: how often its draws of a are read as c."""
    a = labels[i]
    says_c = mine & (reading == c)
    others = ~mine & (asked == a)
    return bool(
        a != c
        and rate[i, c] >= SURE
        and (asked[says_c] == a).mean() >= SURE
        and not (c in labels and rate[labels.index(c), c] >= SURE)
        and (not others.any() or (reading[others] == c).mean() < SURE)
    )


def _relabelled_decoder(u: Upload, perm: np.ndarray, seen: set[int]) -> Upload:
    """A copy of the decoder upload that, asked for class c, is given label perm[c]; its label
    counts follow, 0 for a class whose label is not known."""
    out = u.with_module(_Relabelled(u.module, perm))
    counts = u.meta.get("label_counts")
    if counts and len(counts) == len(perm):
        relabelled = [counts[int(perm[c])] if c in seen else 0 for c in range(len(perm))]
        meta = dict(u.meta, label_counts=relabelled)
        out = dataclasses.replace(out, artifact=dataclasses.replace(u.artifact, metadata=meta))
    return out


class _Relabelled(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module, perm: np.ndarray):
        super().__init__()
        self.inner = inner  # shared, never changed: the copy only routes its labels
        self.register_buffer("route", torch.eye(len(perm))[torch.as_tensor(perm)])

    def forward(self, z, onehot):
        return self.inner(z, onehot @ self.route.to(onehot.dtype))


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
