"""The DP-SGD accountant (issue 57, item 1): its epsilon agrees with dp-accounting's RDP
accountant to 1%, its fractional-order series agrees with the integral it expands, `noise_for`
inverts `epsilon`, and every bad input is refused with the fix, as is every bad `--dp` text."""

from __future__ import annotations

import itertools
import math

import pytest

from edgefl.bounds import LOWER, RAISE
from edgefl.errors import ConfigError
from edgefl.privacy import DPConfig, DPPlan, epsilon, noise_for, plan_dp
from edgefl.privacy.accountant import (
    BOUNDS,
    ORDERS,
    _log_a_fractional,
    _log_a_integer,
    rdp_step,
)

DELTA = 1e-5
SETTINGS = list(itertools.product((0.01, 0.1, 1.0), (0.8, 1.1, 4.0), (1, 100, 1000)))
# Integer orders: both accountants sum the same finite binomial series.
INTEGER = [a for a in ORDERS if a.is_integer()]
# dp-accounting 0.6.0's fractional-order series is inexact at q=0.1, sigma 0.8: it drops orders
# 1.1-1.6 (no convergence in 1,000 terms) and overstates the next (log A_1.7 = 0.02170, where
# the integral and ours give 0.01973; test_fractional_orders_sum_to_the_integral). There the best
# order is among those, so its epsilon is 45.70 where ours is 42.99 (6% lower). Everywhere else
# the two agree to 0.4% or better.
DROPS_BEST_ORDER = {(0.1, 0.8, 1000)}


def _reference(sigma: float, q: float, steps: int, orders=None, delta: float = DELTA) -> float:
    dp = pytest.importorskip(
        "dp_accounting", reason="dp-accounting is not installed (pip install -e .[test])"
    )
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant(orders) if orders is not None else RdpAccountant()
    accountant.compose(dp.PoissonSampledDpEvent(q, dp.GaussianDpEvent(sigma)), steps)
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize(("q", "sigma", "steps"), SETTINGS)
def test_epsilon_agrees_with_dp_accounting(q, sigma, steps):
    ours = epsilon(sigma, q, steps, DELTA)
    theirs = _reference(sigma, q, steps)
    if (q, sigma, steps) in DROPS_BEST_ORDER:
        assert ours < theirs  # tighter, never looser
    else:
        assert ours == pytest.approx(theirs, rel=0.01)
    # On the orders where both compute exactly the same sums, the same numbers.
    ours_exact = epsilon(sigma, q, steps, DELTA, orders=INTEGER)
    assert ours_exact == pytest.approx(_reference(sigma, q, steps, INTEGER), rel=1e-6)


# What DP-SGD's defaults ran at epsilon 8 (bench/results/privacy_*_dpdefaults.json): HAPT's
# phones and bands, MNIST's bands and phones, as (q, sigma, steps, delta 1/n).
USED = [
    (0.182, 1.71, 300, 1 / 330),
    (0.167, 1.29, 180, 1 / 360),
    (0.0843, 1.168, 360, 1 / 6071),
    (0.0722, 0.84, 140, 1 / 7090),
]


@pytest.mark.parametrize(("q", "sigma", "steps", "delta"), USED)
def test_the_settings_used_agree_with_dp_accounting(q, sigma, steps, delta):
    """On the integer orders, where both sum the same series, the same epsilon; over all orders
    edgefl is up to 1.7 % tighter at q ~0.17, where dp-accounting's fractional series
    overstates log A (at alpha 1.7: 0.0104 against the integral's 0.0078, which edgefl's
    matches: test_fractional_orders_sum_to_the_integral)."""
    integer = epsilon(sigma, q, steps, delta, orders=INTEGER)
    assert integer == pytest.approx(_reference(sigma, q, steps, INTEGER, delta), rel=1e-6)
    ours, theirs = epsilon(sigma, q, steps, delta), _reference(sigma, q, steps, delta=delta)
    assert theirs * 0.98 <= ours <= theirs * 1.0001


@pytest.mark.parametrize(
    ("q", "sigma", "alpha"),
    [
        (0.1, 0.8, 1.1),
        (0.1, 0.8, 1.7),
        (0.1, 1.1, 1.5),
        (0.01, 0.8, 2.5),
        (0.5, 1.1, 3.7),
        (0.182, 1.71, 1.7),
    ],
)
def test_fractional_orders_sum_to_the_integral(q, sigma, alpha):
    """A_alpha = E_{z ~ N(0, sigma^2)}[((1-q) + q exp((2z-1) / (2 sigma^2)))^alpha], integrated
    numerically (mpmath comes with torch's sympy), is what the two series sum to."""
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 30

    def integrand(z):
        return (
            mp.npdf(z, 0, sigma) * ((1 - q) + q * mp.e ** ((2 * z - 1) / (2 * sigma**2))) ** alpha
        )

    exact = float(mp.log(mp.quad(integrand, [-mp.inf, -10 * sigma, 0, 10 * sigma, mp.inf])))
    assert _log_a_fractional(q, sigma, alpha) == pytest.approx(exact, rel=1e-7)


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 0.8), (0.1, 4.0), (0.5, 1.1)])
def test_fractional_series_meets_the_binomial_sum_at_integers(q, sigma):
    for alpha in (2, 3, 5):
        near = _log_a_fractional(q, sigma, alpha + 1e-9)
        assert near == pytest.approx(_log_a_integer(q, sigma, alpha), rel=1e-6)


