"""Budget checks and the planner: which role a device plays and the largest model that fits it.

FedMHO's rule for roles: a device that can train the federation's reference classifier (the
dataset's `reference_classifier`: FedMHO's VGG-9 on image datasets) within its RAM and time budget
trains the largest classifier that fits; any other device trains the largest CVAE that fits and
uploads only the decoder.

Under DP-SGD (`dp=True`) every budget is checked with DP's costs: the training memory of its
step (`Costs.dp_train_bytes`, with per-sample gradients clipped as many at once as the budget
leaves room for, or none held under ghost clipping), its slower epoch, and no BatchNorm (one
sample's gradient must not depend on the others'): the zoo's BatchNorm-free forms are chosen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

from edgefl.data.registry import DatasetInfo
from edgefl.errors import BudgetError, ConfigError
from edgefl.models.cost import Costs, costs, runtime_needs
from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import Role, build_model, candidate_specs, make_spec, role_of, spec_label
from edgefl.privacy.config import dp_expected_batch, optimizer_for
from edgefl.privacy.dpsgd import dp_ready
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
    # Under DP-SGD: samples clipped at once (TrainConfig.dp_chunk; 0: not even one fits) and
    # how ("ghost" or "per-sample"); None without DP.
    dp_chunk: int | None = None
    clipping: str | None = None

    def as_dict(self) -> dict:
        out = {
            "fits": self.fits,
            "reasons": list(self.reasons),
            "train_bytes": self.train_bytes,
            "epoch_seconds": self.epoch_seconds,
            "batch_size": self.batch_size,
            "optimizer": self.optimizer,
            "samples": self.samples,
        }
        if self.clipping is not None:
            out.update(dp_chunk=self.dp_chunk, clipping=self.clipping)
        return out


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
    dp: bool = False,
) -> Fit:
    """Compare a model's costs with every budget of the profile. `samples` = local shard size;
    `dp`: trained with DP-SGD (see the module's docstring)."""
    c = costs(spec)
    batch = batch_size or profile.batch_size
    if dp and batch_size is None:
        batch = dp_expected_batch(samples, batch)
    opt = optimizer_for(optimizer, profile.optimizer, dp)
    budget = profile.ram_budget_bytes
    reasons, short = [], []
    chunk = clipping = None
    if dp:
        chunk = c.dp_chunk(batch, opt, budget)
        clipping = "ghost" if c.ghost else "per-sample"
        # Not even one sample fits: what one at a time would need is the honest shortfall.
        train = c.dp_train_bytes(batch, opt, max(1, chunk))
        train_what = f"training memory with DP-SGD ({clipping} clipping, batch {batch}, {opt})"
        seconds = c.dp_train_macs(samples) / profile.macs_per_second
        batchnorm = dp_untrainable(spec)
        if batchnorm:
            reasons.append(
                f"--dp cannot train it ({batchnorm}): pick a model without BatchNorm, "
                "e.g. scnn:bn=false"
            )
            short.append("dp BatchNorm")
    else:
        train = c.train_bytes(batch, opt, samples)
        train_what = f"training memory (batch {batch}, {opt})"
        seconds = c.train_macs(samples) / profile.macs_per_second
    over, over_short = _budgets_exceeded(c, profile, train, train_what, seconds)
    reasons += over
    short += over_short
    return Fit(
        not reasons,
        tuple(reasons),
        tuple(short),
        train,
        seconds,
        batch,
        opt,
        samples,
        chunk,
        clipping,
    )


def _budgets_exceeded(
    c: Costs, profile: Profile, train: int, train_what: str, seconds: float
) -> tuple[list[str], list[str]]:
    """(reasons, terse tags) for each of the profile's budgets that the need exceeds."""
    budget = profile.ram_budget_bytes
    reasons, short = [], []
    for tag, what, need, have, unit in (
        ("train", train_what, train, budget, "B"),
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
    return reasons, short


@lru_cache(maxsize=512)
def _batchnorm_cached(spec_json: str) -> str | None:
    return dp_ready(build_model(ModelSpec.from_json(spec_json)))


def dp_untrainable(spec: ModelSpec) -> str | None:
    """Why DP-SGD cannot train `spec` (its BatchNorm), or None."""
    return _batchnorm_cached(spec.to_json())


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
    profile: Profile,
    info: DatasetInfo,
    samples: int,
    batch_size: int | None = None,
    dp: bool = False,
    optimizer: str | None = None,
) -> tuple[Role, str]:
    ref = make_spec(info.reference_classifier, info.input_shape, info.num_classes)
    fit = check_fit(
        ref, profile, samples=samples, batch_size=batch_size, dp=dp, optimizer=optimizer
    )
    if fit.fits:
        return "classifier", (
            f"can train the reference classifier {spec_label(ref)!r} within budget"
            + (" under DP-SGD" if dp else "")
        )
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
    dp: bool = False,
    optimizer: str | None = None,
) -> Plan:
    """The largest model (by MACs, then parameters) of the device's role that fits every budget.
    `max_macs` optionally caps the choice (e.g. to keep a CPU simulation fast); `dp`: every
    budget checked for DP-SGD training (see the module's docstring); `optimizer`: the one the
    job names (None: DP-SGD's under `dp`, else the profile's)."""
    samples = samples or default_samples(info)
    search = (info, profile, samples, batch_size, max_macs, dp, optimizer)
    if role == "auto":
        chosen_role, why = decide_role(profile, info, samples, batch_size, dp, optimizer)
    elif role in ("classifier", "generator"):
        chosen_role, why = role, "role given by --role"
    else:
        raise ConfigError(
            f"--role must be auto, classifier or generator, got {role!r}",
            hint="--role auto, classifier or generator",
        )
    candidates, fitting, rejected = _search(chosen_role, *search)
    if not fitting and role == "auto":
        # A device too small for any CVAE may still hold a tiny classifier (and vice versa).
        other: Role = "classifier" if chosen_role == "generator" else "generator"
        alt = _search(other, *search)
        if alt[1]:
            why += f"; but no {chosen_role} fits at all, so it trains a {other}"
            chosen_role, (candidates, fitting, rejected) = other, alt
    if not fitting:
        raise _nothing_fits(chosen_role, candidates, search)
    spec, fit = max(fitting, key=lambda sf: (costs(sf[0]).macs, costs(sf[0]).params))
    return Plan(profile, info, chosen_role, why, spec, costs(spec), fit, len(candidates), rejected)


