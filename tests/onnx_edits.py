"""Edits of ONNX uploads that the hostile-upload tests share (tests/wire and tests/server): a
copy, metadata restamped with a fresh weights hash, a weight changed, a tensor made external,
and one-node graphs."""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper

from exporters import get_metadata, set_metadata, weights_hash


def clone(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def restamp(model: onnx.ModelProto, **changes) -> onnx.ModelProto:
    """Edit metadata and recompute the hash, so only the intended defect remains."""
    meta = get_metadata(model) | changes
    meta["weights_sha256"] = weights_hash(model)
    set_metadata(model, meta)
    return model


def with_client(model: onnx.ModelProto, client: str) -> onnx.ModelProto:
    return restamp(clone(model), client_id=client)


def edit_weight(model: onnx.ModelProto, value: float) -> onnx.ModelProto:
    weight = model.graph.initializer[0]
    array = numpy_helper.to_array(weight).copy()
    array.flat[0] = value
    weight.CopyFrom(numpy_helper.from_array(array, weight.name))
    return model


def make_external(tensor: onnx.TensorProto, location: str) -> None:
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "64")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def tiny_graph(node: onnx.NodeProto, extra_opsets=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node],
        "hostile",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["B", 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["B", 4])],
    )
    opsets = [helper.make_opsetid("", 18), *extra_opsets]
    # onnx 1.23 defaults to IR 14, which onnxruntime 1.31 cannot load.
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)
