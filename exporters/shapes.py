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
    values = {
        t.name: numpy_helper.to_array(t)
        for t in light.graph.initializer
        if t.data_type in _DTYPES and math.prod(t.dims) <= MAX_VALUE and _has_data(t)
    }
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
        if got is not None and node.output[0] not in values:
            values[node.output[0]] = got
    return pinned


# The element types shape arithmetic is evaluated in (what exporters emit for sizes, index
# grids and scales); anything else stays unknown.
_DTYPES = {
    onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.FLOAT: np.float32,
    onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.BOOL: np.bool_,
}
# Integers beyond this are not sizes: leaving them unknown keeps every product inside int64,
# where numpy and a runtime agree (no wrap-around to exploit).
_INT_LIMIT = 1 << 31


def _has_data(t: onnx.TensorProto) -> bool:
    fields = (t.raw_data, t.int64_data, t.int32_data, t.float_data, t.double_data)
    return any(len(f) for f in fields) or math.prod(t.dims) == 0


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _evaluate(node: onnx.NodeProto, values: dict, dims: dict) -> np.ndarray | None:
    """The small value a shape-arithmetic node computes where its inputs are known (sizes,
    index grids of adaptive pooling, resize scales), else None: its size then stays unknown
    and is refused as such. Every value is bounded (MAX_VALUE elements, integers under
    _INT_LIMIT, floats finite) before and after it is computed."""
    op, ins = node.op_type, list(node.input)
    try:
        if op == "Constant":
            got = _constant(node)
        elif op == "Shape":
            got = _shape(node, ins, dims)
        elif not ins or any(i and i not in values for i in ins[:1]):
            return None
        else:
            rule = _RULES.get(op)
            got = rule(node, [values.get(i) if i else None for i in ins]) if rule else None
    except (
        ValueError,
        IndexError,
        TypeError,
        OverflowError,
        ArithmeticError,
        np.exceptions.AxisError,
    ):
        return None  # not evaluable: its size stays unknown, and is refused as such
    return got if got is not None and _bounded(got) else None


def _bounded(x: np.ndarray) -> bool:
    if x.dtype.type not in _DTYPES.values() or x.size > MAX_VALUE:
        return False
    if x.dtype.kind in "iu":
        return bool(np.all(np.abs(x.astype(np.int64)) < _INT_LIMIT))
    return bool(np.all(np.isfinite(x)))


def _constant(node: onnx.NodeProto) -> np.ndarray | None:
    t = _attr(node, "value", None)
    if isinstance(t, onnx.TensorProto):
        return numpy_helper.to_array(t) if math.prod(t.dims) <= MAX_VALUE else None
    for name, dtype in (
        ("value_ints", np.int64),
        ("value_floats", np.float32),
        ("value_int", np.int64),
        ("value_float", np.float32),
    ):
        v = _attr(node, name, None)
        if v is not None:
            return np.array(v, dtype=dtype)
    return None


def _shape(node: onnx.NodeProto, ins: list[str], dims: dict) -> np.ndarray | None:
    d = dims.get(ins[0]) if ins else None
    if d is None:
        return None
    return np.array(d[slice(_attr(node, "start", 0), _attr(node, "end", None))], dtype=np.int64)


def _known(args: list, n: int) -> bool:
    """The first n inputs are all present and evaluated."""
    return len(args) >= n and all(a is not None for a in args[:n])


def _squeeze(node, args):
    x = args[0]
    if len(args) > 1 and node.input[1]:  # axes as an input (opset 13+)
        if args[1] is None:
            return None  # not "every 1": a wrong value pinned would size the graph wrongly
        axes = args[1]
    else:  # an attribute (opset < 13), or none: every 1
        axes = _attr(node, "axes", None)
    return np.squeeze(x) if axes is None else np.squeeze(x, axis=tuple(map(int, axes)))


def _unsqueeze(node, args):
    if not _known(args, 2):
        return None
    x, axes = args[0], args[1]
    rank = x.ndim + len(axes)
    for a in sorted(int(a) % rank for a in axes):
        x = np.expand_dims(x, a)
    return x


def _concat(node, args):
    if not _known(args, len(args)):
        return None
    return np.concatenate(
        [a.reshape(-1) if a.ndim == 0 else a for a in args], axis=_attr(node, "axis", 0)
    )


def _gather(node, args):
    if not _known(args, 2) or args[1].dtype.kind not in "iu":
        return None
    return np.take(args[0], args[1], axis=_attr(node, "axis", 0))


