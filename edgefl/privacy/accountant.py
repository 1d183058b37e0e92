"""How much privacy DP-SGD spends: a Rényi DP accountant for the Poisson-subsampled Gaussian.

One DP-SGD step releases sum_i clip(g_i) + N(0, (sigma * C)^2) over a batch in which each sample is
included with probability q. Mironov, Talwar & Zhang 2019 ("Rényi Differential Privacy of the
Sampled Gaussian Mechanism") give its RDP of order alpha as log(A_alpha) / (alpha - 1), with

    A_alpha = E_{z ~ N(0, sigma^2)} [((1 - q) + q * exp((2z - 1) / (2 sigma^2)))^alpha]

(sensitivity 1: C scales out; this direction of the divergence is the larger, so it bounds
add/remove-one neighbours). Integer orders expand it binomially; fractional orders split the
integral where the two summands cross, at z0, and expand each side in the smaller one. RDP
composes by adding over steps; (epsilon, delta) follows by Balle et al. 2020 Prop. 12
(= Canonne, Kamath & Steinke 2020), minimised over a grid of orders. Everything is summed in log
space: the terms span hundreds of orders of magnitude.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from scipy.special import gammaln, log_ndtr, logsumexp

from edgefl.bounds import Range
from edgefl.errors import ConfigError

# Orders tried: fractional ones carry the large-epsilon regimes (many steps, little noise), large
# integers the small-epsilon ones. The same grid as dp-accounting's RdpAccountant, so the two agree.
ORDERS: tuple[float, ...] = (
    tuple(round(1 + i / 10, 1) for i in range(1, 100))
    + tuple(float(a) for a in range(11, 64))
    + (128.0, 256.0, 512.0, 1024.0)
)

# The accountant's inputs and their ranges (tests generate values past each bound from here).
BOUNDS = {
    "noise_multiplier": Range(0, low_open=True),
    "sample_rate": Range(0, 1, low_open=True),
    "steps": Range(1, integer=True),
    "delta": Range(0, 1, low_open=True, high_open=True),
    "epsilon": Range(0, low_open=True),
}
# Beyond this the noise swamps any gradient; a target needing more is unreachable in practice.
MAX_NOISE = 1e4
_TAIL = math.log(1e-11)  # a series stops once its terms fall below this, relative to the sum


def _check(**values) -> None:
    for name, value in values.items():
        BOUNDS[name].check(name, value)


@lru_cache(maxsize=65536)
def rdp_step(noise_multiplier: float, sample_rate: float, order: float) -> float:
    """RDP of order `order` (> 1) of one step of the sampled Gaussian mechanism."""
    q, sigma = sample_rate, noise_multiplier
    if q == 1.0:  # no subsampling: the Gaussian mechanism's own alpha / (2 sigma^2)
        return order / (2 * sigma**2)
    if float(order).is_integer():
        log_a = _log_a_integer(q, sigma, int(order))
    else:
        log_a = _log_a_fractional(q, sigma, order)
    return max(0.0, log_a / (order - 1))  # A_alpha >= 1; a hair below is rounding


def _log_a_integer(q: float, sigma: float, alpha: int) -> float:
    """log A_alpha = log sum_k C(alpha, k) (1-q)^(alpha-k) q^k exp((k^2 - k) / (2 sigma^2)):
    E[exp(k (2z-1) / (2 sigma^2))] under N(0, sigma^2) is exp((k^2 - k) / (2 sigma^2))."""
    k = np.arange(alpha + 1, dtype=float)
    log_binom = gammaln(alpha + 1) - gammaln(k + 1) - gammaln(alpha - k + 1)
    terms = (
        log_binom + k * math.log(q) + (alpha - k) * math.log1p(-q) + (k * k - k) / (2 * sigma**2)
    )
    return float(logsumexp(terms))


def _log_a_fractional(q: float, sigma: float, alpha: float) -> float:
    """log A_alpha for a fractional order: two infinite binomial series (generalised binomial
    coefficients), one per side of z0. Past i = alpha + 1 both alternate in sign and shrink
    monotonically (|C(alpha, i)| falls, and so does exp(t^2 / 2) P(N(0,1) > t), Mills's ratio,
    which the rest of each term is), so the error is below the first term left out."""
    z0 = sigma**2 * (math.log1p(-q) - math.log(q)) + 0.5
    n = math.ceil(alpha) + 64
    while True:
        log_a, last = _fractional_sums(q, sigma, alpha, z0, n)
        if last - log_a < _TAIL or n >= 1 << 20:
            return log_a
        n *= 2


def _fractional_sums(q, sigma, alpha, z0, n) -> tuple[float, float]:
    """(log of both series summed over i < n, log |largest of the two terms at i = n - 1|)."""
    i = np.arange(n, dtype=float)
    # |C(alpha, i)| from the Gamma function; alpha - i + 1 is never a pole (alpha not integer).
    log_binom = gammaln(alpha + 1) - gammaln(i + 1) - gammaln(alpha - i + 1)
    # C(alpha, i) = prod_{j < i} (alpha - j) / i!: one negative factor per j in (alpha, i).
    sign = np.where(np.maximum(0, i - 1 - math.floor(alpha)) % 2 == 0, 1.0, -1.0)
    j = alpha - i
    lq, l1q, two_var = math.log(q), math.log1p(-q), 2 * sigma**2
    # z < z0: (1-q)^(alpha-i) (q e^...)^i, weighted by P(N(i, sigma^2) < z0).
    below = log_binom + i * lq + j * l1q + (i * i - i) / two_var + log_ndtr((z0 - i) / sigma)
    # z > z0: (q e^...)^(alpha-i) (1-q)^i, weighted by P(N(alpha-i, sigma^2) > z0).
    above = log_binom + j * lq + i * l1q + (j * j - j) / two_var + log_ndtr((j - z0) / sigma)
    terms = np.concatenate([below, above])
    log_a, s = logsumexp(terms, b=np.concatenate([sign, sign]), return_sign=True)
    if s <= 0:  # cannot happen for a true A_alpha >= 1: a numerical failure, not a bound
        return math.inf, -math.inf
    return float(log_a), float(max(below[-1], above[-1]))


def rdp(
    noise_multiplier: float, sample_rate: float, steps: int, orders: Sequence[float] = ORDERS
) -> np.ndarray:
    """RDP of `steps` composed steps at each of `orders` (composition adds)."""
    return np.array([steps * rdp_step(noise_multiplier, sample_rate, a) for a in orders])


def epsilon_from_rdp(
    rdp_values: np.ndarray, delta: float, orders: Sequence[float] = ORDERS
) -> tuple[float, float]:
    """(epsilon, the order that gives it): Balle et al. 2020 Prop. 12,
    eps = rdp + log((a-1)/a) - (log delta + log a) / (a - 1), the smallest over the orders."""
    a = np.asarray(orders, dtype=float)
    with np.errstate(invalid="ignore", over="ignore"):
        eps = rdp_values + np.log1p(-1 / a) - (math.log(delta) + np.log(a)) / (a - 1)
    eps = np.where(np.isfinite(eps), eps, np.inf)
    best = int(np.argmin(eps))
    return max(0.0, float(eps[best])), float(a[best])


def epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    *,
    orders: Sequence[float] = ORDERS,
) -> float:
    """The epsilon at `delta` spent by `steps` DP-SGD steps of noise multiplier sigma (noise std
    over clip norm) on Poisson batches of rate `sample_rate` (add/remove-one neighbours)."""
    _check(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps, delta=delta)
    sigma, q = float(noise_multiplier), float(sample_rate)
    return epsilon_from_rdp(rdp(sigma, q, steps, orders), delta, orders)[0]


def noise_for(target_epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """The smallest noise multiplier (to 1e-5 relative) whose `steps` steps spend at most
    `target_epsilon` at `delta`: epsilon falls as the noise grows, so bisect (on log sigma)."""
    _check(epsilon=target_epsilon, delta=delta, sample_rate=sample_rate, steps=steps)

    def spent(sigma: float) -> float:
        return epsilon(sigma, sample_rate, steps, delta)

    hi = 1.0
    while spent(hi) > target_epsilon:
        if hi >= MAX_NOISE:
            raise ConfigError(
                f"epsilon {target_epsilon} at delta {delta} is out of reach: even noise "
                f"multiplier {MAX_NOISE:g} spends {spent(hi):.4g} over {steps} steps at "
                f"sampling rate {sample_rate:g}",
                hint="raise epsilon, or train fewer steps (fewer epochs, a smaller batch)",
            )
        hi = min(hi * 2, MAX_NOISE)
    lo = hi / 2
    while lo > 1e-3 and spent(lo) <= target_epsilon:
        lo, hi = lo / 2, lo
    while hi / lo - 1 > 1e-5:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if spent(mid) <= target_epsilon else (mid, hi)
    return hi
