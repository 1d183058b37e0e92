"""Co-Boosting: its pieces (hard-sample CE, the weights' constraint and sign steps, the
diversifying step, the pool's aligned targets) and the whole method against the teachers it
distils on the tiny digits federation (tests/fed_fixtures.py)."""

from __future__ import annotations

import pytest
import torch
from fed_fixtures import build_federation, fuse_digits
from torch.nn import functional as F

from edgefl.fusion import METHODS
from edgefl.fusion.averaging import COMBINES, combine_outputs
from edgefl.fusion.coboosting import (
    SignSteps,
    diversify,
    enhance_weights,
    hard_ce,
    pooled_ensemble,
    project,
    weighted_ensemble,
)
from edgefl.fusion.generator import ReplayPool


@pytest.fixture(scope="session")
def federation(tmp_path_factory):
    return build_federation(tmp_path_factory.mktemp("fed"))


def test_hard_ce_is_ce_at_gamma_zero_and_favours_hard_samples():
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(8, 5, generator=g)
    y = torch.randint(0, 5, (8,), generator=g)
    torch.testing.assert_close(hard_ce(logits, y, 0.0), F.cross_entropy(logits, y))
    # An easy sample (p_y ~ 1) weighs almost nothing at gamma = 1; a hard one keeps its CE.
    easy = torch.tensor([[10.0, 0.0]])
    hard = torch.tensor([[0.0, 10.0]])
    label = torch.tensor([0])
    assert hard_ce(easy, label, 1.0) < 1e-3 * F.cross_entropy(easy, label)
    assert hard_ce(hard, label, 1.0) == pytest.approx(float(F.cross_entropy(hard, label)), rel=1e-3)


@pytest.mark.parametrize(
    "w", [[0.3, 0.9, -0.2], [2.0, 0.0, 0.0], [0.2, 0.2, 0.2], [5.0, 4.0, -1.0]]
)
def test_simplex_projection(w):
    w = torch.tensor(w)
    p = project(w, "simplex")
    assert (p >= 0).all() and float(p.sum()) == pytest.approx(1.0, abs=1e-6)
    torch.testing.assert_close(project(p, "simplex"), p)  # a point of the simplex stays
    # The nearest point: no other point of the simplex (a few random ones) is closer.
    others = torch.distributions.Dirichlet(torch.ones(3)).sample((200,))
    assert float((p - w).norm()) <= float((others - w).norm(dim=1).min()) + 1e-6


def test_box_projection_clamps():
    torch.testing.assert_close(
        project(torch.tensor([-0.5, 0.4, 1.7]), "box"), torch.tensor([0.0, 0.4, 1.0])
    )


def _two_teachers(n=256, c=4, seed=0):
    """Teacher 0 labels every sample right, teacher 1 confidently wrong on half of them."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, c, (n,), generator=g)
    good = 4 * F.one_hot(y, c).float()
    wrong = (y + 1) % c
    bad = 4 * F.one_hot(torch.where(torch.arange(n) % 2 == 0, wrong, y), c).float()
    return torch.stack([good, bad], 1), y  # (n, m, c) as the pool stores them


@pytest.mark.parametrize("combine", COMBINES)
@pytest.mark.parametrize("constraint", ["box", "simplex"])
def test_weights_move_to_the_teacher_that_is_right(constraint, combine):
    logits, y = _two_teachers()
    w0 = torch.tensor([0.5, 0.5])
    w, ce = enhance_weights(
        w0, logits, y, step=0.05, steps=5, constraint=constraint, combine=combine
    )
    assert w[0] > w[1]
    after = F.cross_entropy(weighted_ensemble(logits.transpose(0, 1), w, combine), y)
    assert float(after) < ce  # the pool's CE fell
    if constraint == "simplex":
        assert float(w.sum()) == pytest.approx(1.0)
    else:
        assert ((w >= 0) & (w <= 1)).all()
    same, _ = enhance_weights(
        w0, logits, y, step=0.0, steps=5, constraint=constraint, combine=combine
    )
    torch.testing.assert_close(same, w0)  # mu = 0: the plain average


@pytest.mark.parametrize("constraint", ["box", "simplex"])
def test_a_weight_floor_keeps_the_wrong_teacher_heard(constraint):
    logits, y = _two_teachers()
    w0 = torch.tensor([0.5, 0.5])
    bare, _ = enhance_weights(w0, logits, y, step=0.2, steps=20, constraint=constraint)
    assert float(bare[1]) == 0.0  # without a floor the wrong teacher is silenced
    kept, _ = enhance_weights(w0, logits, y, step=0.2, steps=20, constraint=constraint, floor=0.25)
    assert float(kept[1]) == pytest.approx(0.25 / 2)  # a quarter of the even weight 1/2
    assert float(kept[0]) > float(kept[1])


def _mixed_teachers(n=400, c=4, seed=0):
    """Teacher 0 right on every sample but unsure, teacher 1 sure and wrong on a quarter: the
    pool's CE is lowest at a mixture inside the box, not at a corner."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, c, (n,), generator=g)
    wrong = torch.where(torch.arange(n) % 4 == 0, (y + 1) % c, y)
    return torch.stack([2 * F.one_hot(y, c).float(), 6 * F.one_hot(wrong, c).float()], 1), y


