"""DP-SGD steps (issue 57, item 1): each sample's gradient clipped and summed exactly as a loop
over the samples would, Gaussian noise of std sigma * C, Poisson batches of mean q n, one step
per expected batch (empty ones too), a zoo CVAE that learns under DP, and every zoo model either
trainable privately or made so by replacing its BatchNorm."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from edgefl.models.zoo import ZOO, build_model, make_spec
from edgefl.privacy import DPConfig, plan_dp
from edgefl.privacy.dpsgd import (
    clipped_sum,
    dp_ready,
    dp_train_epoch,
    group_norm_for,
    noisy_step,
    per_sample_grads,
    poisson_batch,
    replace_batchnorm,
)
from edgefl.training import cvae_loss, evaluate


def classifier_loss(forward, x, y):
    return F.cross_entropy(forward(x), y)


def generator_loss(forward, x, onehot):  # labels enter one-hot: F.one_hot cannot run in vmap
    recon, mu, logvar = forward(x, onehot)
    return cvae_loss(recon, x, mu, logvar)


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(make_spec("mlp", (1, 4, 4), 3, hidden=[8]))


def _data(n: int = 10, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 4, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def _naive_clipped_sum(model, x, y, clip):
    """One backward pass per sample, clipped by hand."""
    total = [torch.zeros_like(p) for p in model.parameters()]
    for i in range(len(x)):
        model.zero_grad()
        classifier_loss(model, x[i : i + 1], y[i : i + 1]).backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        norm = torch.sqrt(sum((g**2).sum() for g in grads))
        scale = min(1.0, clip / float(norm))
        total = [t + scale * g for t, g in zip(total, grads, strict=True)]
    return total


def _norms(model, x, y):
    out = []
    for i in range(len(x)):
        model.zero_grad()
        classifier_loss(model, x[i : i + 1], y[i : i + 1]).backward()
        out.append(math.sqrt(sum(float((p.grad**2).sum()) for p in model.parameters())))
    return out


def test_clipped_sum_equals_a_loop_over_samples():
    model, (x, y) = _mlp(), _data()
    norms = _norms(model, x, y)
    clip = sorted(norms)[len(norms) // 2]  # half the samples are clipped, half are not
    sums, loss_sum = clipped_sum(model, classifier_loss, x, y, clip, chunk=3)
    expected = _naive_clipped_sum(model, x, y, clip)
    for (name, _), want in zip(model.named_parameters(), expected, strict=True):
        torch.testing.assert_close(sums[name], want, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        assert loss_sum == pytest.approx(float(F.cross_entropy(model(x), y, reduction="sum")))


def test_unclipped_sum_is_n_times_the_batch_gradient():
    model, (x, y) = _mlp(), _data()
    sums, _ = clipped_sum(model, classifier_loss, x, y, clip=1e6)
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(sums[name], p.grad * len(x), atol=1e-5, rtol=1e-5)


def test_noise_has_std_sigma_times_clip():
    torch.manual_seed(0)
    model = nn.Linear(100, 100)  # 10,100 coordinates of noise
    before = [p.detach().clone() for p in model.parameters()]
    sigma, clip, expected_batch = 1.5, 0.5, 4.0
    zeros = {k: torch.zeros_like(p) for k, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    noisy_step(model, zeros, sigma, clip, expected_batch, opt, torch.Generator().manual_seed(3))
    # lr 1 on a zero gradient: the parameters moved by -noise / expected batch.
    pairs = zip(before, model.parameters(), strict=True)
    moved = torch.cat([(b - p.detach()).flatten() for b, p in pairs])
    noise = moved * expected_batch
    # Standard error of a std estimated from 10,100 draws: 0.7%; of the mean: 0.01 sigma C.
    assert float(noise.std()) == pytest.approx(sigma * clip, rel=0.03)
    assert abs(float(noise.mean())) < 0.05 * sigma * clip


def test_poisson_batches_average_q_n_and_vary():
    gen = torch.Generator().manual_seed(0)
    n, q, draws = 1000, 0.05, 400
    sizes = torch.tensor([len(poisson_batch(n, q, gen)) for _ in range(draws)], dtype=torch.float)
    # mean q n = 50 with standard error sqrt(n q (1 - q) / draws) = 0.34; variance n q (1 - q).
    assert float(sizes.mean()) == pytest.approx(q * n, abs=2.0)
    assert float(sizes.var()) == pytest.approx(n * q * (1 - q), rel=0.25)
    assert len(poisson_batch(n, 1.0, gen)) == n


class CountingSGD(torch.optim.SGD):
    steps = 0

    def step(self, closure=None):
        self.steps += 1
        return super().step(closure)


def test_an_epoch_is_one_over_q_steps_and_empty_batches_step_too():
    model, (x, y) = _mlp(), _data(n=3)
    opt = CountingSGD(model.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    gen = torch.Generator().manual_seed(0)
    loss = dp_train_epoch(
        model,
        classifier_loss,
        x,
        y,
        sample_rate=0.01,
        noise_multiplier=1.0,
        clip=1.0,
        opt=opt,
        gen=gen,
    )
    assert opt.steps == 100  # most of them on an empty batch: the noise alone moves the model
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert math.isnan(loss) or loss > 0  # nan: no sample drawn in any step


def test_full_batch_without_noise_is_plain_gradient_descent():
    model, (x, y) = _mlp(), _data()
    twin = _mlp()
    dp_train_epoch(
        model,
        classifier_loss,
        x,
        y,
        sample_rate=1.0,
        noise_multiplier=0.0,
        clip=1e6,
        opt=torch.optim.SGD(model.parameters(), lr=0.5),
        gen=torch.Generator().manual_seed(0),
    )
    opt = torch.optim.SGD(twin.parameters(), lr=0.5)
    F.cross_entropy(twin(x), y).backward()
    opt.step()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def _toy_cvae_run(seed: int):
    """A zoo CVAE on two fixed 6x6 patterns (one per class), trained by DP-SGD at epsilon 8:
    (loss before, loss after, the trained parameters)."""
    n, classes = 128, 2
    torch.manual_seed(seed)
    model = build_model(make_spec("cvae-small", (1, 6, 6), classes, hidden=32))
    g = torch.Generator().manual_seed(1)
    patterns = (torch.rand(classes, 1, 6, 6, generator=g) > 0.5).float() * 0.9 + 0.05
    y = torch.arange(n) % classes
    x = patterns[y]
    before = evaluate(model, "generator", x.numpy(), y.numpy(), classes)[1]
    plan = plan_dp(DPConfig(8.0), samples=n, batch_size=32, epochs=5)
    opt, gen = torch.optim.Adam(model.parameters(), lr=1e-2), torch.Generator().manual_seed(0)
    model.train()
    for _ in range(5):
        dp_train_epoch(
            model,
            generator_loss,
            x,
            F.one_hot(y, classes).float(),
            sample_rate=plan.sample_rate,
            noise_multiplier=plan.noise_multiplier,
            clip=plan.clip,
            opt=opt,
            gen=gen,
        )
    after = evaluate(model, "generator", x.numpy(), y.numpy(), classes)[1]
    return before, after, [p.detach().clone() for p in model.parameters()]


def test_a_zoo_cvae_learns_under_dp_and_repeats_under_a_seed():
    before, after, params = _toy_cvae_run(seed=0)
    assert after < 0.8 * before, (before, after)  # 25.3 -> 15.4 when written
    _, again, params_again = _toy_cvae_run(seed=0)
    assert again == after
    assert all(torch.equal(a, b) for a, b in zip(params, params_again, strict=True))


def test_each_sample_draws_its_own_latent_noise():
    """Under vmap the CVAE's reparameterisation noise differs per sample (randomness=
    "different"): two copies of one sample get different gradients."""
    torch.manual_seed(0)
    model = build_model(make_spec("cvae-small", (1, 4, 4), 2, hidden=8))
    x, onehot = torch.rand(1, 1, 4, 4).repeat(2, 1, 1, 1), torch.tensor([[1.0, 0.0]] * 2)
    grads, losses = per_sample_grads(model, generator_loss, x, onehot)
    assert not torch.equal(losses[0], losses[1])
    assert not torch.equal(grads["decoder.net.0.weight"][0], grads["decoder.net.0.weight"][1])


def test_dropout_draws_per_sample_too():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.Dropout(0.5), nn.Linear(32, 3))
    x, y = torch.rand(1, 1, 4, 4).repeat(2, 1, 1, 1), torch.tensor([1, 1])
    grads, _ = per_sample_grads(model.train(), classifier_loss, x, y)
    assert not torch.equal(grads["1.weight"][0], grads["1.weight"][1])


# --- which models DP-SGD can train ------------------------------------------------------------


def test_dp_ready_names_the_batchnorm_layer():
    model = build_model(make_spec("scnn", (1, 8, 8), 3, width=2, bn=True))
    reason = dp_ready(model)
    assert reason is not None
    assert "'features.1'" in reason and "BatchNorm2d" in reason
    assert replace_batchnorm(model) is model
    assert dp_ready(model) is None
    # Now each sample's output is its own: the same alone as in a batch.
    x = torch.randn(5, 1, 8, 8)
    model.train()
    torch.testing.assert_close(model(x)[:1], model(x[:1]))


@pytest.mark.parametrize(
    ("bn", "want"),
    [
        (nn.BatchNorm2d(64), (32, 64)),
        (nn.BatchNorm2d(12), (6, 12)),
        (nn.BatchNorm2d(2), (1, 2)),
        (nn.BatchNorm1d(6), (3, 6)),
        (nn.BatchNorm1d(1), None),
    ],
)
def test_group_norm_keeps_two_channels_per_group(bn, want):
    with torch.no_grad():
        bn.weight.fill_(2.0)
    gn = group_norm_for(bn)
    if want is None:
        assert isinstance(gn, nn.Identity)
        return
    assert (gn.num_groups, gn.num_channels) == want
    assert torch.equal(gn.weight, bn.weight)


def _zoo_cases():
    for entry in ZOO:
        shape = (3, 1, 16) if "signal" in entry.inputs and "image" not in entry.inputs else None
        marks = ()
        if entry.name == "vgg9":  # 67M parameters; its builder has no BatchNorm
            marks = pytest.mark.skip(reason="too big for a unit test (67M parameters)")
        yield pytest.param(entry.name, shape or (1, 8, 8), id=entry.name, marks=marks)


@pytest.mark.parametrize(("name", "shape"), list(_zoo_cases()))
def test_every_zoo_model_trains_privately_or_is_made_to(name, shape):
    """Every zoo entry (its defaults, BatchNorm on where it has a switch) is dp_ready after
    replace_batchnorm, and one DP step runs on it."""
    params = {"bn": True} if "bn" in ZOO.get(name).defaults else {}
    torch.manual_seed(0)
    model = build_model(make_spec(name, shape, 3, **params))
    if dp_ready(model) is not None:
        assert "BatchNorm" in dp_ready(model)
        replace_batchnorm(model)
    assert dp_ready(model) is None
    x, y = torch.rand(4, *shape), torch.tensor([0, 1, 2, 0])
    generator = ZOO.get(name).role == "generator"
    before = [p.detach().clone() for p in model.parameters()]
    model.train()
    dp_train_epoch(
        model,
        generator_loss if generator else classifier_loss,
        x,
        F.one_hot(y, 3).float() if generator else y,
        sample_rate=0.5,
        noise_multiplier=1.0,
        clip=1.0,
        opt=torch.optim.SGD(model.parameters(), lr=0.01),
        gen=torch.Generator().manual_seed(0),
        steps=1,
        chunk=2,
    )
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
