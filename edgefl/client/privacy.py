"""What an upload spends of a person's privacy, and the record that says so (issue 57).

Two mechanisms can touch one upload: DP-SGD on the model (`--dp`, edgefl.privacy) and the
Gaussian mechanism on the label counts (`--label-counts noised`). Their budget:

- `--dp E[,delta=D]` alone: training spends (E, D) (D: 1/n by default, n the training samples).
- `--label-counts noised` with `--dp E`: the counts take LABEL_SHARE of E and training the rest,
  each at half of D: the upload's total stays (E, D).
- `--label-counts noised:EPS`: the counts spend EPS of their own, on top of `--dp E` (each at
  half of D: total (E + EPS, D)) or without `--dp` (at D, the model itself unprotected).

The totals compose by adding epsilons and deltas (basic composition: loose, simple, honest).
Label counts change by one count for one sample added or removed: L2 sensitivity 1, so the
Gaussian mechanism with noise multiplier sigma is the sampled Gaussian at rate 1, one step, and
the same RDP accountant sets and checks it. The noised counts are rounded and clipped at 0
(post-processing: free).

The sample count n (and with it the sampling rate and the default delta 1/n) is treated as
public, as DP-SGD's analyses do; the validation metrics of the training record are not covered.

The record (metadata key "privacy"), written by `privacy_record` and checked by `spent`:

    {"mechanism": "dp-sgd" | "none",
     "accountant": "rdp",                     # with any DP part
     "composition": "basic",                  # with any DP part
     "epsilon": E_total | null, "delta": D_total | null,   # null: some part is not private
     "dp_sgd": DPPlan.as_dict(),              # with mechanism dp-sgd
     "label_counts": {"release": "exact" | "absent"}
                   | {"release": "noised", "mechanism": "gaussian", "sensitivity": 1,
                      "noise_multiplier": s, "epsilon": e, "delta": d}}

A server never trusts the epsilons written there: `spent` recomputes each part from its noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from edgefl.errors import ConfigError

if TYPE_CHECKING:  # edgefl.privacy loads scipy: imported where used, not by the CLI's help
    import numpy as np

    from edgefl.privacy import DPConfig

RELEASES = ("exact", "noised", "absent")
# Of `--dp E`, what `--label-counts noised` spends on the counts (the rest trains the model).
LABEL_SHARE = 0.1
LABEL_FORM = "write --label-counts exact, absent, noised (with --dp) or noised:EPSILON"
LABEL_HELP = (
    "How the upload states its class histogram: exact (default), absent (none: methods read "
    f"each class as equally held), noised (Gaussian mechanism; spends {LABEL_SHARE:.0%} of "
    "--dp's epsilon, the rest trains) or noised:EPS (EPS of its own, added to --dp's). With "
    "both, each takes half of delta; the upload's total epsilon is their sum."
)
DP_HELP = (
    "Train by DP-SGD for this (epsilon, delta): EPSILON[,delta=D][,clip=C][,batch=B], e.g. 8 "
    "or 8,delta=1e-5,batch=256 (delta: 1/n by default; batch: the expected Poisson batch, the "
    "training batch by default). The upload records what it spent."
)


@dataclass(frozen=True)
class LabelRelease:
    """How the label counts leave the device. `epsilon`: noised:EPS's own (None: a share)."""

    mode: str = "exact"
    epsilon: float | None = None

    @classmethod
    def parse(cls, text: str) -> LabelRelease:
        mode, colon, value = (s.strip() for s in str(text).partition(":"))
        if mode not in RELEASES or (colon and mode != "noised"):
            raise ConfigError(f"--label-counts {text!r} is not one of its forms", hint=LABEL_FORM)
        if not colon:
            return cls(mode)
        try:
            eps = float(value)
        except ValueError:
            raise ConfigError(
                f"--label-counts {text!r}: epsilon must be a number, got {value!r}",
                hint="e.g. --label-counts noised:1",
            ) from None
        if not (math.isfinite(eps) and eps > 0):
            raise ConfigError(
                f"--label-counts {text!r}: epsilon must be > 0, got {value}",
                hint="e.g. --label-counts noised:1 (smaller: noisier counts)",
            )
        return cls(mode, eps)


@dataclass(frozen=True)
class Budget:
    """A job's privacy, split: DP-SGD's request (None: plain training) and the label counts'
    (epsilon, delta) when noised."""

    training: DPConfig | None
    release: LabelRelease
    labels: tuple[float, float] | None = None  # (epsilon, delta) of the noised counts


def check_request(dp: str | None, label_counts: str) -> tuple[DPConfig | None, LabelRelease]:
    """The job's --dp and --label-counts, parsed (ConfigError with the fix): before any data."""
    from edgefl.privacy import DPConfig

    cfg = DPConfig.parse(dp) if dp is not None else None
    release = LabelRelease.parse(label_counts)
    if release.mode == "noised" and release.epsilon is None and cfg is None:
        raise ConfigError(
            "--label-counts noised spends a share of --dp's epsilon, and no --dp is given",
            hint="add --dp EPSILON, or give the counts their own: --label-counts noised:1",
        )
    return cfg, release