@pytest.mark.parametrize("adapt", [False, True])
def test_adapted_sign_steps_come_to_rest_where_fixed_ones_oscillate(adapt):
    logits, y = _mixed_teachers()
    w, sizes, path = torch.tensor([0.5, 0.5]), SignSteps(adapt), []
    for _ in range(30):  # one step an epoch, as fuse takes them
        w, _ = enhance_weights(w, logits, y, step=0.05, steps=1, constraint="box", sizes=sizes)
        path.append(w)
    moves = [float((b - a).abs().max()) for a, b in zip(path[-7:-1], path[-6:], strict=True)]
    assert 0.0 < float(w[1]) < float(w[0]) < 1.0  # the sure-but-wrong teacher weighs less
    if adapt:
        assert max(moves) < 1e-3  # at rest
        assert float(sizes.size.max()) <= 0.05  # never above mu
    else:
        assert min(moves) == pytest.approx(0.05)  # over its best and back, every epoch


def test_sign_steps_halve_on_a_flip_and_grow_to_the_cap():
    sizes = SignSteps(adapt=True)
    up, down = torch.tensor([1.0]), torch.tensor([-1.0])
    assert float(sizes(up, 0.1)) == pytest.approx(0.1)
    assert float(sizes(down, 0.1)) == pytest.approx(-0.05)  # flipped: half
    assert float(sizes(down, 0.1)) == pytest.approx(-0.06)  # held: x1.2
    for _ in range(10):
        step = sizes(down, 0.08)
    assert float(step) == pytest.approx(-0.08)  # capped by the epoch's mu
    assert float(SignSteps(adapt=False)(down, 0.1)) == pytest.approx(-0.1)  # the paper's


def test_diversify_stays_within_eps_and_range():
    torch.manual_seed(0)
    teachers = [torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3)) for _ in range(2)]
    for t in teachers:
        t.requires_grad_(False)
    x = torch.rand(6, 1, 4, 4)
    w = torch.tensor([0.5, 0.5])
    a = diversify(teachers, x, w, 0.1, 4.0, torch.Generator().manual_seed(1))
    b = diversify(teachers, x, w, 0.1, 4.0, torch.Generator().manual_seed(1))
    torch.testing.assert_close(a, b)  # seeded
    assert (a - x).abs().max() <= 0.1 + 1e-6 and a.min() >= 0 and a.max() <= 1
    assert not torch.equal(a, x)
    assert all(p.grad is None for t in teachers for p in t.parameters())


