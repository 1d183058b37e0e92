"""Averaging uploads: the parameters of one architecture's classifiers (one-shot FedAvg and
the methods that start from it), and the logits or probabilities of any classifiers
(`combine_outputs`, `EnsembleModule`)."""

from __future__ import annotations

import math

import torch
from torch import nn

from edgefl.artifacts import Upload
from edgefl.errors import FusionError
from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import build_model, spec_label


def one_architecture(
    classifiers: list[Upload], method: str
) -> tuple[list[Upload], list[tuple[Upload, str]]]:
    """(the classifiers a parameter average can take, (upload, why not) for the others).

    Parameters average only within one architecture, so the largest group of classifiers of
    one architecture is averaged (ties: the group holding the most training samples, then the
    one whose first upload comes first); every other classifier is set aside with its reason,
    as is one that cannot be rebuilt (int8, another tool's). Only when none is left to average
    is the method refused, every classifier named with its reason."""
    left: list[tuple[Upload, str]] = []
    groups: dict[str, list[Upload]] = {}
    for u in classifiers:
        if not u.rebuilt or u.spec is None:
            why = u.forward_only or "its metadata names no edgefl architecture"
            left.append(
                (u, f"{method} averages parameters, which needs a rebuilt edgefl classifier: {why}")
            )
        else:
            groups.setdefault(u.spec.to_json(), []).append(u)
    if not groups:
        raise FusionError(
            f"{method} averages parameters, which needs rebuildable edgefl classifiers; none "
            f"of the {len(classifiers)} is one:"
            + "".join(f"\n  {u.name}: {why}" for u, why in left),
            hint="add classifiers trained by `edgefl client train` (not --int8), or choose a "
            "method that only needs forward passes (fedmho-md, feddf)",
        )
    # max keeps the first of equals: groups are in the order of their first upload.
    kept = max(groups.values(), key=lambda g: (len(g), sum(int(u.label_counts.sum()) for u in g)))
    label = spec_label(kept[0].spec)
    for group in groups.values():
        if group is kept:
            continue
        other = spec_label(group[0].spec)
        arch = f"architecture {other}" if other != label else f"another {label} configuration"
        why = (
            f"{arch} differs from the {len(kept)} {label} classifier(s) {method} averages "
            f"(the largest group of one architecture; parameters of different "
            f"architectures cannot be averaged)"
        )
        left += [(u, why) for u in group]
    order = {id(u): i for i, u in enumerate(classifiers)}
    return kept, sorted(left, key=lambda item: order[id(item[0])])


def average_scope(kept: list[Upload], classifiers: list[Upload]) -> str | None:
    """What an average stands for when it is not every classifier: "5 of 10: vgg9 only"."""
    if len(kept) == len(classifiers):
        return None
    return f"{len(kept)} of {len(classifiers)}: {spec_label(kept[0].spec)} only"


def average_classifiers(classifiers: list[Upload], method: str) -> tuple[ModelSpec, nn.Module]:
    """One-shot FedAvg: the plain parameter average of same-architecture classifiers (pick
    them with `one_architecture`; given others, it refuses)."""
    kept, left = one_architecture(classifiers, method)
    if left:
        raise FusionError(
            f"{method} averages one architecture; set these aside first:"
            + "".join(f"\n  {u.name}: {why}" for u, why in left),
            hint="use a distillation method (ensemble, fedmho-md) for mixed architectures",
        )
    spec = kept[0].spec
    # A running sum, one upload's weights at a time: parked uploads are never all in memory.
    # In float64, so the order of the additions does not show in the float32 average.
    total: dict[str, torch.Tensor] = {}
    for u in kept:
        _add_weights(total, u.module)
    model = build_model(spec)
    dtypes = {k: v.dtype for k, v in model.state_dict().items()}
    model.load_state_dict({k: (v / len(kept)).to(dtypes[k]) for k, v in total.items()})
    return spec, model


def _add_weights(total: dict[str, torch.Tensor], module: nn.Module) -> None:
    # Its own frame: no loop variable keeps a tensor (and the file it maps) past the call.
    for k, v in module.state_dict().items():
        total[k] = total[k] + v.double() if k in total else v.double()


COMBINES = ("logits", "probabilities")


def combine_outputs(
    outs: torch.Tensor, how: str = "logits", weights: torch.Tensor | None = None, dim: int = 0
) -> torch.Tensor:
    """Classifiers' logits stacked along `dim` -> one ensemble's logits. `logits`: their mean;
    `probabilities`: the log of the mean of their softmax outputs, whose softmax is that mean
    (a member's vote is bounded by 1 whatever its logits' scale). `weights`, broadcastable to
    `outs` (a 1 in the class dimension), weigh the probabilities' mean, divided by their sum (a
    weighted mean of logits is its caller's: Co-Boosting's einsum, whose rounding its records
    have)."""
    if weights is None:
        if how == "logits":
            return outs.mean(dim)
        return torch.logsumexp(outs.log_softmax(-1), dim) - math.log(outs.shape[dim])
    if how == "logits":
        raise ValueError("combine_outputs weighs probabilities only")
    total = weights.sum(dim).clamp_min(1e-12)
    tiny = torch.finfo(weights.dtype).tiny  # a zero weight: that member's vote is gone
    return torch.logsumexp(outs.log_softmax(-1) + weights.clamp_min(tiny).log(), dim) - total.log()


class EnsembleModule(nn.Module):
    """The members as one exportable module, combined by `combine_outputs`."""

    def __init__(self, members: list[nn.Module], combine: str = "logits"):
        super().__init__()
        self.members = nn.ModuleList(members)
        self.combine = combine

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return combine_outputs(torch.stack([m(x) for m in self.members]), self.combine)
