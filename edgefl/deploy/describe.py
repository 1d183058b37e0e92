"""What a deployed file says about itself: preprocessing, outputs, costs as shipped, profile.

A device engineer reads these from the file, not from edgefl's source (issue 31 item 4). The
preprocessing is the loaders' own (edgefl/data): a model is only right on inputs scaled as in
training. Never carried over: a client's `label_counts` (private), its partition.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

import edgefl

# Per dataset: how a raw reading becomes the model's input (x = raw * scale + offset), the units
# of the raw reading, and where known the sampling. Sources: edgefl/data/*.py.
_IMAGE_BYTES = {"raw": "8-bit pixel 0..255", "scale": 1 / 255, "offset": 0.0, "range": [0.0, 1.0]}
PREPROCESSING: dict[str, dict[str, Any]] = {
    "mnist": _IMAGE_BYTES | {"layout": "NCHW", "what": "28x28 grey image, white digit on black"},
    "fmnist": _IMAGE_BYTES | {"layout": "NCHW", "what": "28x28 grey image"},
    "emnist": _IMAGE_BYTES | {"layout": "NCHW", "what": "28x28 grey image"},
    "cifar10": _IMAGE_BYTES | {"layout": "NCHW", "what": "32x32 RGB image"},
    "cifar100": _IMAGE_BYTES | {"layout": "NCHW", "what": "32x32 RGB image"},
    "svhn": _IMAGE_BYTES | {"layout": "NCHW", "what": "32x32 RGB image"},
    # sklearn's digits: 4-bit counts 0..16 (edgefl/data/digits.py divides by 16).
    "digits": {
        "raw": "pixel count 0..16",
        "scale": 1 / 16,
        "offset": 0.0,
        "range": [0.0, 1.0],
        "layout": "NCHW",
        "what": "8x8 grey image",
    },
    # UCI HAPT (edgefl/data/hapt.py): acceleration in g, x = (a + 2) / 4 clipped into [0, 1];
    # windows of 128 samples at 50 Hz (2.56 s), channels x/y/z, phone at the waist.
    "hapt": {
        "raw": "acceleration in g (x, y, z)",
        "units": "g",
        "scale": 0.25,
        "offset": 0.5,
        "clip": [0.0, 1.0],
        "sample_rate_hz": 50,
        "window_samples": 128,
        "layout": "NC1W (channels x/y/z, 1, time)",
        "worn": "waist",
    },
    "hapt-gyro": {
        "raw": "acceleration in g (x, y, z) then angular rate in rad/s (x, y, z)",
        "units": ["g", "g", "g", "rad/s", "rad/s", "rad/s"],
        "scale": [0.25, 0.25, 0.25, 0.125, 0.125, 0.125],
        "offset": 0.5,
        "clip": [0.0, 1.0],
        "sample_rate_hz": 50,
        "window_samples": 128,
        "layout": "NC1W (channels, 1, time)",
        "worn": "waist",
    },
}

OUTPUTS = (
    "logits: one unnormalised score per class, in class_names order; softmax for "
    "probabilities, argmax for the class"
)


def preprocessing(dataset: str | None) -> dict[str, Any]:
    if dataset in PREPROCESSING:
        return {"dataset": dataset, **PREPROCESSING[dataset]}
    return {
        "dataset": dataset,
        "known": False,
        "note": "scale inputs exactly as the training data was (edgefl/data loaders)",
    }


def shipped_weights(model: onnx.ModelProto) -> dict[str, Any]:
    """Bytes of the weights as stored in the file, by element type (int8 counted as int8)."""
    by_type: dict[str, int] = {}
    params = 0
    for tensor in model.graph.initializer:
        array = numpy_helper.to_array(tensor)
        by_type[str(array.dtype)] = by_type.get(str(array.dtype), 0) + int(array.nbytes)
        params += int(array.size)
    return {
        "weight_bytes": sum(by_type.values()),
        "weight_bytes_by_dtype": by_type,
        "stored_values": params,
    }


def deployed_metadata(
    source: dict[str, Any],
    *,
    target: str,
    profile: dict[str, Any],
    dataset: str | None,
    quantization: dict[str, Any] | None,
    costs: dict[str, Any],
    layout: str | None = None,
) -> dict[str, Any]:
    """The metadata of a deployed file: the source's description, never its private fields."""
    pre = preprocessing(dataset)
    if layout is not None:
        pre = pre | {"layout": layout}
    return {
        "kind": source.get("kind"),
        "deployed": True,
        "target": target,
        "spec": source.get("spec"),
        "input_shape": source.get("input_shape"),
        "num_classes": source.get("num_classes"),
        "class_names": source.get("class_names"),
        "source": {
            k: source[k]
            for k in ("client_id", "method", "weights_sha256", "profile")
            if k in source
        },
        "preprocessing": pre,
        "outputs": OUTPUTS,
        "costs": costs,
        "quantization": quantization,
        "profile": profile,
        "edgefl_version": edgefl.__version__,
    }


def doc_string(meta: dict[str, Any]) -> str:
    spec = meta.get("spec") or {}
    pre = meta["preprocessing"]
    how = (
        f"input x = raw * {pre['scale']} + {pre['offset']}"
        if "scale" in pre
        else "input scaled as in training"
    )
    return (
        f"edgefl {meta.get('kind')} {spec.get('name', '')} for {meta['profile']['name']} "
        f"({meta['target']}); {how}, layout {pre.get('layout', '?')}; outputs logits over "
        f"{meta.get('num_classes')} classes. Full description: metadata key 'edgefl'."
    )


def version_number(source: dict[str, Any]) -> int:
    """model_version: an int64 from the source weights' hash (same weights, same version)."""
    digest = source.get("weights_sha256") or "0"
    return int(digest[:12], 16) if all(c in "0123456789abcdef" for c in digest[:12]) else 0


def as_float(value: Any) -> Any:
    return float(value) if isinstance(value, np.floating) else value
