"""Every tensor's size before a graph runs (issue 18): shape inference on the graph as given,
with its batch fixed to 1, its own shape declarations dropped (an upload's value_info is a claim,
not a fact) and the shape arithmetic that exporters emit (Shape -> Squeeze/Gather/Concat ->
Reshape) evaluated here, since onnx's inference leaves a Reshape fed by it unknown. With the
allowed ops no tensor's size can depend on the input's values (no Cast from data to int64), so
a size still unknown after this is one the server refuses to find out by running the graph."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import SMALL_TENSOR

MAX_ROUNDS = 16  # each round fixes the Reshapes whose inputs the previous one made known
MAX_VALUE = SMALL_TENSOR  # a shape-like value: the size of those a weightless copy keeps


def infer(light: onnx.ModelProto) -> onnx.ModelProto:
    """`light` (a weightless copy) at one sample, with every size inference can fix once the
    shape arithmetic is evaluated: each value it computes is pinned, as a constant, into the
    inputs that read it (a Reshape's target, a ReduceMean's axes). Changes `light`."""
    for value in light.graph.input:  # a symbolic batch dim: 1, for per-sample sizes
        dims = value.type.tensor_type.shape.dim
        if dims and not dims[0].HasField("dim_value"):
            dims[0].dim_value = 1
    del light.graph.value_info[:]
    for o in light.graph.output:  # what an upload declares it returns is checked elsewhere
        o.type.tensor_type.ClearField("shape")
    for _ in range(MAX_ROUNDS):
        inferred = onnx.shape_inference.infer_shapes(light, check_type=True, strict_mode=True)
        if not _pin_values(light, inferred):
            return inferred
    return inferred


def computed(inferred: onnx.ModelProto) -> dict[str, list[int] | None]:
    """Each tensor the graph computes from its input (not a weight or a constant: those are
    stored in the file, bounded by its size) -> its dims, None where still unknown."""
    g = inferred.graph
    stored = {t.name for t in g.initializer}
    stored |= {o for n in g.node if n.op_type == "Constant" for o in n.output}
    dims = {v.name: _dims(v) for v in (*g.value_info, *g.output)}
    return {o: dims.get(o) for n in g.node for o in n.output if o and o not in stored}


def _dims(v: onnx.ValueInfoProto) -> list[int] | None:
    t = v.type.tensor_type
    if not t.HasField("shape") or any(not d.HasField("dim_value") for d in t.shape.dim):
        return None
    return [d.dim_value for d in t.shape.dim]


def _pin_values(light: onnx.ModelProto, inferred: onnx.ModelProto) -> int:
    """Evaluate the shape arithmetic with the sizes inference knows; point every node input
    that reads a value so found to a constant holding it. -> how many inputs were pinned."""
    g = inferred.graph
    dims = {v.name: _dims(v) for v in (*g.input, *g.value_info, *g.output)}
    constant = {t.name for t in light.graph.initializer}
    values = {t.name: numpy_helper.to_array(t) for t in light.graph.initializer
              if t.data_type == onnx.TensorProto.INT64 and math.prod(t.dims) <= MAX_VALUE
              and (t.raw_data or t.int64_data)}  # fmt: skip
    pinned = 0
    for node in light.graph.node:
        for i, name in enumerate(node.input):
            if name and name in values and name not in constant:
                fixed = f"{name}\0pinned"  # no exporter's name holds a NUL
                if fixed not in constant:
                    light.graph.initializer.append(numpy_helper.from_array(values[name], fixed))
                    constant.add(fixed)
                node.input[i] = fixed
                pinned += 1
        got = _evaluate(node, values, dims)
        if got is not None and got.size <= MAX_VALUE and node.output[0] not in values:
            values[node.output[0]] = got.astype(np.int64)
    return pinned


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _evaluate(node: onnx.NodeProto, values: dict, dims: dict) -> np.ndarray | None:
    """The int64 value a shape-arithmetic node computes, where its inputs are known."""
    op, ins = node.op_type, list(node.input)
    try:
        if op == "Constant":
            t = _attr(node, "value", None)
            if isinstance(t, onnx.TensorProto) and t.data_type == onnx.TensorProto.INT64:
                return numpy_helper.to_array(t) if math.prod(t.dims) <= MAX_VALUE else None
            v = _attr(node, "value_ints", None)
            if v is None and _attr(node, "value_int", None) is not None:
                return np.array(_attr(node, "value_int", 0), dtype=np.int64)
            return np.array(v, dtype=np.int64) if v is not None else None
        if op == "Shape":
            d = dims.get(ins[0])
            if d is None:
                return None
            return np.array(d[slice(_attr(node, "start", 0), _attr(node, "end", None))],
                            dtype=np.int64)  # fmt: skip
        if not ins or ins[0] not in values:
            return None
        x = values[ins[0]]
        if op == "Identity":
            return x
        if op == "Squeeze":  # axes: an input (opset 13+) or an attribute; none: every 1
            given = len(ins) > 1 and bool(ins[1])
            if given and ins[1] not in values:
                return None  # not "every 1": a wrong value pinned would size the graph wrongly
            axes = values[ins[1]] if given else _attr(node, "axes", None)
            return np.squeeze(x) if axes is None else np.squeeze(x, axis=tuple(map(int, axes)))
        if op == "Unsqueeze":
            axes = values.get(ins[1]) if len(ins) > 1 else None
            if axes is None:
                return None
            rank = x.ndim + len(axes)
            for a in sorted(int(a) % rank for a in axes):
                x = np.expand_dims(x, a)
            return x
        if op == "Concat":
            if any(i not in values for i in ins):
                return None
            return np.concatenate([values[i].reshape(-1) if values[i].ndim == 0 else values[i]
                                   for i in ins], axis=_attr(node, "axis", 0))  # fmt: skip
        if op == "Gather" and ins[1] in values:
            return np.take(x, values[ins[1]], axis=_attr(node, "axis", 0))
        if op == "Add" and ins[1] in values:
            return (x + values[ins[1]]).astype(np.int64)
        if op == "Reshape" and ins[1] in values:
            shape = _reshaped(list(x.shape), values[ins[1]].tolist(), _attr(node, "allowzero", 0))
            return x.reshape(shape) if shape is not None else None
    except (ValueError, IndexError, TypeError, np.exceptions.AxisError):
        return None  # not evaluable: its size stays unknown, and is refused as such
    return None


def _reshaped(data: list[int], target: list[int], allowzero: int) -> list[int] | None:
    """Reshape's output dims (ONNX semantics: 0 copies the input's dim unless allowzero, one
    -1 takes what is left), or None when the target is not a valid one for this input."""
    out = [data[i] if s == 0 and not allowzero and i < len(data) else s
           for i, s in enumerate(target)]  # fmt: skip
    if any(s < -1 for s in out) or out.count(-1) > 1:
        return None
    total, rest = math.prod(data), math.prod(s for s in out if s != -1)
    if -1 in out:
        if rest == 0 or total % rest:
            return None
        out[out.index(-1)] = total // rest
    return out if math.prod(out) == total else None
