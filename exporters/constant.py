"""Data artifacts: arrays a device uploads instead of a model (predictions on a public set,
per-class mean representations), stored as ONNX so they pass the very same ingest.

The graph has no inputs; each output is ``Identity(initializer)``. So the size cap, the
no-external-data rule, the operator allowlist, the checker, the finite-value scan, the metadata
schema and the weights hash all apply unchanged, and the values are read without running anything.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from .atomic import write_model_atomic
from .errors import ExportError
from .export import MAX_IR_VERSION, MIN_OPSET, ExportReport, seal_metadata
from .graph import constant_values
from .read import session_options

_DTYPES = {
    np.dtype(np.float32): onnx.TensorProto.FLOAT,
    np.dtype(np.float16): onnx.TensorProto.FLOAT16,
    np.dtype(np.int64): onnx.TensorProto.INT64,
}


def constant_model(outputs: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The bare graph (no metadata): one ``Identity(<name>.data) -> <name>`` per array."""
    if not outputs:
        raise ExportError("a data artifact needs at least one output array")
    inits, nodes, values = [], [], []
    for name, array in outputs.items():
        array = np.ascontiguousarray(array)
        if array.dtype not in _DTYPES:
            raise ExportError(
                f"output '{name}' has dtype {array.dtype}; use float32, float16 or int64"
            )
        inits.append(numpy_helper.from_array(array, name=f"{name}.data"))
        nodes.append(helper.make_node("Identity", [f"{name}.data"], [name], name=f"{name}.copy"))
        values.append(helper.make_tensor_value_info(name, _DTYPES[array.dtype], array.shape))
    graph = helper.make_graph(nodes, "edgefl_data", [], values, initializer=inits)
    # onnx 1.23 stamps IR 14 by default, which onnxruntime 1.31 refuses: pin what export uses.
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", MIN_OPSET)],
        ir_version=MAX_IR_VERSION,
        producer_name="edgefl",
    )


def write_constant_artifact(
    path: str | os.PathLike[str], outputs: dict[str, np.ndarray], metadata: dict[str, Any]
) -> ExportReport:
    """Build, stamp (schema version, weights hash), check and atomically write a data artifact.

    Nothing is written unless the metadata is valid, the arrays agree with it (shapes,
    probabilities for predictions), the ONNX checker passes and onnxruntime returns the arrays.
    """
    start = time.perf_counter()
    bad = [n for n, a in outputs.items() if a.dtype.kind == "f" and not np.isfinite(a).all()]
    if bad:
        raise ExportError(f"output(s) {', '.join(bad)} contain NaN or infinite values")
    model = constant_model(outputs)
    seal_metadata(model, metadata, "arrays")
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # pragma: no cover - the graph above is fixed
        raise ExportError(f"ONNX checker failed: {exc}") from exc
    data = model.SerializeToString()
    # The reader of record is onnxruntime on the server: make sure it returns the same arrays.
    session = ort.InferenceSession(data, session_options(), providers=["CPUExecutionProvider"])
    got = session.run(None, {})
    for (name, want), have in zip(outputs.items(), got, strict=True):
        if not np.array_equal(np.asarray(want), have):
            raise ExportError(f"onnxruntime returns different values for '{name}'")
    target = write_model_atomic(model, path)
    return ExportReport(
        path=str(target),
        size_bytes=target.stat().st_size,
        max_abs_diff=0.0,
        opset=MIN_OPSET,
        ir_version=model.ir_version,
        seconds=time.perf_counter() - start,
    )


def read_constant_outputs(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The arrays of a data artifact (already validated or trusted), without running it."""
    try:
        return {k: v.copy() for k, v in constant_values(model).items()}
    except ValueError as exc:
        raise ExportError(f"not a data artifact: {exc}") from None
