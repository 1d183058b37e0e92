"""Ensemble: the classifiers' logit average, exported as one ONNX model (the upper reference
most one-shot papers compare against; costs K forward passes at inference)."""

from __future__ import annotations

from dataclasses import dataclass

from edgefl.errors import FusionError
from edgefl.fusion.base import EnsembleModule, FusionConfig, FusionContext, FusionResult, Method


@dataclass(frozen=True)
class EnsembleConfig(FusionConfig):
    pass


def fuse(ctx: FusionContext, cfg: EnsembleConfig) -> FusionResult:
    classifiers = ctx.require("classifier")
    onnx_only = [u.name for u in classifiers if u.module is None]
    if onnx_only:
        raise FusionError(
            f"ensemble exports one ONNX graph from rebuilt modules; {', '.join(onnx_only)} "
            "have no edgefl spec (or are int8) and cannot be rebuilt",
            hint="remove them, or use fedmho-md, which only needs their forward passes",
        )
    model = EnsembleModule([u.module for u in classifiers])
    return FusionResult(model, None, {"members": [u.client_id for u in classifiers]})


METHOD = Method(
    name="ensemble",
    description="logit average of the classifiers, exported as one model",
    paper="ensemble baseline (FedDF, Lin et al. NeurIPS 2020; FedMHO)",
    consumes=("classifier",),
    # Its global model is the members' rebuilt modules, exported as one graph: an upload that
    # runs through onnxruntime only (int8, another tool's) is set aside by name, not fatal.
    needs_modules=True,
    config_cls=EnsembleConfig,
    fuse=fuse,
)
