"""The robust screen's repair (issue 18): a classifier whose answers are a relabelling or a
negation of the reference's is used repaired, and nothing else is. Built from answers on a
synthetic probe, one case per class of behaviour: a flip, a swap, a negation (repaired); an
honest client under label skew that reads an unseen class as a similar one, a constant answer,
draws that one decoder got wrong, a class whose own samples were not drawn (left as sent)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

import exporters
from edgefl.artifacts import Upload
from edgefl.client.attacks import derangement
from edgefl.fusion.screen import apply, judge, shards
from edgefl.fusion.screen.classifier_repair import _relabelling
from edgefl.fusion.screen.copies import _adjusted
from edgefl.fusion.screen.decoder_repair import _decoder_relabelling

K, DECODERS, PER = 10, 3, 64
# every decoder draws every class: (reference class, decoder) per sample
REFERENCE = np.repeat(np.tile(np.arange(K), DECODERS), PER)
SOURCE = np.repeat(np.repeat(np.arange(DECODERS), K), PER)


def _probs(answers: np.ndarray, negated: bool = False) -> np.ndarray:
    """Probabilities whose argmax (argmin when negated) is `answers`."""
    p = np.full((len(answers), K), 0.5 / (K - 1) if not negated else 1.0 / K, np.float32)
    p[np.arange(len(answers)), answers] = 0.5 if not negated else 0.001
    return p / p.sum(1, keepdims=True)


def _client(counts) -> SimpleNamespace:
    return SimpleNamespace(label_counts=np.asarray(counts))


HELD = [500, 400, 300, 300, 10, 200, 300, 0, 300, 400]  # 4 barely held, 7 never


def _honest_answers(rng) -> np.ndarray:
    # An honest client under label skew: right on what it holds, a similar class elsewhere.
    out = REFERENCE.copy()
    similar = rng.random(len(out)) < 0.6  # an unseen class read as a similar one, not always
    out[(REFERENCE == 4) & similar] = 9  # generated 4s read as 9 (measured on MNIST clients)
    out[(REFERENCE == 7) & similar] = 1
    wrong = (rng.random(len(out)) < 0.05) | np.isin(REFERENCE, [4, 7]) & ~similar
    out[wrong] = rng.integers(0, K, wrong.sum())
    return out


def test_a_flipped_client_is_relabelled_back_every_class_it_holds():
    rng = np.random.default_rng(0)
    pi = derangement(K, 3)  # it trained on label pi[y] for an image of class y
    answers = pi[_honest_answers(rng)]
    found = _relabelling(
        _client(np.asarray(HELD)[np.argsort(pi)]), _probs(answers), REFERENCE, SOURCE
    )
    assert found is not None
    perm, sign, before, after, abstain = found
    assert sign == 1 and before < 0.1 and after > 0.9
    # Its repaired output a is its output pi[a] for each class it holds; 4 and 7 it barely or
    # never saw (it answers them as 9 and 1): no output of its own stands for them, and the
    # repaired copy abstains there rather than guess.
    assert all(perm[a] == pi[a] for a in range(K) if a not in (4, 7)), (perm, pi)
    assert abstain == {4, 7}
    assert sorted(perm) == list(range(K))


def test_a_swap_and_a_negation_are_repaired():
    rng = np.random.default_rng(1)
    honest = _honest_answers(rng)
    swapped = honest.copy()
    swapped[honest == 0], swapped[honest == 1] = 1, 0
    perm, sign, *_ = _relabelling(_client(HELD), _probs(swapped), REFERENCE, SOURCE)
    assert sign == 1 and list(perm) == [1, 0, *range(2, K)]
    perm, sign, *_ = _relabelling(_client(HELD), _probs(honest, negated=True), REFERENCE, SOURCE)
    assert sign == -1 and list(perm) == list(range(K))


def test_honest_clients_constant_answers_and_bad_draws_are_left_as_sent():
    rng = np.random.default_rng(2)
    honest = _honest_answers(rng)
    assert _relabelling(_client(HELD), _probs(honest), REFERENCE, SOURCE) is None
    # A constant answer (random weights often give one) matches every class equally badly,
    # even when its own class's draws get another answer.
    constant = np.where(REFERENCE == 5, rng.integers(0, K, len(REFERENCE)), 5)
    assert _relabelling(_client(HELD), _probs(constant), REFERENCE, SOURCE) is None
    # Its unseen 4s read as 9 every time, its own 9s two times in three: 9 still means 9.
    sure = honest.copy()
    sure[REFERENCE == 4] = 9
    sure[(REFERENCE == 9) & (rng.random(len(sure)) < 0.33)] = 7
    assert _relabelling(_client(HELD), _probs(sure), REFERENCE, SOURCE) is None
    # One decoder's draws of 3 look like 8 (a flipped decoder): the honest client reads them
    # as 8, which is the draws' fault, not its own.
    bad = honest.copy()
    bad[(REFERENCE == 3) & (SOURCE == 0)] = 8
    assert _relabelling(_client(HELD), _probs(bad), REFERENCE, SOURCE) is None
    # The only draws of 0 were a doubted decoder's (masked out, -1): the client reads the 6s it
    # never held as 0; what its output 0 means cannot be judged, so it is not moved.
    held = np.array(HELD)
    held[6] = 0
    masked = np.where(REFERENCE == 0, -1, REFERENCE)
    confused = honest.copy()
    confused[REFERENCE == 6] = 0
    assert _relabelling(_client(held), _probs(confused), masked, SOURCE) is None


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, K)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def test_a_repaired_copy_permutes_and_negates_the_head_and_its_label_counts():
    torch.manual_seed(0)
    net = _Net()
    art = exporters.Artifact(
        path="client-000.onnx",
        size_bytes=0,
        model=None,
        input_names=[],
        output_names=[],
        metadata={"kind": "classifier", "label_counts": list(range(K))},
    )
    u = Upload(art, net)
    perm = np.array([3, 0, 1, 2, *range(4, K)])
    fixed = _adjusted(u, perm=perm, sign=-1)
    x = torch.randn(5, 4)
    with torch.no_grad():
        assert torch.allclose(fixed.module(x), -net(x)[:, perm], atol=1e-6)
        out = _adjusted(u, perm=perm, abstain={2}).module(x)
        want = net(x)[:, perm]
        assert torch.allclose(out[:, 2], want.mean(1), atol=1e-5)  # abstains: the mean logit
        assert torch.allclose(out[:, 3:], want[:, 3:], atol=1e-6)
    assert list(fixed.label_counts) == [int(c) for c in perm]
    assert list(u.label_counts) == list(range(K))  # the shared upload is unchanged
    with torch.no_grad():
        assert torch.allclose(u.module(x), net(x))
    assert _adjusted(Upload(art, None, "onnxruntime only"), perm=perm) is None


def test_too_few_for_a_committee_is_said_not_silently_kept():
    # Without decoders the reference is a median committee: of 2, one poisoned moves it.
    torch.manual_seed(0)
    uploads = [
        _stand_in(
            {"kind": "classifier", "label_counts": [5] * K, "client_id": f"client-00{i}"}, _Net()
        )
        for i in range(2)
    ]
    x = np.random.default_rng(0).standard_normal((200, 4)).astype(np.float32)
    verdict = judge(uploads, torch.device("cpu"), public=lambda: x)
    assert verdict.out == {} and verdict.swap == {}
    assert [n for _, n in verdict.notes] == [
        "classifiers not screened: 2 are too few for a committee that one poisoned cannot "
        "outvote (needs 3, or a decoder whose draws say their class)"
    ]
    kept, screened, notes = apply(verdict, uploads)
    assert kept == uploads and screened == [] and len(notes) == 1


class _Decoder(nn.Module):
    """A CVAE decoder stand-in: class c's image is TEMPLATES[pick[c]] plus z-driven jitter;
    `noise` draws uniform noise instead."""

    def __init__(self, pick, noise: bool = False):
        super().__init__()
        self.pick, self.noise = list(pick), noise

    def forward(self, z, onehot):
        if self.noise:
            return torch.rand(len(z), 1, 8, 8, generator=torch.Generator().manual_seed(1))
        base = TEMPLATES[[self.pick[c] for c in onehot.argmax(1).tolist()]]
        return (base + 0.05 * z[:, :1, None, None]).clamp(0, 1)


TEMPLATES = torch.rand(K, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def _stand_in(meta: dict, module: nn.Module) -> Upload:
    """An upload of `module` with `meta` and no file behind it (named after its client id)."""
    art = exporters.Artifact(
        path=f"{meta['client_id']}.onnx",
        size_bytes=0,
        model=None,
        input_names=[],
        output_names=[],
        metadata=meta,
    )
    return Upload(art, module)


def _decoder(i: int, module: nn.Module, counts) -> Upload:
    meta = {
        "kind": "decoder",
        "client_id": f"client-{i:03d}",
        "num_classes": K,
        "latent_dim": 2,
        "input_shape": [1, 8, 8],
        "label_counts": list(counts),
    }
    return _stand_in(meta, module)


def test_a_cvae_only_federation_is_screened_by_a_committee_of_its_decoders():
    # Label skew: each decoder draws 6 of the 10 classes, every class by >= 3 decoders.
    held = [np.roll([100] * 6 + [0] * 4, 2 * i) for i in range(5)]
    honest = [_decoder(i, _Decoder(range(K)), held[i]) for i in range(3)]
    noise = _decoder(3, _Decoder(range(K), noise=True), held[3])
    flipped = _decoder(4, _Decoder(derangement(K, 0)), held[4])
    verdict = judge([*honest, noise, flipped], torch.device("cpu"))
    assert set(verdict.out) == {"client-003.onnx", "client-004.onnx"}, verdict.out
    assert all("lie nearest the other decoders' images" in r for r in verdict.out.values())
    assert judge(honest, torch.device("cpu")).out == {}  # honest ones alone: none
    few = judge(honest[:2], torch.device("cpu"))
    assert few.out == {} and "2 are too few for a committee" in few.notes[0][1]


class _Nearest(nn.Module):
    """A stand-in classifier for the 8x8 template images: logits = -distance to each."""

    def forward(self, x):
        return -((x.reshape(len(x), 1, -1) - TEMPLATES.reshape(1, K, -1)) ** 2).sum(-1)


def _judge_upload(i: int) -> Upload:
    """A nearest-template classifier upload that holds every class."""
    meta = {"kind": "classifier", "client_id": f"client-1{i:02d}", "label_counts": [9] * K}
    return _stand_in(meta, _Nearest())


def test_a_flipped_decoder_is_relabelled_a_noise_one_screened_honest_ones_left():
    held = [np.roll([100] * 6 + [0] * 4, 2 * i) for i in range(5)]
    pi = derangement(K, 1)  # asked for label l, the flipped decoder draws class pi[l]
    decoders = [
        *(_decoder(i, _Decoder(range(K)), held[i]) for i in range(3)),
        _decoder(3, _Decoder(pi), held[3]),
        _decoder(4, _Decoder(range(K), noise=True), held[4]),
    ]
    judges = [_judge_upload(i) for i in range(3)]
    verdict = judge([*judges, *decoders], torch.device("cpu"))
    assert set(verdict.out) == {"client-004.onnx"}, verdict.out  # noise: nothing to repair
    assert set(verdict.swap) == {"client-003.onnx"}
    fixed = verdict.swap["client-003.onnx"]
    # Asked for class c, the copy draws class c, for every class whose label was drawn here.
    seen = [c for c in range(K) if fixed.label_counts[c] > 0]
    images = fixed.module(torch.zeros(len(seen), 2), torch.eye(K)[seen])
    assert torch.allclose(images, TEMPLATES[seen], atol=1e-6)
    assert sorted(fixed.label_counts[seen].tolist()) == [100] * 6  # its counts, relabelled
    assert any(n.startswith("client-003: draws repaired") for _, n in verdict.notes)


class _Templates(nn.Module):
    """A stand-in zoo classifier for the template images: features are -distance to each
    template, its head (a permutation matrix) says which output each class goes to."""

    def __init__(self, pi):
        super().__init__()
        self.head = nn.Linear(K, K)
        with torch.no_grad():
            self.head.weight.copy_(torch.eye(K)[np.argsort(pi)])  # output pi[y] <- feature y
            self.head.bias.zero_()

    def forward(self, x):
        d = ((x.reshape(len(x), 1, -1) - TEMPLATES.reshape(1, K, -1)) ** 2).sum(-1)
        return self.head(-10 * d)


def _classifier(i: int, pi, counts) -> Upload:
    meta = {"kind": "classifier", "client_id": f"client-{i:03d}", "label_counts": list(counts)}
    return _stand_in(meta, _Templates(pi))


def test_a_class_no_decoder_draws_is_covered_by_images_inverted_from_its_holders():
    # No decoder draws 8; the flipped client holds mostly 8s (its label pi[8]), no 4s or 6s.
    decoders = [_decoder(i, _Decoder(range(K)), [100] * 8 + [0, 100]) for i in range(3)]
    pi = derangement(K, 2)
    held = np.array([100, 100, 100, 100, 0, 100, 0, 100, 900, 100])
    flipped = _classifier(10, pi, held[np.argsort(pi)])  # its counts are by its own labels

    steps = []

    def verdict(judges_hold_8: bool):
        counts = [100] * 8 + [100 if judges_hold_8 else 0, 100]
        judges = [_classifier(11 + i, np.arange(K), counts) for i in range(3)]
        return judge(
            [*judges, flipped, *decoders],
            torch.device("cpu"),
            progress=lambda *step: steps.append(step[:3]),
        )

    covered = verdict(True)
    assert steps[-1] == ("robust screen: inversion", 3, 3)  # one inversion per holder, shown
    # A clean federation has nobody to place: nothing is inverted (a VGG-9 class costs ~45 s).
    steps.clear()
    honest = [_classifier(11 + i, np.arange(K), [100] * K) for i in range(4)]
    # under label skew too: one holds only 8 and 9, so no claimed class of it is drawn for real
    honest.append(_classifier(15, np.arange(K), [0] * 8 + [500, 0]))
    clean = judge([*honest, *decoders], torch.device("cpu"), progress=steps.append)
    assert clean.swap == {} and clean.out == {} and steps == []
    fixed = covered.swap["client-010.onnx"].module
    with torch.no_grad():
        read = fixed(TEMPLATES).argmax(1).tolist()
    assert [read[c] for c in range(K) if c not in (4, 6)] == [0, 1, 2, 3, 5, 7, 8, 9]  # 8 too
    assert any(
        "inverted from classifiers that hold them: 8 (client-011, client-012, client-013)" in n
        for _, n in covered.notes
    ), covered.notes
    # No judge holds 8: nothing to invert, and the repaired copy abstains there.
    uncovered = verdict(False)
    fixed = uncovered.swap["client-010.onnx"].module
    with torch.no_grad():
        read = fixed(TEMPLATES).argmax(1).tolist()
    assert read[8] != 8 and [read[c] for c in range(K) if c not in (4, 6, 8)] == [
        0,
        1,
        2,
        3,
        5,
        7,
        9,
    ]
    assert not any("inverted" in n for _, n in uncovered.notes)
    # One that holds every class, 8 among them, is repaired all the same (not screened: its
    # other nine classes are still worth having), abstaining on 8.
    held[4] = held[6] = 100
    flipped = _classifier(10, pi, held[np.argsort(pi)])
    every = verdict(False)
    assert every.out == {}, every.out
    with torch.no_grad():
        read = every.swap["client-010.onnx"].module(TEMPLATES).argmax(1).tolist()
    assert read[8] != 8 and [read[c] for c in range(K) if c != 8] == [*range(8), 9]


def test_inverted_images_that_do_not_transfer_never_move_an_honest_output():
    # Decoders draw neither 4 nor 9; the judges' inverted 4s and 9s join the probe. An honest
    # client holds 9 (not 4) and reads those 9s as 9 only 20% of the time (they do not
    # transfer to it) and the 4s as 9: what its output 9 means is only shown by real draws.
    rng = np.random.default_rng(0)
    drawn = [c for c in range(K) if c not in (4, 9)]
    reference = np.concatenate(
        [np.repeat(np.tile(drawn, DECODERS), PER), np.repeat([4, 4, 4, 9, 9, 9], 21)]
    )
    source = np.concatenate(
        [
            np.repeat(np.repeat(np.arange(DECODERS), len(drawn)), PER),
            np.repeat(-np.arange(1, 7), 21),
        ]
    )
    answers = reference.copy()
    nines, fours = reference == 9, reference == 4
    answers[nines] = np.where(rng.random(nines.sum()) < 0.2, 9, rng.choice([3, 5, 7], nines.sum()))
    answers[fours] = np.where(rng.random(fours.sum()) < 0.8, 9, rng.integers(0, K, fours.sum()))
    held = np.full(K, 100)
    held[4] = 0
    assert _relabelling(_client(held), _probs(answers), reference, source) is None


def test_a_large_federation_is_judged_in_shards_with_the_same_verdict():
    """Past `shard` uploads the screen judges seeded shards (linear, not quadratic, in the
    uploads); every shard gets its share of each kind, and a noise decoder and a flipped one are
    found as they are in one judgement."""
    held = [np.roll([100] * 6 + [0] * 4, 2 * i) for i in range(10)]
    decoders = [_decoder(i, _Decoder(range(K)), held[i]) for i in range(8)]
    decoders += [
        _decoder(8, _Decoder(derangement(K, 1)), held[8]),
        _decoder(9, _Decoder(range(K), noise=True), held[9]),
    ]
    federation = [*(_judge_upload(i) for i in range(6)), *decoders]
    parts = shards(federation, 8, seed=0)
    assert len(parts) == 2
    assert sorted(u.name for p in parts for u in p) == sorted(u.name for u in federation)
    assert [sum(u.kind == "classifier" for u in p) for p in parts] == [3, 3]
    assert [sum(u.kind == "decoder" for u in p) for p in parts] == [5, 5]
    assert shards(federation, 16, seed=0) == [federation]
    steps = []
    cpu = torch.device("cpu")
    whole = judge(federation, cpu)
    split = judge(federation, cpu, shard=8, progress=lambda *step: steps.append(step))
    assert set(split.out) == set(whole.out) == {"client-009.onnx"}, (split.out, whole.out)
    assert set(split.swap) == set(whole.swap) == {"client-008.onnx"}
    assert [s[1:3] for s in steps] == [(0, 2), (1, 2), (2, 2)]


def test_one_decoders_draws_of_an_unseen_class_never_move_an_honest_output():
    # MNIST Dir(0.1), seed 1 (bench/results/robust_clean.md): one decoder drew the only 3s; a
    # client that never held 3 and barely holds 7 read them as 7 (and its own 7s mostly as 9).
    rng = np.random.default_rng(3)
    held = np.array(HELD)
    held[3], held[7] = 0, 200  # 7: 7% of its data
    reference = np.where((REFERENCE == 3) & (SOURCE != 0), -1, REFERENCE)
    answers = _honest_answers(rng)
    answers[(REFERENCE == 3) & (rng.random(len(answers)) < 0.8)] = 7
    answers[(REFERENCE == 7) & (rng.random(len(answers)) < 0.66)] = 9
    assert _relabelling(_client(held), _probs(answers), reference, SOURCE) is None
    # One source, but the swap's other half on three: its output 3 answers the 7s.
    swapped = answers.copy()
    swapped[REFERENCE == 7] = 3
    found = _relabelling(_client(held), _probs(swapped), reference, SOURCE)
    assert found is not None and found.perm[3] == 7 and found.perm[7] == 3
    # Drawn by two decoders and read as 7 in both, it is a relabelling (the same answers).
    two = np.where((REFERENCE == 3) & (SOURCE == 2), -1, REFERENCE)
    found = _relabelling(_client(held), _probs(answers), two, SOURCE)
    assert found is not None and found.perm[3] == 7


def test_a_judge_that_cannot_read_a_class_never_moves_a_decoders_label():
    # MNIST Dir(0.1), seed 1: the judges of 8s (one of them held 8% 8s) read an honest
    # decoder's 8s as 2 and the other decoder's 8s as 9: they do not know 8.
    per = 64
    source = np.repeat([0, 1, 1, 2, 2], per)  # decoder 0: 8s only; 1: 8s and 1s; 2: 2s and 1s
    asked = np.repeat([8, 8, 1, 2, 1], per)
    holders = {c: (1, 2) for c in range(K)}
    mine_8 = (source == 0) & (asked == 8)

    def reading(others_8: int):
        read = asked.copy()
        read[mine_8] = 2
        read[(source == 1) & (asked == 8)] = others_8
        return lambda a: read

    assert _decoder_relabelling(0, source, asked, reading(9), K, holders) is None
    # The judges reading the other decoder's 8s as 8: decoder 0's 8s are 2s relabelled.
    perm, seen = _decoder_relabelling(0, source, asked, reading(8), K, holders)
    assert perm[2] == 8 and 2 in seen
    # ... but not on the word of one judge, whatever it reads (30-step clients, Dir(0.1)).
    one = holders | {8: (1,)}
    assert _decoder_relabelling(0, source, asked, reading(8), K, one) is None


def test_a_decoder_shown_relabelled_has_its_other_labels_moved_on_looser_evidence():
    # A flipped decoder (seed 0 of the robust bench): its 8s, drawn by others too and held by
    # two judges, are plainly 2s; its 5s, which no other decoder draws and one judge holds,
    # are read as 3. Shown relabelled by its 8s, it moves its 5s as well.
    per = 64
    source = np.repeat([0, 0, 1, 1], per)
    asked = np.repeat([8, 5, 8, 1], per)
    read = np.repeat([2, 3, 8, 1], per)
    holders = {c: (1, 2) for c in range(K)} | {5: (1,)}
    perm, seen = _decoder_relabelling(0, source, asked, lambda a: read, K, holders)
    assert perm[2] == 8 and perm[3] == 5 and {2, 3} <= seen
    # The 5s alone (its 8s drawn right) are no evidence: one judge, no other decoder's 5s.
    read_right = np.repeat([8, 3, 8, 1], per)
    assert _decoder_relabelling(0, source, asked, lambda a: read_right, K, holders) is None


def test_draws_the_judges_cannot_read_leave_the_screens_reference_where_they_know_the_class():
    """The classifiers' screen is not ranked on draws the judges read as nothing (noise
    labelled c) where they read another decoder's draws of c plainly, nor on any draw of a
    decoder they read as nothing over its classes, one at least of them known; a decoder whose
    classes no other decoder's draws are read plainly stays in (the judges may be what is weak
    there)."""
    from edgefl.fusion.screen.decoders import _judged_per_class
    from edgefl.fusion.screen.judgement import _unread

    # decoder 0 draws 0-4 well; decoder 1 draws 0-9 as noise; decoder 2 draws 5-9 as noise
    drawn = [range(5), range(K), range(5, K)]
    source = np.concatenate([np.full(PER * len(c), d) for d, c in enumerate(drawn)])
    asked = np.concatenate([np.repeat(list(c), PER) for c in drawn])
    read = np.where(source == 0, asked, 3)  # the judges: noise reads as 3
    decoders = [_client([100 if c in cs else 0 for c in range(K)]) for cs in drawn]
    judges = [_client([100] * K), _client([100] * K)]
    probe = SimpleNamespace(source=source, asked=asked)

    def unread():
        probs = [_probs(read), _probs(read)]
        return _unread(_judged_per_class(decoders, source, asked, judges, probs, [0, 1]), probe)

    mask = unread()
    assert not mask[source == 0].any()  # read plainly
    assert mask[source == 1].all()  # nothing over its classes, 0-4 known: all of it
    assert not mask[source == 2].any()  # no decoder's 5-9 read plainly: left in
    # one class of decoder 1 read well: only its known classes read as nothing leave
    read[(source == 1) & (asked == 9)] = 9
    read[(source == 1) & (asked == 8)] = 8
    read[(source == 1) & (asked == 7)] = 7
    read[(source == 1) & (asked == 6)] = 6
    mask = unread()
    # (its 3s, read as 3 more often than its other draws are, are not read as nothing)
    assert mask[(source == 1) & np.isin(asked, [0, 1, 2, 4])].all()
    assert not mask[(source == 1) & ((asked == 3) | (asked >= 5))].any()


def test_most_classifiers_relabelled_are_repaired_when_more_uploads_stand_behind_the_draws():
    """Four flipped classifiers of five: repaired when five decoders' draws and the honest
    classifier stand against them. Five of five against one decoder's draws: left as sent, the
    draws taken for the odd ones."""
    from edgefl.fusion.screen.classifier_repair import _relabellings

    rng = np.random.default_rng(4)
    pi = derangement(K, 3)

    def federation(decoders: int, honest: int):
        reference = np.repeat(np.tile(np.arange(K), decoders), PER)
        source = np.repeat(np.repeat(np.arange(decoders), K), PER)
        out = []
        for i in range(5):
            answers = np.where(rng.random(len(reference)) < 0.9, reference, 0)
            flipped = i >= honest
            counts = np.asarray(HELD)[np.argsort(pi)] if flipped else np.asarray(HELD)
            out.append((_client(counts), _probs(pi[answers] if flipped else answers)))
        probe = SimpleNamespace(source=source, x=torch.zeros(len(reference), 1))
        return [c for c, _ in out], [p for _, p in out], reference, probe

    clients, probs, reference, probe = federation(decoders=5, honest=1)
    found, notes = _relabellings(clients, probs, reference, [0], probe, 0, "cpu", None)
    assert [f is not None for f in found] == [False, True, True, True, True], notes
    clients, probs, reference, probe = federation(decoders=1, honest=0)
    found, notes = _relabellings(clients, probs, reference, [0], probe, 0, "cpu", None)
    assert found == [None] * 5 and "the draws are the odd ones" in notes[-1][1], notes


def test_flat_decoders_that_are_each_others_reference_are_set_aside_by_the_judges_alone():
    """Two noise decoders, the only drawers of 5s and 6s, are each other's image reference
    there (their draws differ by a few hundredths by class, which a nearest reference tells
    apart); their draws hardly vary, so the judges alone read them, and they read nothing. A
    decoder whose draws vary as much as the honest ones' but that the judges cannot read (as
    on sensor windows) keeps its images' verdict."""
    from edgefl.fusion.screen.decoders import _judge_decoders

    rng = np.random.default_rng(0)
    templates = rng.normal(0, 1, (K, 64))
    drawn = [range(5), range(5), range(5, 7), range(5, 7), range(5)]
    source = np.concatenate([np.full(PER * len(c), d) for d, c in enumerate(drawn)])
    asked = np.concatenate([np.repeat(list(c), PER) for c in drawn])
    x = templates[asked] + rng.normal(0, 1.0, (len(asked), 64))
    flat = np.isin(source, [2, 3])
    x[flat] = 0.5 + 0.02 * asked[flat, None] + rng.normal(0, 0.002, (flat.sum(), 64))
    read = np.where(np.isin(source, [0, 1]), asked, 3)  # decoders 2-4: read as nothing
    decoders = [
        SimpleNamespace(name=f"d{d}", label_counts=[100 if c in cs else 0 for c in range(K)])
        for d, cs in enumerate(drawn)
    ]
    judges = [_client([100] * K), _client([100] * K)]
    probs = [_probs(read), _probs(read)]
    out = _judge_decoders(
        decoders, torch.tensor(x, dtype=torch.float32), source, asked, judges, probs, [0, 1]
    )
    assert set(out) == {"d2", "d3"}, out
    assert "hardly vary" in out["d2"]
    # most decoders flat (the median decoder reads as nothing): still the judges' call, since
    # they read decoder 0 plainly
    keep = np.isin(source, [0, 2, 3])
    out = _judge_decoders(
        [decoders[0], decoders[2], decoders[3]],
        torch.tensor(x[keep], dtype=torch.float32),
        np.searchsorted([0, 2, 3], source[keep]),
        asked[keep],
        judges,
        [p[keep] for p in probs],
        [0, 1],
    )
    assert set(out) == {"d2", "d3"}, out


