"""Budget checks and the planner: which role a device plays and the largest model that fits it.

FedMHO's rule for roles: a device that can train the federation's reference classifier (the
dataset's `reference_classifier`: FedMHO's VGG-9 on image datasets) within its RAM and time budget
trains the largest classifier that fits; any other device trains the largest CVAE that fits and
uploads only the decoder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from edgefl.data.registry import DatasetInfo
from edgefl.errors import BudgetError, ConfigError
from edgefl.models.cost import Costs, costs, runtime_needs
from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import Role, candidate_specs, make_spec, role_of, spec_label
from edgefl.profiles import Profile


@dataclass(frozen=True)
class Fit:
    fits: bool
    reasons: tuple[str, ...]  # one per budget exceeded, with by how much
    short: tuple[str, ...]  # the same, terse ("train x1.3"), for tables
    train_bytes: int
    epoch_seconds: float
    batch_size: int
    optimizer: str
    samples: int

    def as_dict(self) -> dict:
        return {
            "fits": self.fits,
            "reasons": list(self.reasons),
            "train_bytes": self.train_bytes,
            "epoch_seconds": self.epoch_seconds,
            "batch_size": self.batch_size,
            "optimizer": self.optimizer,
            "samples": self.samples,
        }


def ratio_text(need: float, have: float) -> str:
    """`need / have` as "x1.04": two decimals, more where two would print a misfit as x1.00
    (a model that needs 1.004x the budget does not fit, and the text must show it)."""
    r = need / have
    digits = 2
    while digits < 6 and need > have and float(f"{r:.{digits}f}") <= 1:
        digits += 1
    return f"x{r:.{digits}f}"


def _over(what: str, need: float, have: float, unit: str) -> str:
    if unit == "B":
        return (
            f"{what} {need / 2**20:.3f} MiB > budget {have / 2**20:.3f} MiB "
            f"({ratio_text(need, have)})"
        )
    return f"{what} {need:.0f} {unit} > budget {have:.0f} {unit} ({ratio_text(need, have)})"


def storage_bytes(c: Costs) -> int:
    """What the device stores: its model's fp32 weights, and the upload file's ONNX graph and
    metadata around the uploaded weights (a CVAE keeps its encoder too)."""
    return c.weight_bytes + c.upload_bytes - c.upload_weight_bytes


def check_fit(
    spec: ModelSpec,
    profile: Profile,
    *,
    samples: int,
    batch_size: int | None = None,
    optimizer: str | None = None,
) -> Fit:
    """Compare a model's costs with every budget of the profile. `samples` = local shard size."""
    c = costs(spec)
    batch = batch_size or profile.batch_size
    opt = optimizer or profile.optimizer
    train = c.train_bytes(batch, opt)
    seconds = c.train_macs(samples) / profile.macs_per_second
    budget = profile.ram_budget_bytes
    reasons, short = [], []
    for tag, what, need, have, unit in (
        ("train", f"training memory (batch {batch}, {opt})", train, budget, "B"),
        ("infer", "inference peak memory", c.infer_peak_bytes, budget, "B"),
        (
            "storage",
            "fp32 weights + upload file in storage",
            storage_bytes(c),
            profile.storage_bytes,
            "B",
        ),
        ("time", "estimated epoch time", seconds, profile.max_epoch_seconds, "s"),
    ):
        if need > have:
            reasons.append(_over(what, need, have, unit))
            short.append(f"{tag} {ratio_text(need, have)}")
    return Fit(not reasons, tuple(reasons), tuple(short), train, seconds, batch, opt, samples)


@dataclass(frozen=True)
class Plan:
    profile: Profile
    dataset: DatasetInfo
    role: Role
    role_reason: str
    spec: ModelSpec
    costs: Costs
    fit: Fit
    considered: int
    rejected: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "profile": self.profile.name,
            "dataset": self.dataset.name,
            "role": self.role,
            "role_reason": self.role_reason,
            "model": spec_label(self.spec),
            "spec": self.spec.to_dict(),
            "costs": self.costs.as_dict(),
            "fit": self.fit.as_dict(),
            "budget": {
                "ram_budget_bytes": self.profile.ram_budget_bytes,
                "storage_bytes": self.profile.storage_bytes,
                "max_epoch_seconds": self.profile.max_epoch_seconds,
                "macs_per_second": self.profile.macs_per_second,
            },
            "candidates_considered": self.considered,
        }