def test_pool_keeps_tuple_targets_aligned():
    rng = torch.Generator().manual_seed(0)
    pool = ReplayPool(50)
    for b in range(10):
        ids = torch.arange(20 * b, 20 * (b + 1))
        pool.add(ids.float().view(-1, 1), (ids.float().view(-1, 1).repeat(1, 3), ids), rng)
    x, (t, y) = pool.contents()
    assert len(x) == 50 and pool.seen == 200
    assert torch.equal(x[:, 0], t[:, 0]) and torch.equal(x[:, 0].long(), y)
    xs, (ts, ys) = pool.sample(16, rng)
    assert torch.equal(xs[:, 0].long(), ys) and torch.equal(xs[:, 0], ts[:, 2])


def test_reaches_its_teachers_ensemble_on_a_tiny_federation(federation, tmp_path):
    """Co-Boosting at its cpu defaults, distilling one pass over the pool each epoch, comes
    within 15 points of the two digits classifiers' logit ensemble (seen: ensemble 78.6%,
    Co-Boosting 68.9%; 63.6% with the cpu default of 60 steps an epoch; chance 10%). With
    the ensemble weights collapsed to 0 (box constraint, per-batch steps of an earlier draft)
    it fell to 46%."""
    ensemble = fuse_digits(federation, tmp_path, "ensemble")
    rep = fuse_digits(federation, tmp_path, "coboosting", kd_steps=0)
    acc = {"ensemble": ensemble["accuracy"], "coboosting": rep["accuracy"]}
    assert acc["ensemble"] > 0.7
    assert acc["coboosting"] >= acc["ensemble"] - 0.15, acc
    weights = rep["ensemble_weights"]
    assert set(weights) == {"client-000", "client-001"}
    assert all(0 < v <= 1 for v in weights.values())
    hist = rep["loss_history"]
    assert len(hist["weights"]) == METHODS.get("coboosting").make_config({}).epochs
    assert rep["synthetic_pool"] == rep["synthetic_made"] == 10 * 30 * 64  # every step pooled


def test_the_weights_choose_the_mixture_never_the_logits_scale():
    """As the authors' code: A_w is divided by the weights' sum, so box-constrained sign
    steps that lower every weight together cannot shrink the ensemble's logits."""
    logits, y = _two_teachers()
    per_teacher = logits.transpose(0, 1)
    w = torch.tensor([0.5, 0.5])
    torch.testing.assert_close(
        weighted_ensemble(per_teacher, 0.31 * w), weighted_ensemble(per_teacher, w)
    )
    torch.testing.assert_close(weighted_ensemble(per_teacher, w), per_teacher.mean(0))


def test_weighted_probabilities_are_the_weighted_mean_of_the_teachers_softmax():
    """combine=probabilities: A_w's softmax is sum_k w_k softmax(f_k) / sum_k w_k, whatever the
    teachers' logit scales (x1, x10, x100 here), a zero weight silences its teacher, and the
    pool's (n, m, c) layout gives the same ensemble."""
    g = torch.Generator().manual_seed(0)
    scale = torch.tensor([1.0, 10.0, 100.0])[:, None, None]
    logits = torch.randn(3, 32, 5, generator=g) * scale
    w = torch.tensor([0.2, 0.5, 0.0])
    got = weighted_ensemble(logits, w, "probabilities")
    want = (logits.softmax(-1) * w[:, None, None]).sum(0) / w.sum()
    torch.testing.assert_close(got.softmax(-1), want)
    torch.testing.assert_close(got, weighted_ensemble(logits[:2], w[:2], "probabilities"))
    torch.testing.assert_close(
        weighted_ensemble(logits, 0.31 * w, "probabilities"), got
    )  # the weights choose the mixture, never its scale
    torch.testing.assert_close(pooled_ensemble(logits.transpose(0, 1), w, how="probabilities"), got)
    even = weighted_ensemble(logits, torch.full((3,), 0.4), "probabilities")
    torch.testing.assert_close(even, combine_outputs(logits, "probabilities"))
    # a committee of teachers 0 and 1 for every sample: their weighted mixture
    members = torch.tensor([0, 1]).expand(32, -1)
    torch.testing.assert_close(
        pooled_ensemble(logits.transpose(0, 1)[:, :2], w, members, "probabilities"), got
    )
