"""What an upload spends of a person's privacy, and the record that says so (issue 57).

Three mechanisms can touch one upload: DP-SGD on the model (`--dp`, edgefl.privacy), the
Gaussian mechanism on the label counts (`--label-counts noised`) and, for FedGH's prototypes
under `--dp`, the Gaussian mechanism on the per-class sums of representations. Their budget:

- `--dp E[,delta=D]` alone: training spends (E, D) (D: 1/n by default, n the training samples).
- `--label-counts noised` with `--dp E`: the counts take LABEL_SHARE of E and training the rest,
  each at half of D: the upload's total stays (E, D).
- `--label-counts noised:EPS`: the counts spend EPS of their own, on top of `--dp E` (each at
  half of D: total (E + EPS, D)) or without `--dp` (at D, the model itself unprotected).
- a prototypes upload under `--dp E`: the prototypes take PROTO_SHARE of E (the labels' share,
  if any, as above) and training the rest; D is split evenly over the parts. Training must be
  private too: the representations come from a model trained on the same samples, so one
  sample moves every representation unless the model is DP-trained (the release then composes
  with DP-SGD's, adaptively).

Prototypes: each training sample's representation is clipped to L2 norm PROTO_CLIP (C), and per
class the sum of those and the count are released with Gaussian noise: one sample added or
removed moves one class's sum by at most C and its count by 1, so the sums and C times the
counts have L2 sensitivity C sqrt(2) together; each gets noise of std sigma C sqrt(2) (the
counts sigma sqrt(2)). The means are noisy sums over noisy counts, for the classes whose noisy
count clears three times its noise's std (post-processing: free); the counts stated are those noisy
counts. Clipped, not scaled to unit norm: the server's header trains on the prototypes and
runs on a device's raw representations, so their scale is kept where it is under C (unit-norm
prototypes of the same run fit a header to 24 % of them and personalised to 8 %).

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
                      "noise_multiplier": s, "epsilon": e, "delta": d},
     "prototypes": {"mechanism": "gaussian", "representation": "clipped", "clip": C,
                    "sensitivity": C sqrt(2), "noise_multiplier": s, "epsilon": e, "delta": d}}

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
# Of `--dp E`, what a prototypes upload spends on the prototypes (the rest trains the model
# they are computed with; the model itself stays on the device).
PROTO_SHARE = 0.5
# The representations' L2 clip: fixed before any data is seen, as DP needs. edgefl's fedgh-cnn
# models' representations have median norms of 6-19 per client on MNIST (with or without DP).
PROTO_CLIP = 10.0
LABEL_FORM = "write --label-counts exact, absent, noised (with --dp) or noised:EPSILON"
LABEL_HELP = (
    "How the upload states its class histogram: exact (default), absent (none: methods read "
    f"each class as equally held), noised (Gaussian mechanism; spends {LABEL_SHARE:.0%} of "
    "--dp's epsilon) or noised:EPS (EPS of its own, added to --dp's). Delta is split evenly "
    "over the parts; the upload's total epsilon is their sum."
)
DP_HELP = (
    "Train by DP-SGD for this (epsilon, delta): EPSILON[,delta=D][,clip=C][,batch=B], e.g. 8 "
    "or 8,delta=1e-5,batch=256 (delta: 1/n by default; batch: the expected Poisson batch, by "
    "default n/6, at least the training batch and at most 512; trained with Adam at lr 1e-2 "
    "unless an optimizer or lr is named). Prototypes (FedGH) spend "
    f"{PROTO_SHARE:.0%} of it on their own noise. The upload records what it spent."
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
        from edgefl.privacy.config import REQUESTED_EPSILON  # --dp's bounds, and for its reasons

        REQUESTED_EPSILON.check(
            "--label-counts noised epsilon",
            eps,
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
    prototypes: tuple[float, float] | None = None  # (epsilon, delta) of DP prototypes


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


SEARCH_UNDER_DP = (
    "an architecture search picks the model by its accuracy on the local data, which --dp "
    "does not cover (DP-SGD protects the training, not the choice of the architecture)"
)


def split_budget(dp: str | None, label_counts: str, samples: int, kind: str = "model") -> Budget:
    """The budget of a job that trains on `samples` samples and uploads `kind` (delta 1/n
    resolved here when the counts or the prototypes take part of it)."""
    cfg, release = check_request(dp, label_counts)
    noised, protos = release.mode == "noised", cfg is not None and kind == "prototypes"
    if not (noised or protos):
        return Budget(cfg, release)
    delta = cfg.delta if cfg is not None and cfg.delta is not None else 1 / samples
    if cfg is None:
        return Budget(None, release, (release.epsilon, delta))
    parts = 1 + noised + protos
    label_eps = (release.epsilon or cfg.epsilon * LABEL_SHARE) if noised else None
    train_eps = cfg.epsilon * (
        1 - (LABEL_SHARE if noised and release.epsilon is None else 0) - PROTO_SHARE * protos
    )
    training = replace(cfg, epsilon=train_eps, delta=delta / parts)  # its clip and batch kept
    return Budget(
        training,
        release,
        (label_eps, delta / parts) if noised else None,
        (cfg.epsilon * PROTO_SHARE, delta / parts) if protos else None,
    )


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


def release_prototypes(
    sums: np.ndarray, counts: np.ndarray, budget: Budget, rng: np.random.Generator
) -> tuple[list[int], np.ndarray, list[int], dict[str, Any]]:
    """(classes, their means, their counts, the release's record) from per-class sums of
    representations clipped to PROTO_CLIP (K x R) and counts (K) by the Gaussian mechanism
    (module docstring). A class whose noisy count is under 3 times its noise's std is left out."""
    import numpy as np

    from edgefl.privacy import noise_for

    eps, delta = budget.prototypes
    sigma = noise_for(eps, delta, 1.0, 1)  # the noise multiplier of a sensitivity-1 release
    std = sigma * math.sqrt(2)  # the counts'; the sums' is C times it
    noisy_sums = sums + rng.normal(0.0, std * PROTO_CLIP, sums.shape)
    noisy_counts = np.asarray(counts, dtype=np.float64) + rng.normal(0.0, std, len(counts))
    # 3 std: a class the client does not hold passes 0.13 % of the time (2 std: 2.3 %)
    held = np.flatnonzero(noisy_counts >= max(1.0, 3 * std))
    if not len(held):
        raise ConfigError(
            f"under --dp the prototypes' noise (std {std:.3g} on each class's count) buries "
            f"every class of this client's {int(np.sum(counts))} samples: nothing to upload",
            hint="raise --dp's epsilon, or train on more samples",
        )
    means = (noisy_sums[held] / noisy_counts[held, None]).astype(np.float32)
    record = {
        "mechanism": "gaussian",
        "representation": "clipped",
        "clip": PROTO_CLIP,
        "sensitivity": PROTO_CLIP * math.sqrt(2),
        "noise_multiplier": sigma,
        "epsilon": eps,
        "delta": delta,
    }
    stated = np.maximum(1, np.rint(noisy_counts[held])).astype(int).tolist()
    return held.tolist(), means, stated, record


def privacy_record(
    plan: dict[str, Any] | None,
    labels: dict[str, Any],
    seeded: bool = False,
    prototypes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The upload's "privacy" metadata from its DP-SGD plan (None: none), its counts' release
    record and its prototypes' (None: not a DP prototypes upload); `seeded`: its noise came
    from a stated seed (a simulation), not secret."""
    from edgefl.privacy.config import ACCOUNTANT

    if plan is None and labels["release"] != "noised":
        return {"mechanism": "none", "label_counts": labels}
    noised = labels if labels["release"] == "noised" else None
    parts = [(p["epsilon"], p["delta"]) for p in (plan, noised, prototypes) if p]
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
    return (
        record
        | ({"dp_sgd": plan} if plan else {})
        | ({"prototypes": prototypes} if prototypes else {})
    )


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
    from edgefl.privacy import DPPlan

    record = meta.get("privacy")
    if not isinstance(record, dict) or record.get("mechanism") == "none":
        return Spent(None, None, "trained without DP (no --dp)")
    try:
        plan = DPPlan.from_dict(record["dp_sgd"])
        labels = record["label_counts"]
        eps, delta, problem = _gaussian_parts(record)
        eps, delta, problem = eps + plan.spent(), delta + plan.delta, plan.problem() or problem
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
    leak = _not_private(meta, record, labels, delta)
    if leak is not None:
        return Spent(None, None, leak)
    if record.get("noise") != "secret":
        why = "its noise came from a stated seed (a simulation)"
        return Spent(eps, delta, why, replayable=True)
    return Spent(eps, delta)


def _not_private(meta: dict[str, Any], record: dict, labels: dict, delta: float) -> str | None:
    """Why a consistent record is still not private as a whole, or None."""
    if labels["release"] == "exact":
        return "its label counts are exact (not private)"
    samples = (meta.get("training") or {}).get("samples")
    if isinstance(samples, int) and samples > 0 and delta > (1 + 1e-9) / samples:  # sums round
        return f"its delta {delta:.3g} is above 1/n = {1 / samples:.3g} ({samples} samples)"
    if meta.get("kind") == "prototypes" and "prototypes" not in record:
        return "its prototypes are exact means (no noise on them)"
    return None


def _gaussian_parts(record: dict[str, Any]) -> tuple[float, float, str | None]:
    """(epsilon, delta, the first inconsistency or None) of the record's one-step Gaussian
    releases (noised label counts, DP prototypes), each epsilon recomputed from its noise."""
    from edgefl.privacy import epsilon

    eps = delta = 0.0
    problem = None
    noised = record["label_counts"]["release"] == "noised"
    parts = [("label counts", record["label_counts"])] if noised else []
    parts += [("prototypes", record["prototypes"])] if "prototypes" in record else []
    for what, part in parts:
        spent = epsilon(part["noise_multiplier"], 1.0, 1, part["delta"])
        if spent > part["epsilon"] * (1 + 1e-6):
            problem = problem or (
                f"the record says its {what} spent epsilon {part['epsilon']:g}, but noise "
                f"multiplier {part['noise_multiplier']:g} spends {spent:.4g}"
            )
        eps, delta = eps + spent, delta + part["delta"]
    return eps, delta, problem


def _below(total: tuple[float, float], eps: float, delta: float) -> bool:
    return total[0] * (1 + 1e-6) < eps or total[1] * (1 + 1e-9) < delta


def whole_shard_warnings(clients: list[dict]) -> list[str]:
    """A warning for every client whose DP-SGD batch was not below its training samples (a
    `--dp ...,batch=B` above a small shard's size): every step took them all, at sampling rate
    1, which the upload recorded without a word."""
    out = []
    for c in clients:
        plan = (c.get("privacy") or {}).get("dp_sgd") or {}
        if plan.get("sample_rate", 0) >= 1:
            samples = c["training"].get("samples")
            of = f"its {samples:,} training samples" if samples else "its training samples"
            out.append(
                f"{c['client_id']}: every DP-SGD step took all of {of} (sampling rate 1, "
                f"{plan['steps']} steps: the --dp batch is not below them); give a batch "
                "below the shard's size for sampled steps, e.g. --dp EPS,batch=N/6"
            )
    return out
