"""What a user asks for (`--dp 8,delta=1e-5,clip=1.0,batch=256`) and what training must then do.

`DPConfig` is the request: a target epsilon, an optional delta, the clip norm and an optional
expected batch. `plan_dp` turns it, with the client's sample count, batch size and epochs, into a
`DPPlan`: the sampling rate, the steps and the noise multiplier the accountant chose. The plan
is also the record an upload carries (`as_dict`), and `DPPlan.problem()` recomputes its epsilon,
so a server can check the record.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from edgefl.bounds import Range, check_fields, declare, declared
from edgefl.errors import ConfigError
from edgefl.privacy.accountant import BOUNDS, epsilon, noise_for

FORM = "write --dp EPSILON[,delta=D][,clip=C][,batch=B], e.g. --dp 8 or --dp 8,delta=1e-5,clip=1.0"
DELTA_HINT = "leave delta= out to use 1/n (n: the samples on this device), e.g. --dp 8"
ACCOUNTANT = (
    "rdp"  # Mironov et al. 2019, converted by Balle et al. 2020 (edgefl.privacy.accountant)
)
MECHANISM = "dp-sgd"  # per-sample clipping, Gaussian noise, Poisson-sampled batches
CLIP = Range(0, low_open=True)
REQUESTED_EPSILON = Range(0.01, 100)

# What DP-SGD trains with where the request names no batch, optimizer or lr (measured one client
# at a time in bench/results/dp_settings_*.md, whole federations in privacy_federation.md).
# Clipping caps each sample's gradient at C whatever the loss's scale, and the noise's norm is
# sigma C sqrt(d) / B: DP-SGD wants fewer, larger, scale-free steps than plain training. At the
# profiles' own settings MNIST's federation lost 16-26 points at epsilon 8 and HAPT's bands cost
# theirs 18-20; with these, 9-14 and a gain of 4-9.
DP_OPTIMIZER = "adam"  # scale-free: SGD's best of 0.01-0.5 was 0.5 on an MNIST phone, 0.01 on HAPT
DP_LR = 1e-2  # a band's CVAE at batch 512: its draws 47.56 % useful at 1e-3, 77.28 % at 1e-2
DP_BATCHES_PER_EPOCH = 6  # HAPT (~360 windows a user): batch 32 / 64 / 128: 67 / 77 / 68 %
DP_BATCH_MAX = 512  # MNIST shards (~6,000 images): 384-768 within 2 points; 1,024 -6 and +2


def optimizer_for(named: str | None, profile_optimizer: str, dp: bool) -> str:
    """The optimizer a job trains with: the one it names, else DP-SGD's under --dp, else its
    profile's (what the planner counts and what training runs)."""
    return named or (DP_OPTIMIZER if dp else profile_optimizer)


def dp_expected_batch(samples: int, batch_size: int) -> int:
    """DP-SGD's expected Poisson batch where `--dp` names none: about DP_BATCHES_PER_EPOCH an
    epoch, at most DP_BATCH_MAX and at least the training batch `batch_size`. It costs no
    memory (a batch is gathered and clipped a chunk at a time) and no time (an epoch still
    takes each sample's gradient once)."""
    return max(batch_size, min(DP_BATCH_MAX, math.ceil(samples / DP_BATCHES_PER_EPOCH)))


@declared(epsilon=8.0)
@dataclass(frozen=True)
class DPConfig:
    """The privacy asked for. delta None: 1/n of the client's data, resolved by `plan_dp`.
    batch: the expected Poisson batch (None: `dp_expected_batch`). Larger batches buy more
    signal per unit of noise at the same epsilon (the noise's norm is sigma C sqrt(d) / batch),
    and cost no memory: a batch is gathered and clipped a chunk at a time."""

    # What a user may ask for (the accountant takes any epsilon > 0): below 0.01 the noise
    # drowns training (a phone's digits shard: noise multiplier 239 at 0.01, 614 at 1e-9, and
    # its model at chance blamed its epochs); above 100 the guarantee says nothing (1e308 was
    # met by noise 0.001 and recorded as DP).
    epsilon: float = declare(
        REQUESTED_EPSILON,
        flag="--dp epsilon",
        hint="e.g. --dp 8 (smaller: more private, noisier); leave --dp out for no privacy",
    )
    delta: float | None = declare(BOUNDS["delta"], None, flag="--dp delta", hint=DELTA_HINT)
    # L2 bound on each sample's gradient over all parameters
    clip: float = declare(CLIP, 1.0, flag="--dp clip", hint="e.g. --dp 8,clip=1.0")
    batch: int | None = declare(
        Range(1, integer=True), None, flag="--dp batch", hint="e.g. --dp 8,batch=256"
    )

    def __post_init__(self) -> None:
        check_fields(self)

    def expected_batch(self, batch_size: int, samples: int) -> int:
        """DP-SGD's expected Poisson batch: `batch=B`, else `dp_expected_batch` of the
        `samples` and the training batch `batch_size`; never more than the samples (a Poisson
        draw at rate 1 holds them all: memory is counted for what a step can hold)."""
        return min(self.batch or dp_expected_batch(samples, batch_size), samples)

    @classmethod
    def parse(cls, text: str) -> DPConfig:
        """`"8"` or `"8,delta=1e-5,clip=0.5,batch=256"` (the CLI's and run config's form)."""
        head, *settings = [part.strip() for part in str(text).split(",")]
        values: dict[str, float] = {"epsilon": _number("epsilon", head, text)}
        for item in settings:
            key, eq, value = (s.strip() for s in item.partition("="))
            if not eq or key not in ("delta", "clip", "batch"):
                raise ConfigError(
                    f"--dp {text!r}: {item!r} is not delta=D, clip=C or batch=B", hint=FORM
                )
            if key in values:
                raise ConfigError(f"--dp {text!r} gives {key} twice", hint=FORM)
            values[key] = _number(key, value, text)
        batch = values.get("batch")
        if batch is not None and batch.is_integer():
            values["batch"] = int(batch)  # 2.5 stays a float, for its Range to refuse
        return cls(**values)

    def text(self) -> str:
        """The form `parse` reads back to this config."""
        out = repr(float(self.epsilon))
        if self.delta is not None:
            out += f",delta={float(self.delta)!r}"
        out += f",clip={float(self.clip)!r}" if self.clip != 1.0 else ""
        return out + (f",batch={self.batch}" if self.batch is not None else "")