def test_without_sampling_it_is_the_gaussian_mechanism():
    # q = 1: RDP alpha / (2 sigma^2) per step, whatever the order.
    assert rdp_step(2.0, 1.0, 7.0) == pytest.approx(7 / 8)
    assert epsilon(2.0, 1.0, 10, DELTA) > epsilon(2.0, 1.0, 5, DELTA) > epsilon(4.0, 1.0, 5, DELTA)


@pytest.mark.parametrize(
    ("target", "q", "steps"), [(8.0, 0.01, 1000), (1.0, 0.1, 100), (4.0, 1.0, 10)]
)
def test_noise_for_inverts_epsilon(target, q, steps):
    sigma = noise_for(target, DELTA, q, steps)
    assert target * 0.999 <= epsilon(sigma, q, steps, DELTA) <= target
    assert epsilon(sigma * 0.9999, q, steps, DELTA) > target  # the smallest such noise


def test_an_unreachable_target_says_what_to_change():
    with pytest.raises(ConfigError) as err:
        noise_for(1e-4, DELTA, 0.1, 100)
    assert "out of reach" in err.value.message
    assert "raise epsilon" in err.value.hint


def _call(name: str, value):
    args = {"epsilon": 1.0, "delta": DELTA, "sample_rate": 0.1, "steps": 10}
    if name == "noise_multiplier":
        return lambda: epsilon(value, 0.1, 10, DELTA)
    return lambda: noise_for(*(value if k == name else v for k, v in args.items()))


@pytest.mark.parametrize(
    ("name", "value", "move"),
    [(name, v, move) for name, bounds in BOUNDS.items() for v, move in bounds.outside()],
)
def test_out_of_range_inputs_say_which_way_to_move(name, value, move):
    with pytest.raises(ConfigError) as err:
        _call(name, value)()
    assert err.value.message.startswith(f"{name} must be"), err.value.message
    assert err.value.message.endswith(move)
    assert (LOWER if move == RAISE else RAISE) not in str(err.value)


def test_steps_must_be_whole():
    with pytest.raises(ConfigError, match="steps must be an integer"):
        epsilon(1.0, 0.1, 2.5, DELTA)


# --- what a user writes: --dp EPSILON[,delta=D][,clip=C] -------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8", DPConfig(8.0)),
        ("8,delta=1e-5,clip=0.5", DPConfig(8.0, 1e-5, 0.5)),
        (" 1.5 , clip = 2 ", DPConfig(1.5, None, 2.0)),
    ],
)
def test_dp_text_parses_and_round_trips(text, expected):
    cfg = DPConfig.parse(text)
    assert cfg == expected
    assert DPConfig.parse(cfg.text()) == cfg


@pytest.mark.parametrize(
    ("text", "start", "fix"),
    [
        ("0", "--dp epsilon must be in [0.01, 100], got 0.0: raise it", "--dp 8"),
        ("-1", "--dp epsilon must be in [0.01, 100]", "--dp 8"),
        ("nan", "--dp epsilon must be a finite number in [0.01, 100]", "--dp 8"),
        # the noise drowns training (its model at chance blamed its epochs); no guarantee at all
        ("1e-9", "--dp epsilon must be in [0.01, 100], got 1e-09: raise it", "--dp 8"),
        ("1e308", "--dp epsilon must be in [0.01, 100], got 1e+308: lower it", "leave --dp out"),
        ("8,delta=1", "--dp delta must be in (0, 1), got 1.0: lower it", "leave delta= out"),
        ("8,delta=0", "--dp delta must be in (0, 1), got 0.0: raise it", "leave delta= out"),
        ("8,clip=0", "--dp clip must be > 0", "clip=1.0"),
        ("eight", "--dp 'eight': epsilon must be a number, got 'eight'", "--dp EPSILON"),
        ("", "--dp '': epsilon must be a number", "--dp EPSILON"),
        (
            "8,sigma=1",
            "--dp '8,sigma=1': 'sigma=1' is not delta=D, clip=C or batch=B",
            "--dp EPSILON",
        ),
        ("8,1e-5", "--dp '8,1e-5': '1e-5' is not delta=D, clip=C or batch=B", "--dp EPSILON"),
        ("8,clip=1,clip=2", "--dp '8,clip=1,clip=2' gives clip twice", "--dp EPSILON"),
        ("8,delta=small", "--dp '8,delta=small': delta must be a number", "--dp EPSILON"),
    ],
)
def test_bad_dp_text_says_the_fix(text, start, fix):
    with pytest.raises(ConfigError) as err:
        DPConfig.parse(text)
    assert err.value.message.startswith(start), err.value.message
    assert fix in err.value.hint


