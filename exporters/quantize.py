"""Dynamic int8 quantization of an exported artifact, keeping it self-describing."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic

from ._quiet import one_line, quiet
from .atomic import write_model_atomic
from .errors import ExportError
from .graph import real_inputs, value_dims, weights_hash
from .read import Artifact, artifact_from_bytes, get_metadata, set_metadata
from .schema import QUANTIZED_TAG, validate_metadata


def quantize_int8(src_path: str | os.PathLike[str], dst_path: str | os.PathLike[str]) -> dict:
    """Quantize weights of MatMul/Gemm/Conv to int8 (activations quantized at run time).

    Metadata is carried over with ``quantized`` set and ``weights_sha256`` recomputed. Returns
    ``{"size_before", "size_after", "ratio", "max_abs_diff"}``; the last is measured against the
    float model on one random batch, as a sanity figure (int8 is not bit-exact by design).
    """
    src_data = Path(src_path).read_bytes()
    model = onnx.load_model_from_string(src_data)
    meta = get_metadata(model)
    # The dynamo exporter stores value_info for weights, which quantize_dynamic's shape inference
    # then contradicts ("Inferred shape and existing shape differ"); it is only a cache.
    del model.graph.value_info[:]
    with tempfile.TemporaryDirectory(prefix="edgefl-quant-") as tmp:
        out = Path(tmp, "int8.onnx")
        try:
            with quiet():
                quantize_dynamic(model, out, weight_type=QuantType.QInt8)
        except Exception as exc:
            raise ExportError(f"int8 quantization failed: {one_line(exc)}") from exc
        quantized = onnx.load_model_from_string(out.read_bytes())
    if meta is not None:
        meta = dict(meta, quantized=QUANTIZED_TAG, weights_sha256=weights_hash(quantized))
        problems = validate_metadata(meta)
        if problems:
            raise ExportError("invalid metadata after quantization: " + "; ".join(problems))
        set_metadata(quantized, meta)
    target = write_model_atomic(quantized, dst_path)
    size_after = target.stat().st_size

    before = artifact_from_bytes(src_path, src_data, onnx.load_model_from_string(src_data), {})
    after = artifact_from_bytes(target, target.read_bytes(), quantized, meta or {})
    return {
        "size_before": len(src_data),
        "size_after": size_after,
        "ratio": size_after / len(src_data),
        "max_abs_diff": _compare(before, after),
    }


def _compare(a: Artifact, b: Artifact) -> float:
    rng = np.random.default_rng(0)
    arrays: list[Any] = []
    for value in real_inputs(a.model.graph):
        dims = [d if isinstance(d, int) else 4 for d in value_dims(value) or []]
        arrays.append(rng.standard_normal(dims).astype(np.float32))
    return float(np.abs(a.run(*arrays) - b.run(*arrays)).max())
