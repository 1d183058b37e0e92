"""A plain graph that third-party tools accept: the deployment form of an edgefl artifact.

torch's dynamo exporter (``optimize=False``, which keeps the weights' names) leaves ``Constant``
nodes whose value is an attribute list (``value_ints``/``value_floats``) and computes Reshape
targets from ``Shape(input)``. onnxsim 0.4, onnx2tf and onnx-tool fail on exactly that
(shared/notes/deploy.md); the dynamic batch dimension keeps onnxruntime's NNAPI and CoreML
execution providers from taking any node that depends on it.

``plain_graph`` rewrites a copy of the model:

1. every ``Constant`` node becomes an initializer (a plain tensor) of the same name;
2. with ``batch`` given, every graph input's and output's symbolic first dimension is fixed to it
   (the stale ``value_info`` is dropped, shapes are re-inferred);
3. shape arithmetic is folded: a ``Shape`` whose input has a static shape becomes its value, and
   any node whose inputs are all small constants is evaluated (onnx's reference evaluator) and
   replaced by its outputs, repeated until nothing changes;
4. nodes and initializers nothing reads any more are removed.

The weights are never touched: a node that reads an initializer of the source is not folded, so every
weight keeps its name and bytes (the server's load-by-name and ``weights_sha256`` still hold).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from .errors import ExportError
from .graph import SMALL_TENSOR, without_weights

_CONSTANT_ATTRS = (
    "value",
    "value_float",
    "value_floats",
    "value_int",
    "value_ints",
    "value_string",
    "value_strings",
)
# Ops evaluated even when their result is only known with a fixed shape; never ops with weights.
_NOT_FOLDED = {"Conv", "ConvTranspose", "Gemm", "MatMul", "QLinearConv", "QLinearMatMul"}


@dataclass(frozen=True)
class PlainReport:
    """What the pass changed, for a report or a test."""

    constants_lifted: int
    nodes_folded: int
    nodes_before: int
    nodes_after: int
    batch: int | None

    def as_dict(self) -> dict:
        return {
            "constants_lifted": self.constants_lifted,
            "nodes_folded": self.nodes_folded,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "batch": self.batch,
        }


def plain_graph(
    model: onnx.ModelProto, *, batch: int | None = 1
) -> tuple[onnx.ModelProto, PlainReport]:
    """A plain copy of ``model`` (see the module docstring); ``batch=None`` keeps it dynamic."""
    if batch is not None and batch < 1:
        raise ExportError(f"batch must be a positive int, got {batch}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    if any(a.HasField("g") or a.graphs for n in graph.node for a in n.attribute):
        raise ExportError(
            "graphs with subgraphs (If/Loop/Scan) are not supported by the plain pass"
        )
    nodes_before = len(graph.node)
    weights = {t.name for t in graph.initializer}
    lifted = _lift_constants(graph)
    if batch is not None:
        _fix_batch(graph, batch)
    folded = _fold(out, weights)
    _prune(graph)
    _infer_outputs(out)
    try:
        onnx.checker.check_model(out, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ExportError(f"the plain graph is not valid ONNX: {exc}") from exc
    return out, PlainReport(lifted, folded, nodes_before, len(graph.node), batch)


def _lift_constants(graph: onnx.GraphProto) -> int:
    """Constant nodes -> initializers of the same name (typed tensors, never attribute lists)."""
    keep, lifted = [], 0
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            graph.initializer.append(_constant_tensor(node))
            lifted += 1
        else:
            keep.append(node)
    del graph.node[:]
    graph.node.extend(keep)
    return lifted


def _constant_tensor(node: onnx.NodeProto) -> onnx.TensorProto:
    attrs = [a for a in node.attribute if a.name in _CONSTANT_ATTRS]
    if len(attrs) != 1:
        raise ExportError(f"Constant node {node.name!r} has no single value attribute")
    value = helper.get_attribute_value(attrs[0])
    if isinstance(value, onnx.TensorProto):
        array = numpy_helper.to_array(value)
    elif attrs[0].name in ("value_int", "value_ints"):
        array = np.asarray(value, dtype=np.int64)
    elif attrs[0].name in ("value_float", "value_floats"):
        array = np.asarray(value, dtype=np.float32)
    else:
        raise ExportError(f"Constant node {node.name!r}: string constants are not supported")
    return numpy_helper.from_array(array, node.output[0])


def _fix_batch(graph: onnx.GraphProto, batch: int) -> None:
    names = set()
    for value in [*graph.input, *graph.output]:
        dims = value.type.tensor_type.shape.dim
        if dims and not dims[0].HasField("dim_value"):
            names.add(dims[0].dim_param)
            dims[0].Clear()
            dims[0].dim_value = batch
    # Any other use of the same symbol (a second input, an output) is the same batch.
    for value in [*graph.input, *graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in names:
                dim.Clear()
                dim.dim_value = batch
    # The exporter's value_info still says "batch": it would contradict inference below.
    del graph.value_info[:]


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    try:
        # Without the weights' bytes (names, dims and small values kept): same shapes, faster.
        light = without_weights(model, keep_shapes=True)
        inferred = shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
    except Exception:  # a graph inference cannot read: nothing becomes static, nothing folds
        return {}
    shapes: dict[str, list[int]] = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        t = value.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            shapes[value.name] = [d.dim_value for d in t.shape.dim]
    return shapes


def _fold(model: onnx.ModelProto, weights: set[str]) -> int:
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    opset = {o.domain or "": o.version for o in model.opset_import}
    folded = 0
    while True:
        known = {t.name: t for t in graph.initializer}
        # The weights are never inputs of a folded node, however small: they keep their names.
        small = {
            n for n, t in known.items() if math.prod(t.dims) <= SMALL_TENSOR and n not in weights
        }
        shapes = _static_shapes(model)
        changed = False
        keep = []
        for node in graph.node:
            values = _evaluate(node, known, small, shapes, opset, ReferenceEvaluator)
            if values is None:
                keep.append(node)
                continue
            for name, array in zip(node.output, values, strict=True):
                tensor = numpy_helper.from_array(np.asarray(array), name)
                graph.initializer.append(tensor)
                known[name] = tensor
                if math.prod(tensor.dims) <= SMALL_TENSOR:
                    small.add(name)
            folded += 1
            changed = True
        del graph.node[:]
        graph.node.extend(keep)
        if not changed:
            return folded


def _evaluate(node, known, small, shapes, opset, evaluator) -> list[np.ndarray] | None:
    if node.domain not in ("", "ai.onnx") or node.op_type in _NOT_FOLDED:
        return None
    inputs = [i for i in node.input if i]
    if node.op_type == "Shape":
        return _shape_value(node, known, shapes)
    if node.op_type == "Size" and node.input[0] in shapes:
        return [np.asarray(math.prod(shapes[node.input[0]]), dtype=np.int64)]
    if not inputs or not all(i in small for i in inputs):
        return None
    return _run_alone(node, known, inputs, opset, evaluator)


def _shape_value(node, known, shapes) -> list[np.ndarray] | None:
    """A Shape node's output, where its input's shape is static."""
    source = known.get(node.input[0])
    shape = list(source.dims) if source is not None else shapes.get(node.input[0])
    if shape is None:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return [np.asarray(shape[slice(start, end)], dtype=np.int64)]


def _run_alone(node, known, inputs, opset, evaluator) -> list[np.ndarray] | None:
    """``node``'s outputs from the reference evaluator, fed the constants ``inputs`` name;
    None where it cannot run the node or an output is not small."""
    feeds = {i: numpy_helper.to_array(known[i]) for i in inputs}
    single = helper.make_graph(
        [node],
        "fold",
        [helper.make_tensor_value_info(i, known[i].data_type, list(known[i].dims)) for i in inputs],
        [helper.make_empty_tensor_value_info(o) for o in node.output if o],
    )
    probe = helper.make_model(
        single,
        opset_imports=[helper.make_opsetid(d, v) for d, v in opset.items()],
        ir_version=10,
    )
    try:
        results = evaluator(probe).run(None, feeds)
    except Exception:  # an op the reference evaluator lacks: leave it to the runtime
        return None
    if any(np.asarray(r).size > SMALL_TENSOR for r in results):
        return None
    return [np.asarray(r) for r in results]


def _prune(graph: onnx.GraphProto) -> None:
    """Drop nodes whose outputs nothing reads, then initializers nothing reads."""
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    del graph.node[:]
    graph.node.extend(reversed(keep))
    inits = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)


def _infer_outputs(model: onnx.ModelProto) -> None:
    """Re-infer the outputs' shapes (now static with a fixed batch) without storing value_info for
    weights, which static quantizers then contradict (shared/notes/platform.md)."""
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        return
    by_name = {o.name: o for o in inferred.graph.output}
    for output in model.graph.output:
        new = by_name.get(output.name)
        if new is not None and new.type.tensor_type.HasField("shape"):
            output.type.CopyFrom(new.type)


def fold_batchnorm(model: onnx.ModelProto) -> int:
    """Fold each inference-mode BatchNormalization into the Conv that alone feeds it (changes
    `model`; -> how many). For the deployment form only: it rewrites the conv's weights, which the
    plain pass never does. CoreML's ML Program takes no BatchNormalization node, and a phone's
    runtime would fold it anyway."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    readers = Counter(name for node in graph.node for name in node.input)
    producer = {o: n for n in graph.node for o in n.output}
    drop, folded = set(), 0
    for bn in graph.node:
        found = _conv_to_fold(bn, producer, inits, readers)
        if found is None:
            continue
        conv, params = found
        new_w, new_b = _folded_weights(bn, params)
        _rewrite_conv(graph, inits, conv, new_w, new_b)
        conv.output[0] = bn.output[0]
        drop.add(bn.output[0])
        folded += 1
    keep = [
        n for n in graph.node if not (n.op_type == "BatchNormalization" and n.output[0] in drop)
    ]
    del graph.node[:]
    graph.node.extend(keep)
    _prune(graph)
    return folded