def _nothing_fits(role, candidates, search) -> BudgetError:
    """The refusal when no candidate fits: the smallest one's shortfall, and the fix."""
    info, profile, samples, batch_size, _, dp, optimizer = search
    budget = {"samples": samples, "batch_size": batch_size, "optimizer": optimizer}
    if dp:  # the least DP training memory, among those DP-SGD can train at all
        trainable = [s for s in candidates if not dp_untrainable(s)] or candidates
        smallest = min(
            trainable, key=lambda s: check_fit(s, profile, dp=True, **budget).train_bytes
        )
    else:
        smallest = min(candidates, key=lambda s: costs(s).macs)
    fit = check_fit(smallest, profile, dp=dp, **budget)
    hint = "lower --batch-size, train on fewer samples, or use a larger device profile"
    if dp:
        hint = (
            "train without --dp on this profile, lower --dp's batch= (DP-SGD holds 8 bytes "
            "a sample of it and clips down to one sample at a time), or use a larger profile"
        )
    return BudgetError(
        f"no {role} in the zoo fits profile {profile.name!r}"
        + (" under --dp (DP-SGD)" if dp else "")
        + f"; even the smallest, {spec_label(smallest)}, needs: {'; '.join(fit.reasons)}",
        hint=hint,
    )


def _search(role, info, profile, samples, batch_size, max_macs, dp=False, optimizer=None):
    candidates = candidate_specs(info.input_shape, info.num_classes, role)
    fitting, rejected = [], []
    for spec in candidates:
        fit = check_fit(
            spec, profile, samples=samples, batch_size=batch_size, dp=dp, optimizer=optimizer
        )
        if not fit.fits:
            rejected.append((spec_label(spec), fit.reasons))
        elif max_macs is not None and costs(spec).macs > max_macs:
            rejected.append((spec_label(spec), (f"MACs above the cap {max_macs:,}",)))
        else:
            fitting.append((spec, fit))
    return candidates, fitting, rejected


def require_fit(spec: ModelSpec, profile: Profile, fit: Fit) -> None:
    if "dp BatchNorm" in fit.short:  # no budget: --force would only meet the same refusal
        why = dp_untrainable(spec)
        raise ConfigError(
            f"--dp cannot train {spec_label(spec)} ({why})",
            hint="pick a model without BatchNorm, e.g. --model scnn:bn=false",
        )
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