# --- the plan and the record it leaves --------------------------------------------------------


def test_plan_spends_the_target_with_delta_one_over_n():
    plan = plan_dp(DPConfig(8.0, batch=50), samples=1000, batch_size=50, epochs=3)
    assert plan.delta == pytest.approx(1e-3)
    assert plan.sample_rate == pytest.approx(0.05)
    assert plan.steps == 3 * 20
    assert 8.0 * 0.999 <= plan.spent() <= 8.0
    assert plan.problem() is None
    assert DPPlan.from_dict(plan.as_dict()) == plan


def test_a_record_whose_noise_does_not_give_its_epsilon_is_named():
    plan = plan_dp(DPConfig(4.0, delta=1e-5), samples=500, batch_size=500, epochs=2)
    assert plan.sample_rate == 1.0 and plan.steps == 2
    forged = DPPlan(**{**plan.as_dict(), "noise_multiplier": plan.noise_multiplier / 2})
    problem = forged.problem()
    assert problem is not None and "spends" in problem
    assert math.isfinite(forged.spent()) and forged.spent() > 4.0


@pytest.mark.parametrize(
    ("record", "start"),
    [
        ({"epsilon": 1.0}, "privacy record has unknown keys [] / lacks"),
        ({"steps": 0}, "steps must be an integer >= 1, got 0"),
        ({"delta": 1.0}, "delta must be in (0, 1)"),
        ({"accountant": "prv"}, "unknown privacy record: accountant 'prv'"),
        ({"extra": 1}, "privacy record has unknown keys ['extra']"),
    ],
)
def test_a_bad_record_is_refused_by_name(record, start):
    good = plan_dp(DPConfig(8.0), samples=100, batch_size=10, epochs=1).as_dict()
    data = record if set(record) == {"epsilon"} else {**good, **record}
    with pytest.raises(ConfigError) as err:
        DPPlan.from_dict(data)
    assert err.value.message.startswith(start), err.value.message


def test_a_one_sample_client_needs_an_explicit_delta():
    with pytest.raises(ConfigError) as err:
        plan_dp(DPConfig(8.0), samples=1, batch_size=1, epochs=1)
    assert "delta 1/n is 1" in err.value.message
    assert "delta=1e-5" in err.value.hint
    assert plan_dp(DPConfig(8.0, delta=1e-5), samples=1, batch_size=1, epochs=1).steps == 1


def test_without_a_batch_dp_sgd_takes_about_six_large_batches_an_epoch():
    """DP-SGD's own expected batch where --dp names none: n/6, at most 512, at least the
    training batch; the steps follow it (an epoch is 1/q steps)."""
    from edgefl.privacy.config import DP_BATCH_MAX, dp_expected_batch

    assert dp_expected_batch(360, 16) == 60  # a HAPT user's windows on a band
    assert dp_expected_batch(360, 64) == 64  # never below the training batch
    assert dp_expected_batch(5_719, 16) == DP_BATCH_MAX == 512  # an MNIST client
    plan = plan_dp(DPConfig(8.0), 360, 16, 30)
    assert plan.sample_rate == pytest.approx(60 / 360)
    assert plan.steps == 30 * 6
    assert DPConfig(8.0).expected_batch(16, 360) == 60
    assert DPConfig(8.0, batch=100).expected_batch(16, 360) == 100


def test_the_dp_batch_sets_the_sampling_rate_and_round_trips():
    """`--dp 8,batch=256` samples each of 1,024 samples with probability 1/4 (the training
    batch does without it); its text reads back; a batch that is no whole number >= 1 is
    refused with the form."""
    cfg = DPConfig.parse("8,batch=256")
    assert cfg.batch == 256 and DPConfig.parse(cfg.text()) == cfg
    assert plan_dp(cfg, 1024, 16, 2).sample_rate == 0.25
    assert plan_dp(DPConfig(8.0, batch=16), 1024, 64, 2).sample_rate == 16 / 1024
    for bad in ("8,batch=0", "8,batch=2.5", "8,batch=x"):
        with pytest.raises(ConfigError):
            DPConfig.parse(bad)
    # the label counts' share of the budget leaves training its clip and its batch
    from edgefl.client.privacy import split_budget

    training = split_budget("8,clip=0.5,batch=64", "noised", 1000).training
    assert (training.batch, training.clip, training.epsilon < 8) == (64, 0.5, True)