def default_samples(info: DatasetInfo, num_clients: int = 10) -> int:
    """Shard size assumed when none is given: the train split spread over 10 clients."""
    return max(1, info.train_size // num_clients)


def decide_role(
    profile: Profile, info: DatasetInfo, samples: int, batch_size: int | None = None
) -> tuple[Role, str]:
    ref = make_spec(info.reference_classifier, info.input_shape, info.num_classes)
    fit = check_fit(ref, profile, samples=samples, batch_size=batch_size)
    if fit.fits:
        return "classifier", f"can train the reference classifier {spec_label(ref)!r} within budget"
    return "generator", (
        f"cannot train the reference classifier {spec_label(ref)!r} ({'; '.join(fit.reasons)}): "
        "trains a CVAE and uploads only its decoder"
    )


def plan(
    profile: Profile,
    info: DatasetInfo,
    *,
    role: Literal["auto", "classifier", "generator"] = "auto",
    samples: int | None = None,
    batch_size: int | None = None,
    max_macs: int | None = None,
) -> Plan:
    """The largest model (by MACs, then parameters) of the device's role that fits every budget.
    `max_macs` optionally caps the choice (e.g. to keep a CPU simulation fast)."""
    samples = samples or default_samples(info)
    if role == "auto":
        chosen_role, why = decide_role(profile, info, samples, batch_size)
    elif role in ("classifier", "generator"):
        chosen_role, why = role, "role given by --role"
    else:
        raise ConfigError(f"--role must be auto, classifier or generator, got {role!r}")
    candidates, fitting, rejected = _search(
        chosen_role, info, profile, samples, batch_size, max_macs
    )
    if not fitting and role == "auto":
        # A device too small for any CVAE may still hold a tiny classifier (and vice versa).
        other: Role = "classifier" if chosen_role == "generator" else "generator"
        alt = _search(other, info, profile, samples, batch_size, max_macs)
        if alt[1]:
            why += f"; but no {chosen_role} fits at all, so it trains a {other}"
            chosen_role, (candidates, fitting, rejected) = other, alt
    if not fitting:
        smallest = min(candidates, key=lambda s: costs(s).macs)
        fit = check_fit(smallest, profile, samples=samples, batch_size=batch_size)
        raise BudgetError(
            f"no {chosen_role} in the zoo fits profile {profile.name!r}; even the smallest, "
            f"{spec_label(smallest)}, needs: {'; '.join(fit.reasons)}",
            hint="lower --batch-size, train on fewer samples, or use a larger device profile",
        )
    spec, fit = max(fitting, key=lambda sf: (costs(sf[0]).macs, costs(sf[0]).params))
    return Plan(profile, info, chosen_role, why, spec, costs(spec), fit, len(candidates), rejected)


def _search(role, info, profile, samples, batch_size, max_macs):
    candidates = candidate_specs(info.input_shape, info.num_classes, role)
    fitting, rejected = [], []
    for spec in candidates:
        fit = check_fit(spec, profile, samples=samples, batch_size=batch_size)
        if not fit.fits:
            rejected.append((spec_label(spec), fit.reasons))
        elif max_macs is not None and costs(spec).macs > max_macs:
            rejected.append((spec_label(spec), (f"MACs above the cap {max_macs:,}",)))
        else:
            fitting.append((spec, fit))
    return candidates, fitting, rejected


def require_fit(spec: ModelSpec, profile: Profile, fit: Fit) -> None:
    if not fit.fits:
        raise BudgetError(
            f"{spec_label(spec)} ({role_of(spec)}) does not fit profile {profile.name!r}: "
            + "; ".join(fit.reasons),
            hint="pick a smaller --model (see `edgefl models --profile ...`) or pass --force",
        )


def inference_misfit(spec: ModelSpec, profile: Profile) -> tuple[str, ...]:
    """Why a classifier cannot run on the device (empty: it fits): the planner's budgets for
    inference alone, fp32 weights plus the peak step's activations within the RAM budget and the
    weights within storage (no training memory, no epoch time)."""
    c = costs(spec)
    reasons = []
    if c.infer_peak_bytes > profile.ram_budget_bytes:
        reasons.append(
            _over("inference peak memory", c.infer_peak_bytes, profile.ram_budget_bytes, "B")
        )
    if storage_bytes(c) > profile.storage_bytes:
        reasons.append(
            _over(
                "fp32 weights + upload file in storage",
                storage_bytes(c),
                profile.storage_bytes,
                "B",
            )
        )
    return tuple(reasons)


def runtimes_that_fit(c: Costs, profile: Profile) -> list[str]:
    """The device runtimes (see `runtime_needs`) the model runs in within the profile's RAM
    budget and storage."""
    return [
        name
        for name, (memory, storage) in runtime_needs(c).items()
        if memory <= profile.ram_budget_bytes and storage <= profile.storage_bytes
    ]


def plan_inference(
    profile: Profile, input_shape, num_classes: int, *, max_macs: int | None = None
) -> ModelSpec:
    """The largest zoo classifier (by MACs, then parameters) that runs within the device's
    inference budget: what a device class gets back from the server. `max_macs` caps the choice
    (a CPU server that must train it)."""
    candidates = candidate_specs(tuple(input_shape), num_classes, "classifier")
    fitting = [s for s in candidates if not inference_misfit(s, profile)]
    capped = [s for s in fitting if max_macs is None or costs(s).macs <= max_macs]
    if not capped:
        if fitting:  # the cap alone rules every fitting model out
            smallest = min(fitting, key=lambda s: costs(s).macs)
            raise BudgetError(
                f"no zoo classifier that fits profile {profile.name!r} is within the MACs cap "
                f"{max_macs:,}; the smallest that fits, {spec_label(smallest)}, has "
                f"{costs(smallest).macs:,}",
                hint=f"raise the cap to at least {costs(smallest).macs}",
            )
        smallest = min(candidates, key=lambda s: costs(s).infer_peak_bytes)
        raise BudgetError(
            f"no zoo classifier runs within profile {profile.name!r}; even the smallest, "
            f"{spec_label(smallest)}, needs: {'; '.join(inference_misfit(smallest, profile))}",
            hint="leave this profile out of --for, or give it a larger budget",
        )
    return max(capped, key=lambda s: (costs(s).macs, costs(s).params))
