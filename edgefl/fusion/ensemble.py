"""Ensemble: the classifiers' logit average, exported as one ONNX model (the upper reference
most one-shot papers compare against; costs K forward passes at inference)."""

from __future__ import annotations

from dataclasses import dataclass

import exporters
from edgefl.errors import FusionError
from edgefl.fusion.averaging import COMBINES, EnsembleModule
from edgefl.fusion.base import FusionContext, FusionResult, Method
from edgefl.fusion.config import FusionConfig
from edgefl.fusion.options import option


@dataclass(frozen=True)
class EnsembleConfig(FusionConfig):
    # FedDF's baseline averages logits, and every recorded ensemble number did. DP-SGD's
    # classifiers differ in logit scale (mean top logit 19-50 across one federation's five
    # phones at epsilon 8, 9-13 without DP), so their logit mean is the largest-scaled phone's
    # vote: MNIST Dir(0.5) seed 2 at epsilon 8, 52.11 % by logits, 91.94 % by probabilities
    # (bench/results/ensemble_combine.md).
    combine: str = option(
        "logits",
        "logits: the members' mean logit (FedDF's baseline); probabilities: the mean of their "
        "softmax outputs (each member's vote bounded, whatever its logits' scale)",
        choices=COMBINES,
    )


def fuse(ctx: FusionContext, cfg: EnsembleConfig) -> FusionResult:
    classifiers = ctx.require("classifier")
    onnx_only = [u.name for u in classifiers if not u.rebuilt]
    if onnx_only:
        raise FusionError(
            f"ensemble exports one ONNX graph from rebuilt modules; {', '.join(onnx_only)} "
            "have no edgefl spec (or are int8) and cannot be rebuilt",
            hint="remove them, or use fedmho-md, which only needs their forward passes",
        )
    # The members' weights all go into one file: what an ensemble can hold is bounded by the
    # bytes one ONNX file holds (8 VGG-9s pass it), not by a count (2,000 CNNs are 68 MB).
    # Every member at once (parked ones mapped from disk, their pages read by the export).
    modules = [u.module for u in classifiers]
    weights = sum(p.numel() * p.element_size() for m in modules for p in m.parameters())
    if weights > exporters.MAX_INLINE_BYTES:
        raise FusionError(
            f"ensemble exports its {len(classifiers):,} members as one ONNX graph, and their "
            f"weights take {weights / 2**30:.1f} GiB, more than one ONNX file holds (2 GiB)",
            hint="distil them into one model instead (fedmho-md, feddf or dense), or fuse "
            "fewer classifiers",
        )
    model = EnsembleModule(modules, cfg.combine)
    return FusionResult(model, None, {"members": [u.client_id for u in classifiers]})


METHOD = Method(
    name="ensemble",
    description="the classifiers' logit (or probability) average, exported as one model",
    paper="ensemble baseline (FedDF, Lin et al. NeurIPS 2020; FedMHO)",
    consumes=("classifier",),
    # Its global model is the members' rebuilt modules, exported as one graph: an upload that
    # runs through onnxruntime only (int8, another tool's) is set aside by name, not fatal.
    needs_modules=True,
    config_cls=EnsembleConfig,
    fuse=fuse,
    trains=False,
)