def _reshape(node, args):
    if not _known(args, 2):
        return None
    x = args[0]
    shape = _reshaped(list(x.shape), args[1].tolist(), _attr(node, "allowzero", 0))
    return x.reshape(shape) if shape is not None else None


def _cast(node, args):
    dtype = _DTYPES.get(_attr(node, "to", None))
    if dtype is None:
        return None
    return _cast_to(args[0], dtype)


def _cast_like(node, args):
    if not _known(args, 2):
        return None
    return _cast_to(args[0], args[1].dtype.type)


def _cast_to(x: np.ndarray, dtype) -> np.ndarray | None:
    if x.dtype.kind == "f" and np.dtype(dtype).kind in "iu":
        if not np.all(np.isfinite(x)) or np.any(np.abs(x) >= _INT_LIMIT):
            return None  # a runtime's cast of such a value is not defined
        return np.trunc(x).astype(dtype)  # ONNX casts floats to integers toward zero
    return x.astype(dtype)


def _elementwise(fn, arity: int | None = None, *, one_type: bool = True):
    """A rule for a broadcasting op: inputs of one type (as ONNX requires), the output's size
    checked from the broadcast shape before anything is computed."""

    def rule(node, args):
        if arity is not None and len(args) != arity or not _known(args, len(args)):
            return None
        if one_type and len({a.dtype for a in args}) > 1:
            return None
        if math.prod(np.broadcast_shapes(*(a.shape for a in args))) > MAX_VALUE:
            return None
        return fn(*args)

    return rule


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    if a.dtype.kind in "iu":  # ONNX integer division truncates toward zero
        if np.any(b == 0):
            return None
        q = np.abs(a) // np.abs(b)
        return (np.sign(a) * np.sign(b) * q).astype(a.dtype)
    with np.errstate(all="ignore"):
        return a / b


def _where(cond: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    if cond.dtype != np.bool_ or a.dtype != b.dtype:
        return None
    return np.where(cond, a, b)


def _range(node, args):
    if not _known(args, 3) or any(a.size != 1 for a in args) or len({a.dtype for a in args}) > 1:
        return None
    start, limit, delta = (a.reshape(()) for a in args)
    if delta == 0:
        return None
    count = max(math.ceil((float(limit) - float(start)) / float(delta)), 0)
    if count > MAX_VALUE:
        return None
    return (start + np.arange(count, dtype=start.dtype) * delta).astype(start.dtype)


def _variadic(fn):
    return lambda *xs: fn.reduce(np.broadcast_arrays(*xs)) if len(xs) > 1 else xs[0]


_RULES = {
    "Identity": lambda node, args: args[0],
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Concat": _concat,
    "Gather": _gather,
    "Reshape": _reshape,
    "Cast": _cast,
    "CastLike": _cast_like,
    "Range": _range,
    "Add": _elementwise(np.add, 2),
    "Sub": _elementwise(np.subtract, 2),
    "Mul": _elementwise(np.multiply, 2),
    "Div": _elementwise(_div, 2),
    "Min": _elementwise(_variadic(np.minimum)),
    "Max": _elementwise(_variadic(np.maximum)),
    "Abs": _elementwise(np.abs, 1),
    "Neg": _elementwise(np.negative, 1),
    "Sign": _elementwise(np.sign, 1),
    "Floor": _elementwise(np.floor, 1),
    "Ceil": _elementwise(np.ceil, 1),
    "Equal": _elementwise(np.equal, 2),
    "Less": _elementwise(np.less, 2),
    "LessOrEqual": _elementwise(np.less_equal, 2),
    "Greater": _elementwise(np.greater, 2),
    "GreaterOrEqual": _elementwise(np.greater_equal, 2),
    "Where": _elementwise(_where, 3, one_type=False),
}


def _reshaped(data: list[int], target: list[int], allowzero: int) -> list[int] | None:
    """Reshape's output dims (ONNX semantics: 0 copies the input's dim unless allowzero, one
    -1 takes what is left), or None when the target is not a valid one for this input."""
    out = [
        data[i] if s == 0 and not allowzero and i < len(data) else s for i, s in enumerate(target)
    ]
    if any(s < -1 for s in out) or out.count(-1) > 1:
        return None
    total, rest = math.prod(data), math.prod(s for s in out if s != -1)
    if -1 in out:
        if rest == 0 or total % rest:
            return None
        out[out.index(-1)] = total // rest
    return out if math.prod(out) == total else None