def _number(name: str, value: str, text: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ConfigError(
            f"--dp {text!r}: {name} must be a number, got {value!r}", hint=FORM
        ) from None


def steps_per_epoch(sample_rate: float) -> int:
    """An epoch is 1/q steps (expected batches per pass over the data), as without DP."""
    return max(1, math.ceil(1 / sample_rate - 1e-9))  # 1e-9: 1 / (10/100) is not 10 in floats


@dataclass(frozen=True)
class DPPlan:
    """What DP-SGD must do to spend at most `epsilon` at `delta`; the record an upload carries."""

    epsilon: float  # the target: the accountant's epsilon for these settings is at most this
    delta: float
    clip: float
    noise_multiplier: float  # noise std over clip
    sample_rate: float  # Poisson: each sample in each batch with this probability
    steps: int  # all epochs together
    accountant: str = ACCOUNTANT
    mechanism: str = MECHANISM

    def __post_init__(self) -> None:
        for name in ("epsilon", "delta", "noise_multiplier", "sample_rate", "steps"):
            BOUNDS[name].check(name, getattr(self, name))
        CLIP.check("clip", self.clip)
        if (self.accountant, self.mechanism) != (ACCOUNTANT, MECHANISM):
            raise ConfigError(
                f"unknown privacy record: accountant {self.accountant!r}, mechanism "
                f"{self.mechanism!r}",
                hint=f"edgefl reads accountant {ACCOUNTANT!r} with mechanism {MECHANISM!r}",
            )

    def spent(self) -> float:
        """The accountant's epsilon for the recorded noise, rate and steps."""
        return epsilon(self.noise_multiplier, self.sample_rate, self.steps, self.delta)

    def problem(self) -> str | None:
        """None if the recorded noise, rate and steps spend at most the recorded epsilon."""
        spent = self.spent()
        if spent <= self.epsilon * (1 + 1e-6):
            return None
        return (
            f"the record says epsilon {self.epsilon:g}, but noise multiplier "
            f"{self.noise_multiplier:g} over {self.steps} steps at rate {self.sample_rate:g} "
            f"spends {spent:.4g} at delta {self.delta:g}"
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> DPPlan:
        """Read a record back (an upload's); missing or unknown keys are refused by name."""
        names = {f.name for f in fields(cls)}
        unknown, missing = set(record) - names, names - set(record)
        if unknown or missing:
            raise ConfigError(
                f"privacy record has unknown keys {sorted(unknown)} / lacks {sorted(missing)}",
                hint=f"a record holds exactly: {', '.join(sorted(names))}",
            )
        return cls(**record)


def plan_dp(cfg: DPConfig, samples: int, batch_size: int, epochs: int) -> DPPlan:
    """The noise that spends `cfg.epsilon` over `epochs` epochs of DP-SGD's expected batch
    (`DPConfig.expected_batch` of the training batch `batch_size`) on `samples` samples. Raises
    ConfigError (with the fix) when no noise can."""
    for name, value in (("samples", samples), ("batch_size", batch_size), ("epochs", epochs)):
        Range(1, integer=True).check(name, value)
    batch_size = cfg.expected_batch(batch_size, samples)
    delta = cfg.delta if cfg.delta is not None else 1 / samples
    if cfg.delta is not None and delta > (1 + 1e-9) / samples:
        # (epsilon, delta)-DP allows a release that publishes one sample outright with
        # probability delta: above 1/n that is about one person's data in every upload
        raise ConfigError(
            f"--dp delta {delta:g} is above 1/n = {1 / samples:.3g} for a client of {samples} "
            "samples: a release that publishes a sample outright would meet it",
            hint="leave delta out (edgefl takes 1/n) or give one at most 1/n, e.g. delta=1e-5",
        )
    if delta >= 1:
        raise ConfigError(
            f"delta 1/n is {delta:g} for a client of {samples} sample(s): no privacy at all",
            hint="set delta below 1 explicitly (--dp EPSILON,delta=1e-5) or train on more samples",
        )
    rate = min(1.0, batch_size / samples)
    steps = epochs * steps_per_epoch(rate)
    sigma = noise_for(cfg.epsilon, delta, rate, steps)
    return DPPlan(cfg.epsilon, delta, cfg.clip, sigma, rate, steps)