def _conv_to_fold(bn, producer, inits, readers) -> tuple[onnx.NodeProto, list] | None:
    """The Conv that alone feeds ``bn`` (a BatchNormalization) and the initializers of both
    (scale, shift, mean, var, weight[, bias]), or None where ``bn`` cannot be folded."""
    conv = producer.get(bn.input[0]) if bn.op_type == "BatchNormalization" else None
    if conv is None or conv.op_type != "Conv" or len(bn.output) != 1:
        return None
    params = [inits.get(n) for n in (*bn.input[1:5], *conv.input[1:3])]
    if readers.get(bn.input[0]) != 1 or any(p is None for p in params[:5]):
        return None
    if any(readers.get(n) != 1 for n in conv.input[1:3]):
        return None  # a weight shared with another node keeps its values
    return conv, params


def _folded_weights(bn: onnx.NodeProto, params: list) -> tuple[np.ndarray, np.ndarray]:
    """The conv's weight and bias with the batch norm applied, in the weight's dtype."""
    scale, shift, mean, var, weight = (numpy_helper.to_array(p) for p in params[:5])
    eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
    factor = scale / np.sqrt(var + eps)
    bias = numpy_helper.to_array(params[5]) if params[5] is not None else np.zeros_like(mean)
    new_w = weight * factor.reshape(-1, *[1] * (weight.ndim - 1))
    new_b = (bias - mean) * factor + shift
    return new_w.astype(weight.dtype), new_b.astype(weight.dtype)


def _rewrite_conv(graph, inits, conv, new_w: np.ndarray, new_b: np.ndarray) -> None:
    """Give ``conv`` the folded weight and bias: in place where it has them, a new bias
    initializer (added to ``inits`` too) where it has none."""
    inits[conv.input[1]].CopyFrom(numpy_helper.from_array(new_w, conv.input[1]))
    bias_name = conv.input[2] if len(conv.input) > 2 and conv.input[2] else conv.output[0] + "_bias"
    tensor = numpy_helper.from_array(new_b, bias_name)
    if bias_name in inits:
        inits[bias_name].CopyFrom(tensor)
    else:
        graph.initializer.append(tensor)
        inits[bias_name] = graph.initializer[-1]
        del conv.input[2:]
        conv.input.append(bias_name)