def split_budget(dp: str | None, label_counts: str, samples: int) -> Budget:
    """The budget of a job that trains on `samples` samples (delta 1/n resolved here when the
    counts take part of it)."""
    cfg, release = check_request(dp, label_counts)
    if release.mode != "noised":
        return Budget(cfg, release)
    delta = cfg.delta if cfg is not None and cfg.delta is not None else 1 / samples
    if cfg is None:
        return Budget(None, release, (release.epsilon, delta))
    if release.epsilon is None:
        train_eps, label_eps = cfg.epsilon * (1 - LABEL_SHARE), cfg.epsilon * LABEL_SHARE
    else:
        train_eps, label_eps = cfg.epsilon, release.epsilon
    training = replace(cfg, epsilon=train_eps, delta=delta / 2)  # its clip and batch kept
    return Budget(training, release, (label_eps, delta / 2))


def release_counts(
    counts: list[int], budget: Budget, rng: np.random.Generator
) -> tuple[list[int] | None, dict[str, Any]]:
    """(the counts the upload states, or None; the record of their release)."""
    import numpy as np

    from edgefl.privacy import noise_for

    mode = budget.release.mode
    if mode == "exact":
        return counts, {"release": "exact"}
    if mode == "absent":
        return None, {"release": "absent"}
    eps, delta = budget.labels
    sigma = noise_for(eps, delta, 1.0, 1)  # sensitivity 1: sigma is the noise's std
    noised = np.asarray(counts, dtype=np.float64) + rng.normal(0.0, sigma, len(counts))
    out = np.clip(np.rint(noised), 0, None).astype(int).tolist()
    record = {
        "release": "noised",
        "mechanism": "gaussian",
        "sensitivity": 1,
        "noise_multiplier": sigma,
        "epsilon": eps,
        "delta": delta,
    }
    # Noised to nothing (a tiny shard, much noise): stated as no counts; the spend stands.
    return (out if sum(out) > 0 else None), record


def privacy_record(
    plan: dict[str, Any] | None, labels: dict[str, Any], seeded: bool = False
) -> dict[str, Any]:
    """The upload's "privacy" metadata from its DP-SGD plan (None: none) and its counts'
    release record; `seeded`: its noise came from a stated seed (a simulation), not secret."""
    from edgefl.privacy.config import ACCOUNTANT

    if plan is None and labels["release"] != "noised":
        return {"mechanism": "none", "label_counts": labels}
    parts = ([(plan["epsilon"], plan["delta"])] if plan else []) + (
        [(labels["epsilon"], labels["delta"])] if labels["release"] == "noised" else []
    )
    covered = plan is not None and labels["release"] != "exact"
    record = {
        "mechanism": "dp-sgd" if plan else "none",
        "accountant": ACCOUNTANT,
        "composition": "basic",
        "epsilon": sum(e for e, _ in parts) if covered else None,
        "delta": sum(d for _, d in parts) if covered else None,
        "label_counts": labels,
        # who knows the seed can replay the noise: then nothing is private against them
        "noise": "seeded" if seeded else "secret",
    }
    return record | ({"dp_sgd": plan} if plan else {})


@dataclass(frozen=True)
class Spent:
    """What an upload's record proves it spent, recomputed. `epsilon` None: not private as a
    whole (`why`); `problem`: the record contradicts itself (or is unreadable)."""

    epsilon: float | None
    delta: float | None
    why: str = ""
    problem: str | None = None
    # the noise came from a seed a simulation states: epsilon is what the run spent, but whoever
    # knows the seed can replay the noise, so it guarantees nothing against them
    replayable: bool = False


def spent(meta: dict[str, Any]) -> Spent:
    """The upload's privacy by its own record, every epsilon recomputed by the accountant from
    the noise, rate and steps the record states (the epsilons written there are not trusted,
    only checked: a part that spends more than it claims makes the record inconsistent)."""
    from edgefl.privacy import DPPlan, epsilon

    record = meta.get("privacy")
    if not isinstance(record, dict) or record.get("mechanism") == "none":
        return Spent(None, None, "trained without DP (no --dp)")
    try:
        plan = DPPlan.from_dict(record["dp_sgd"])
        labels = record["label_counts"]
        eps, delta = plan.spent(), plan.delta
        problem = plan.problem()
        if labels["release"] == "noised":
            label_eps = epsilon(labels["noise_multiplier"], 1.0, 1, labels["delta"])
            if label_eps > labels["epsilon"] * (1 + 1e-6):
                problem = problem or (
                    f"the record says its label counts spent epsilon {labels['epsilon']:g}, but "
                    f"noise multiplier {labels['noise_multiplier']:g} spends {label_eps:.4g}"
                )
            eps, delta = eps + label_eps, delta + labels["delta"]
        total = (record.get("epsilon"), record.get("delta"))
        if problem is None and total[0] is not None and _below(total, eps, delta):
            problem = (
                f"the record's total (epsilon {total[0]:g}, delta {total[1]:g}) is below its "
                f"parts' (epsilon {eps:.4g}, delta {delta:g})"
            )
    except (ConfigError, KeyError, TypeError, ValueError) as exc:
        text = exc.message if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
        return Spent(None, None, problem=f"its privacy record is unreadable ({text})")
    if problem is not None:
        return Spent(None, None, problem=f"its privacy record is inconsistent: {problem}")
    if labels["release"] == "exact":
        return Spent(None, None, "its label counts are exact (not private)")
    if record.get("noise") != "secret":
        why = "its noise came from a stated seed (a simulation)"
        return Spent(eps, delta, why, replayable=True)
    return Spent(eps, delta)


def _below(total: tuple[float, float], eps: float, delta: float) -> bool:
    return total[0] * (1 + 1e-6) < eps or total[1] * (1 + 1e-9) < delta
