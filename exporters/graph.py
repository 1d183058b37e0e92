"""Walking ONNX graphs: weight hashing, tensor enumeration and the graph/metadata contract."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

Dim = int | str | None


def is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data) > 0


def external_location(tensor: onnx.TensorProto) -> str:
    for entry in tensor.external_data:
        if entry.key == "location":
            return entry.value
    return "<no location given>"


def weights_hash(model: onnx.ModelProto) -> str:
    """sha256 over (name, dtype, dims, bytes) of every initializer, in sorted name order.

    The one definition used by export (to stamp ``weights_sha256``) and by validation (to check
    it). Values are hashed after decoding, so raw_data and typed-field storage hash the same.
    """
    digest = hashlib.sha256()
    for tensor in sorted(model.graph.initializer, key=lambda t: t.name):
        if is_external(tensor):
            raise ValueError(f"initializer '{tensor.name}' is stored outside the model file")
        # The array's own buffer, not a bytes copy of it: a VGG-9 would be copied whole.
        payload = np.ascontiguousarray(numpy_helper.to_array(tensor))
        header = f"{tensor.name}\0{tensor.data_type}\0{tuple(tensor.dims)}\0{payload.nbytes}\0"
        digest.update(header.encode("utf-8"))
        digest.update(payload.reshape(-1).view(np.uint8))
    return digest.hexdigest()


SMALL_TENSOR = 4096  # elements: shape-like initializers (Reshape shapes, Resize scales) and less


def without_weights(model: onnx.ModelProto, *, keep_shapes: bool) -> onnx.ModelProto:
    """A new model with the same graph and none of its large initializers' data. With
    `keep_shapes`, every initializer keeps its name, type and dims and small ones their values
    (shape inference reads Reshape's shape, Resize's scales...); without, none is kept.
    Built field by field, never copied whole: protobuf frees a message's memory only with the
    whole message, and copying would touch every weight."""
    old = model.graph
    graph = onnx.GraphProto(name=old.name)
    for field in ("node", "input", "output", "value_info"):
        getattr(graph, field).extend(getattr(old, field))
    if keep_shapes:
        for t in old.initializer:
            if math.prod(t.dims) <= SMALL_TENSOR:
                graph.initializer.append(t)
            else:
                graph.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims)
    light = onnx.ModelProto(
        ir_version=model.ir_version, producer_name=model.producer_name, graph=graph
    )
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    light.metadata_props.extend(model.metadata_props)
    return light


def iter_graphs(model: onnx.ModelProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    """The main graph, every nested subgraph (If/Loop/Scan bodies) and training graphs."""
    stack: list[tuple[str, onnx.GraphProto]] = [("graph", model.graph)]
    stack += [(f"training_info[{i}]", t.algorithm) for i, t in enumerate(model.training_info)]
    stack += [
        (f"training_info[{i}].init", t.initialization) for i, t in enumerate(model.training_info)
    ]
    while stack:
        where, graph = stack.pop()
        yield where, graph
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("g"):
                    stack.append((f"{where}/{node.name or node.op_type}.{attr.name}", attr.g))
                for i, sub in enumerate(attr.graphs):
                    stack.append((f"{where}/{node.name or node.op_type}.{attr.name}[{i}]", sub))


def iter_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    for _, graph in iter_graphs(model):
        yield from graph.node
    for function in model.functions:
        yield from function.node


def _attr_tensors(node: onnx.NodeProto, prefix: str) -> Iterator[tuple[str, onnx.TensorProto]]:
    label = f"{prefix}node '{node.name or node.op_type}' attribute"
    for attr in node.attribute:
        if attr.HasField("t"):
            yield f"{label} '{attr.name}'", attr.t
        for i, t in enumerate(attr.tensors):
            yield f"{label} '{attr.name}[{i}]'", t
        sparse = ([attr.sparse_tensor] if attr.HasField("sparse_tensor") else []) + list(
            attr.sparse_tensors
        )
        for s in sparse:
            yield f"{label} '{attr.name}' (sparse values)", s.values
            yield f"{label} '{attr.name}' (sparse indices)", s.indices


def iter_tensors(model: onnx.ModelProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    """Every tensor stored anywhere in the model, labelled with where it sits."""
    for where, graph in iter_graphs(model):
        prefix = "" if where == "graph" else f"{where}: "
        for t in graph.initializer:
            yield f"{prefix}initializer '{t.name}'", t
        for s in graph.sparse_initializer:
            yield f"{prefix}sparse initializer '{s.values.name}'", s.values
            yield f"{prefix}sparse initializer '{s.values.name}' indices", s.indices
        for node in graph.node:
            yield from _attr_tensors(node, prefix)
    for function in model.functions:
        for node in function.node:
            yield from _attr_tensors(node, f"function '{function.name}': ")


def value_dims(value: onnx.ValueInfoProto) -> list[Dim] | None:
    """Declared dims of a graph value: int, symbolic name, or None; None if no shape at all."""
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    dims: list[Dim] = []
    for d in tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        else:
            dims.append(d.dim_param or None)
    return dims


def real_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    # Older exporters also list initializers as graph inputs; those are weights, not inputs.
    weights = {t.name for t in graph.initializer}
    return [v for v in graph.input if v.name not in weights]


def _expect(problems: list[str], value: onnx.ValueInfoProto, role: str, tail: list[int]) -> None:
    dims = value_dims(value)
    want = ["B", *tail]
    if dims is None or len(dims) != len(want) or list(dims[1:]) != list(tail):
        shown = "unknown" if dims is None else [d if d is not None else "?" for d in dims]
        problems.append(f"{role} '{value.name}' has shape {shown}, metadata implies {want}")
    if value.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
        problems.append(f"{role} '{value.name}' must be float32")


def contract_problems(model: onnx.ModelProto, meta: dict[str, Any]) -> list[str]:
    """Does the graph's signature agree with what its (already valid) metadata claims?

    classifier/global: input [B, *input_shape]; classifier output [B, num_classes].
    decoder: inputs z [B, latent_dim] and label [B, num_classes]; output [B, *input_shape].
    predictions/prototypes: see constant_contract_problems.
    """
    if meta["kind"] in CONSTANT_OUTPUTS:
        return constant_contract_problems(model, meta)
    problems: list[str] = []
    inputs = real_inputs(model.graph)
    outputs = list(model.graph.output)
    if not inputs or not outputs:
        return ["the graph must have at least one input and one output"]
    kind, shape, classes = meta["kind"], list(meta["input_shape"]), meta["num_classes"]
    if kind == "decoder":
        names = [v.name for v in inputs]
        if names != ["z", "label"]:
            problems.append(f"a decoder's inputs must be ['z', 'label'], got {names}")
        else:
            _expect(problems, inputs[0], "input", [meta["latent_dim"]])
            _expect(problems, inputs[1], "input", [classes])
        _expect(problems, outputs[0], "output", shape)
    else:
        _expect(problems, inputs[0], "input", shape)
        if kind == "classifier":
            dims = value_dims(outputs[0])
            if not dims or dims[-1] != classes:
                problems.append(
                    f"output '{outputs[0].name}' last dimension is "
                    f"{dims[-1] if dims else 'unknown'}, but num_classes is {classes}"
                )
    return problems


# --- data artifacts: graphs with no inputs whose outputs are constants -----------------------

# Output name -> allowed element types, per kind.
CONSTANT_OUTPUTS: dict[str, dict[str, tuple[int, ...]]] = {
    "predictions": {"predictions": (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)},
    "prototypes": {"prototypes": (onnx.TensorProto.FLOAT,)},
}
_ROW_SUM_ATOL = 1e-3


def constant_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Output name -> value for a graph in which every output is Identity(initializer).

    That one shape is all a data artifact may have: its values are then read without running
    anything, and they are exactly the initializers that ``weights_hash`` covers.
    Raises ValueError naming what is different.
    """
    graph = model.graph
    if real_inputs(graph):
        raise ValueError("a data artifact must have no graph inputs")
    inits = {t.name: t for t in graph.initializer}
    producers = {}
    for node in graph.node:
        if node.op_type != "Identity" or node.domain not in ("", "ai.onnx"):
            raise ValueError(
                f"a data artifact may only contain Identity nodes, found {node.op_type}"
            )
        if len(node.input) != 1 or len(node.output) != 1 or node.input[0] not in inits:
            raise ValueError("every Identity node must copy exactly one initializer to one output")
        producers[node.output[0]] = node.input[0]
    outputs = [v.name for v in graph.output]
    if sorted(producers) != sorted(outputs) or len(set(producers.values())) != len(outputs):
        raise ValueError("every output must be a distinct initializer passed through Identity")
    if len(inits) != len(outputs):
        raise ValueError(f"{len(inits)} initializers for {len(outputs)} outputs")
    return {name: numpy_helper.to_array(inits[producers[name]]) for name in outputs}


