"""Membership inference (edgefl.privacy.audit): the metrics on inputs whose answer is known, and
each attack against a tiny model that leaks by construction (it memorised its members), beside
a control that does not. Tiny synthetic models and data: each test runs in about a second."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from edgefl.errors import DataError
from edgefl.models.nets import MLPDecoder
from edgefl.privacy import audit

# --- metrics ----------------------------------------------------------------------------------


def test_perfectly_separated_scores_give_auc_1_and_tpr_1():
    members, nonmembers = np.linspace(1, 2, 200), np.linspace(-2, -1, 200)
    m = audit.evaluate_attack(members, nonmembers, bootstrap=200)
    assert m.auc == 1.0 and m.auc_ci == (1.0, 1.0)
    assert m.tpr == {0.01: 1.0}  # 200 non-members cannot resolve an FPR of 0.1 %
    assert m.tpr_ci[0.01] == (1.0, 1.0)
    # Reversed, the attack is always wrong.
    assert audit.roc_auc(nonmembers, members) == 0.0
    assert audit.tpr_at_fpr(nonmembers, members, 0.01) == 0.0


def test_identical_distributions_give_auc_near_half_with_the_interval_covering_it():
    rng = np.random.default_rng(1)
    m = audit.evaluate_attack(rng.normal(size=1000), rng.normal(size=1000), seed=3)
    assert abs(m.auc - 0.5) < 0.04
    assert m.auc_ci[0] < 0.5 < m.auc_ci[1]
    assert 0.02 < m.auc_ci[1] - m.auc_ci[0] < 0.1  # an interval of 1,000 + 1,000 scores
    assert set(m.tpr) == {0.01, 0.001}  # 1,000 non-members resolve 0.1 %
    assert m.tpr[0.01] < 0.05 and m.tpr_ci[0.01][0] <= 0.01 <= m.tpr_ci[0.01][1]


def test_the_bootstrap_is_seeded():
    rng = np.random.default_rng(2)
    a, b = rng.normal(0.3, 1, 300), rng.normal(0, 1, 300)
    assert audit.evaluate_attack(a, b, seed=5) == audit.evaluate_attack(a, b, seed=5)
    assert audit.evaluate_attack(a, b, seed=5).auc_ci != audit.evaluate_attack(a, b, seed=6).auc_ci


def test_auc_counts_ties_half():
    # Pairs (member, non-member): (1,0) win, (1,1) tie, (2,0) win, (2,1) win -> 3.5 / 4.
    assert audit.roc_auc([1, 2], [0, 1]) == pytest.approx(0.875)


def test_tpr_at_1_percent_fpr_on_a_hand_made_case():
    # 100 non-members: 0..99. At 1 % FPR one false positive is allowed, so the threshold must
    # sit above the second highest non-member (98): only 99 is flagged (FPR exactly 1 %).
    nonmembers = np.arange(100.0)
    members = np.array([150.0, 99.5, 99.0, 98.5, 98.0, 50.0, 10.0, 0.0])
    # Members strictly above 98: 150, 99.5, 99, 98.5 -> 4 of 8. (98 itself would need a
    # threshold <= 98, which flags 98 and 99: 2 % FPR.)
    assert audit.tpr_at_fpr(members, nonmembers, 0.01) == 0.5
    # 0 % FPR: above every non-member (99): 150 and 99.5.
    assert audit.tpr_at_fpr(members, nonmembers, 0.0) == 0.25
    # 5 %: above the 6th highest (94): 150, 99.5, 99, 98.5, 98.
    assert audit.tpr_at_fpr(members, nonmembers, 0.05) == 5 / 8
    assert audit.tpr_at_fpr(members, nonmembers, 1.0) == 1.0
    # Too few non-members to show 0.1 %: that TPR is not reported.
    assert audit.resolves(0.01, 100) and not audit.resolves(0.001, 100)


def test_scores_that_are_not_finite_are_refused():
    with pytest.raises(DataError, match="not finite"):
        audit.roc_auc([1.0, np.nan], [0.0])
    with pytest.raises(DataError, match="no non-member scores"):
        audit.evaluate_attack([1.0], [])


# --- classifiers ------------------------------------------------------------------------------


def _memoriser(x: np.ndarray, y: np.ndarray, seed: int, steps: int = 300) -> nn.Module:
    """A small MLP fitted to (x, y) until it has memorised them (random labels: nothing else
    to learn)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(x.shape[1], 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(xt), yt).backward()
        opt.step()
    return model.eval()


