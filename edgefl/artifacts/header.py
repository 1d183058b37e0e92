"""FedGH's global header as an artifact: read back and checked like any file from outside."""

from __future__ import annotations

import math

import numpy as np

import exporters
from edgefl.errors import ArtifactError

_FROM_SERVER = "pass the global header `edgefl server fuse --method fedgh` wrote, as it was sent"


def read_header(path: str, rep: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(weight C x R, bias C) of a global header: input 'representation' [B, R] -> logits."""
    try:
        art = exporters.validate_upload(path)
    except exporters.UploadRejected as exc:
        raise ArtifactError(f"header {path} rejected: {exc.reason}", hint=_FROM_SERVER) from None
    meta = art.metadata
    if art.kind != "global" or meta.get("input_shape") != [rep]:
        raise ArtifactError(
            f"{path} is not a global header for a {rep}-d representation (kind {art.kind}, "
            f"input shape {meta.get('input_shape')})",
            hint=_FROM_SERVER,
        )
    if meta["num_classes"] != classes:
        raise ArtifactError(
            f"header {path} has {meta['num_classes']} classes, the model has {classes}",
            hint="use the header fused from this federation's uploads (the model's dataset)",
        )
    weights = art.state_dict()
    weight, bias = weights.get("weight"), weights.get("bias")
    if (
        weight is None
        or bias is None
        or weight.shape != (classes, rep)
        or bias.shape != (classes,)
        or not math.isfinite(float(np.abs(weight).sum() + np.abs(bias).sum()))
    ):
        raise ArtifactError(
            f"{path} does not hold one Linear({rep}, {classes}) header", hint=_FROM_SERVER
        )
    return weight.astype(np.float32), bias.astype(np.float32)