def constant_contract_problems(model: onnx.ModelProto, meta: dict[str, Any]) -> list[str]:
    """predictions: one output 'predictions' [public_size, num_classes], float32 or float16,
    every row a probability vector. prototypes: one output 'prototypes'
    [len(classes), representation_size], float32 (finite values are checked by ingest)."""
    kind = meta["kind"]
    wanted = CONSTANT_OUTPUTS[kind]
    names = [v.name for v in model.graph.output]
    if names != list(wanted):
        return [f"a {kind} artifact's outputs must be {list(wanted)}, got {names}"]
    try:
        values = constant_values(model)
    except ValueError as exc:
        return [str(exc)]
    problems: list[str] = []
    out = model.graph.output[0]
    if out.type.tensor_type.elem_type not in wanted[out.name]:
        allowed = "/".join(onnx.TensorProto.DataType.Name(t).lower() for t in wanted[out.name])
        problems.append(f"output '{out.name}' must be {allowed}")
    value = values[out.name]
    if kind == "predictions":
        shape = [meta["public_size"], meta["num_classes"]]
        meaning = "[public_size, num_classes]"
    else:
        shape = [len(meta["classes"]), meta["representation_size"]]
        meaning = "[len(classes), representation_size]"
    if list(value.shape) != shape or value_dims(out) != shape:
        problems.append(
            f"output '{out.name}' has shape {list(value.shape)} (declared "
            f"{value_dims(out)}), metadata implies {shape} {meaning}"
        )
    elif kind == "predictions":
        problems.extend(_probability_problems(value))
    return problems


def _probability_problems(p: np.ndarray) -> list[str]:
    p64 = p.astype(np.float64)
    # NaN fails both comparisons, so it is reported here too (ingest reports it earlier).
    outside = ~((p64 >= 0.0) & (p64 <= 1.0))
    if outside.any():
        row = int(np.argwhere(outside)[0][0])
        return [f"predictions must be probabilities in [0, 1]; row {row} is not"]
    # float16 rounds every entry by up to half an ulp (2**-11 near 1): allow C of them per row.
    tol = _ROW_SUM_ATOL + (p.shape[1] * 2.0**-11 if p.dtype == np.float16 else 0.0)
    sums = p64.sum(axis=1)
    bad = np.flatnonzero(np.abs(sums - 1.0) > tol)
    if bad.size:
        return [
            f"each row of predictions must sum to 1 (softmax outputs); {bad.size} rows do not, "
            f"e.g. row {int(bad[0])} sums to {sums[bad[0]]:.4f}"
        ]
    return []