class _Lookup(nn.Module):
    """A classifier whose logits on probe sample i are row i of a table (x[:, 0] holds i)."""

    def __init__(self, logits: np.ndarray):
        super().__init__()
        self.register_buffer("table", torch.tensor(logits, dtype=torch.float32))

    def forward(self, x):
        return self.table[x[:, 0].long()]


def test_labels_no_judge_reads_plainly_do_not_set_an_honest_client_aside():
    """Decoders whose draws no judge reads plainly (DP-trained bands on HAPT: -0.06 to +0.04)
    are no evidence on what a classifier's outputs mean: the classifiers are judged by their
    committee, and a weak honest one is kept. Where the judges read the draws plainly, the
    same weak client is still judged on the decoders' labels and set aside."""
    from edgefl.fusion.screen.judgement import _screen_classifiers
    from edgefl.fusion.screen.probe import Probe

    n = len(REFERENCE)
    x = torch.zeros(n, 4)
    x[:, 0] = torch.arange(n)
    decoders = [SimpleNamespace(name=f"d{d}", label_counts=[100] * K) for d in range(DECODERS)]

    def verdict(pull: float) -> dict:
        rng = np.random.default_rng(0)
        clients = []
        for name, w in (("c0", pull), ("c1", pull), ("c2", pull), ("c3", pull), ("weak", 0.15)):
            logits = rng.normal(0, 1, (n, K))
            logits[np.arange(n), REFERENCE] += w  # a pull toward the class each draw was asked
            clients.append(
                SimpleNamespace(name=name, module=_Lookup(logits), label_counts=[100] * K, meta={})
            )
        probe = Probe(x, REFERENCE, SOURCE)
        return _screen_classifiers(clients, decoders, probe, "cpu", 0, None).out

    assert verdict(pull=0.6) == {}  # the judges read a class of draws at +0.43 at most
    assert set(verdict(pull=4.0)) == {"weak"}