def _random_labelled(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 10)).astype(np.float32), rng.integers(0, 4, n)


def test_the_loss_attack_finds_a_classifier_that_memorised_random_labels():
    members, nonmembers = _random_labelled(40, 0), _random_labelled(40, 1)
    model = _memoriser(*members, seed=0)
    m = audit.evaluate_attack(
        audit.loss_scores(model, *members), audit.loss_scores(model, *nonmembers), bootstrap=200
    )
    assert m.auc > 0.9 and m.auc_ci[0] > 0.75
    # The control: a model that never saw either set cannot tell them apart.
    other = _memoriser(*_random_labelled(40, 2), seed=1)
    control = audit.evaluate_attack(
        audit.loss_scores(other, *members), audit.loss_scores(other, *nonmembers), bootstrap=200
    )
    assert control.auc < 0.7


def test_logit_confidence_is_the_log_odds_of_the_true_label():
    model = nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(3))
    x = np.array([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    p = torch.softmax(torch.from_numpy(x), 1).numpy()
    got = audit.logit_confidence(model, x, np.array([0, 2]))
    assert got == pytest.approx(np.log([p[0, 0] / (1 - p[0, 0]), p[1, 2] / (1 - p[1, 2])]))


def test_lira_scores_are_standard_deviations_above_the_out_mean():
    shadow = np.array([[0.0, 10.0], [2.0, 12.0], [1.0, 14.0]])  # means 1, 12; variances 1, 4
    target = np.array([3.0, 12.0])
    own = audit.lira_offline_scores(target, shadow, global_variance=False)
    assert own == pytest.approx([2.0, 0.0], abs=1e-6)
    pooled = audit.lira_offline_scores(target, shadow)  # 3 shadows: one variance, (1 + 4) / 2
    assert pooled == pytest.approx([2 / np.sqrt(2.5), 0.0], abs=1e-6)
    with pytest.raises(DataError, match="at least 2 shadow"):
        audit.lira_offline_scores(target, shadow[:1])


def test_offline_lira_finds_the_memorising_classifier():
    members, nonmembers = _random_labelled(40, 0), _random_labelled(40, 1)
    target = _memoriser(*members, seed=0)
    qx = np.concatenate([members[0], nonmembers[0]])
    qy = np.concatenate([members[1], nonmembers[1]])
    pool_x, pool_y = _random_labelled(200, 3)  # the same distribution, no query in it
    shadow = audit.shadow_confidences(
        lambda x, y, seed: _memoriser(x, y, seed, steps=150),
        pool_x,
        pool_y,
        qx,
        qy,
        shadows=3,
        size=40,
    )
    assert shadow.shape == (3, 80)
    scores = audit.lira_offline_scores(audit.logit_confidence(target, qx, qy), shadow)
    m = audit.evaluate_attack(scores[:40], scores[40:], bootstrap=200)
    assert m.auc > 0.9


# --- decoders ---------------------------------------------------------------------------------


def _decoder_that_memorised(images: np.ndarray, labels: np.ndarray, seed: int) -> MLPDecoder:
    """A decoder fitted (latent codes and weights together, as a generator that memorised
    its data) to reproduce each of a handful of images from a code of its own."""
    torch.manual_seed(seed)
    dec = MLPDecoder(2, 2, 32, images.shape[1:])
    codes = torch.randn(len(images), 2, requires_grad=True)
    onehot = F.one_hot(torch.from_numpy(labels), 2).float()
    target = torch.from_numpy(images)
    opt = torch.optim.Adam([*dec.parameters(), codes], lr=1e-2)
    for _ in range(600):
        opt.zero_grad()
        F.binary_cross_entropy(dec(codes, onehot), target).backward()
        opt.step()
    return dec.eval()


def _handful(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = (rng.random((8, 1, 4, 4)) < 0.5).astype(np.float32)
    return images, np.arange(8) % 2


def test_reconstruction_finds_the_decoder_that_memorised_its_images():
    (xm, ym), (xn, yn) = _handful(0), _handful(1)
    target, reference = _decoder_that_memorised(xm, ym, 0), _decoder_that_memorised(xn, yn, 1)
    how = audit.Reconstruction(restarts=8, steps=60)
    qx, qy = np.concatenate([xm, xn]), np.concatenate([ym, yn])
    dist = audit.reconstruction_distances(target, qx, qy, 2, how)
    assert dist[:8].max() < 0.05  # its own images come back almost exactly
    m = audit.evaluate_attack(audit.distance_scores(dist)[:8], audit.distance_scores(dist)[8:])
    assert m.auc > 0.9
    # Calibrated by the reference decoder (which memorised the non-members instead).
    ref = audit.reconstruction_distances(reference, qx, qy, 2, how)
    calibrated = audit.distance_scores(dist, ref)
    assert audit.roc_auc(calibrated[:8], calibrated[8:]) == 1.0
    # The decoder comes back as it was given: no gradient state switched off for good.
    assert all(p.requires_grad for p in target.parameters())


def test_sample_distance_finds_the_decoder_that_memorised_its_images():
    (xm, ym), (xn, yn) = _handful(0), _handful(1)
    target = _decoder_that_memorised(xm, ym, 0)
    qx, qy = np.concatenate([xm, xn]), np.concatenate([ym, yn])
    dist = audit.sample_distances(target, qx, qy, 2, samples=500)
    scores = audit.distance_scores(dist)
    assert audit.roc_auc(scores[:8], scores[8:]) > 0.9


# --- label counts -----------------------------------------------------------------------------


def test_histogram_linkage_links_distinct_clients_and_not_identical_ones():
    rng = np.random.default_rng(0)
    mix = rng.dirichlet([0.5] * 6, size=10)  # 10 clients' class proportions
    first = np.stack([rng.multinomial(200, p) for p in mix])
    second = np.stack([rng.multinomial(200, p) for p in mix])
    link = audit.histogram_linkage(first, second)
    assert link.clients == 10 and link.chance == 0.1
    assert link.rate >= 0.8 and link.unique == 10
    # Clients that all hold the same balanced mix: their histograms say nothing of who is who.
    same = np.full((10, 6), 30)
    flat = audit.histogram_linkage(same, same)
    assert flat.linked == 1 and flat.unique == 0  # every tie goes to client 0


# --- the benchmark ----------------------------------------------------------------------------


def test_the_privacy_bench_loads_without_path_edits_and_renders_a_table(monkeypatch):
    path = Path(__file__).resolve().parents[2] / "bench" / "bench_privacy.py"
    spec = importlib.util.spec_from_file_location("bench_privacy", path)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_privacy", bench)  # its dataclasses look it up
    spec.loader.exec_module(bench)
    m = audit.evaluate_attack(np.arange(100.0) + 0.5, np.arange(100.0), bootstrap=50)
    at_8 = audit.AttackMetrics(0.51, (0.48, 0.54), {0.01: 0.01}, {0.01: (0.0, 0.03)}, 200, 200)
    rows = [
        bench.row("mnist", "classifier", None, "loss", m, "acc 0.950 held-out"),
        bench.row("hapt", "CVAE decoder", 8.0, "reconstruction", at_8, "loss 250.0"),
    ]
    text = bench.render({"header": {"command": "python bench/bench_privacy.py"}, "rows": rows})
    assert "| mnist | classifier | none | loss | 0.505" in text
    # Issue 57's target at epsilon 8: an AUC interval below 0.55 meets it; a TPR interval
    # reaching past 2 % leaves it to the estimate. Rows without DP are not judged.
    assert (
        "| hapt | CVAE decoder | reconstruction | met | met by the estimate (0.010); the "
        "interval straddles 0.02 |" in text
    )
    assert "| mnist | classifier | loss | " not in text
