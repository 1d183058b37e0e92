"""A graph's memory is fixed before it runs (issue 18, item 0): every tensor it computes has a
size known from its declared input (batch 1) and bounded, whether the size comes from
constants, from shape arithmetic the validator evaluates (Shape -> Concat -> Reshape), or not
at all. The server never runs a graph to find out; these files are refused before a session
exists."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import exporters
from exporters import UploadRejected, validate_upload


def _model(nodes, consts, out="y", width=784) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "bounds",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["B", width])],
        [helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, ["P", "Q"])],
        [numpy_helper.from_array(np.asarray(v, dtype=np.int64), k) for k, v in consts.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _outer_product(target_from_shapes: bool) -> onnx.ModelProto:
    """x (1 x 784) made a column and a row, multiplied (784 x 784), flattened to a column and
    multiplied by the row again: 481M elements, 1.9 GB, from a file of a few hundred bytes."""
    if target_from_shapes:  # the targets computed from x's shape, as exporters emit them
        shape = [
            helper.make_node("Shape", ["x"], ["n"], start=1),
            helper.make_node("Concat", ["n", "one"], ["col"], axis=0),
            helper.make_node("Concat", ["one", "n"], ["row"], axis=0),
        ]
        consts = {"one": [1], "flat": [-1, 1]}
    else:
        shape, consts = [], {"one": [1], "flat": [-1, 1], "col": [784, 1], "row": [1, 784]}
    return _model(
        [
            *shape,
            helper.make_node("Reshape", ["x", "col"], ["a"]),
            helper.make_node("Reshape", ["x", "row"], ["b"]),
            helper.make_node("MatMul", ["a", "b"], ["ab"]),
            helper.make_node("Reshape", ["ab", "flat"], ["c"]),
            helper.make_node("MatMul", ["c", "b"], ["y"]),
        ],
        consts,
    )


@pytest.fixture
def no_session(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a session was built for a graph that should be refused first")

    monkeypatch.setattr(exporters.validate.ort, "InferenceSession", refuse)


@pytest.mark.parametrize("from_shapes", [False, True])
def test_a_graph_that_grows_is_refused_however_its_sizes_are_given(
    tmp_path, no_session, from_shapes
):
    path = tmp_path / "grow.onnx"
    path.write_bytes(_outer_product(from_shapes).SerializeToString())
    with pytest.raises(UploadRejected, match=r"481,890,304 elements for one sample"):
        validate_upload(path, require_metadata=False)


def test_a_graph_whose_sizes_cannot_be_known_is_refused(tmp_path, no_session):
    # A Reshape target that no inference evaluates (the mean of a shape): its size is only
    # found by running it.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("ReduceMean", ["s"], ["m"], keepdims=1),
        helper.make_node("Concat", ["m", "neg"], ["t"], axis=0),
        helper.make_node("Reshape", ["x", "t"], ["y"]),
    ]
    path = tmp_path / "unknown.onnx"
    path.write_bytes(_model(nodes, {"neg": [-1]}).SerializeToString())
    with pytest.raises(UploadRejected, match="cannot be known before the graph runs"):
        validate_upload(path, require_metadata=False)


def test_shape_arithmetic_of_a_small_graph_is_evaluated_and_it_runs(tmp_path):
    # The same arithmetic on a graph that stays small: sizes found, accepted, and it runs.
    nodes = [
        helper.make_node("Shape", ["x"], ["n"], start=1),
        helper.make_node("Concat", ["n", "one"], ["col"], axis=0),
        helper.make_node("Concat", ["one", "n"], ["row"], axis=0),
        helper.make_node("Reshape", ["x", "col"], ["a"]),
        helper.make_node("Reshape", ["x", "row"], ["b"]),
        helper.make_node("MatMul", ["a", "b"], ["y"]),
    ]
    path = tmp_path / "small.onnx"
    path.write_bytes(_model(nodes, {"one": [1]}, width=8).SerializeToString())
    art = validate_upload(path, require_metadata=False)
    x = np.arange(8, dtype=np.float32)[None]
    np.testing.assert_allclose(art.run(x), x.T @ x)


def test_many_tensors_each_under_the_bound_are_refused_in_all(tmp_path, no_session):
    # 784 x 784 outer products, each concatenated 16 times (9.8M elements, under the 16.7M
    # per tensor) and summed: 15 of them hold 150M+ elements, over the 134M in all.
    nodes = [
        helper.make_node("Reshape", ["x", "col"], ["a"]),
        helper.make_node("Reshape", ["x", "row"], ["b"]),
        helper.make_node("MatMul", ["a", "b"], ["ab"]),
    ]
    last = None
    for i in range(15):
        nodes.append(helper.make_node("Concat", ["ab"] * 16, [f"c{i}"], axis=0))
        if last is not None:
            nodes.append(helper.make_node("Add", [last, f"c{i}"], [f"s{i}"]))
        last = f"s{i}" if last is not None else f"c{i}"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    path = tmp_path / "many.onnx"
    path.write_bytes(_model(nodes, {"col": [784, 1], "row": [1, 784]}).SerializeToString())
    with pytest.raises(UploadRejected, match="elements in all for one sample"):
        validate_upload(path, require_metadata=False)


def test_squeeze_is_evaluated_only_where_its_axes_are_known():
    # x of dims (1, 1, 2): squeezing axis 0 keeps (1, 2); every 1 would make it (2,).
    from exporters.shapes import _evaluate

    x = np.arange(2, dtype=np.int64).reshape(1, 1, 2)
    values, dims = {"x": x, "zero": np.array([0])}, {}
    node = helper.make_node("Squeeze", ["x", "zero"], ["y"])
    assert _evaluate(node, values, dims).shape == (1, 2)
    assert _evaluate(helper.make_node("Squeeze", ["x"], ["y"]), values, dims).shape == (2,)
    old = helper.make_node("Squeeze", ["x"], ["y"], axes=[1])  # opset < 13: an attribute
    assert _evaluate(old, values, dims).shape == (1, 2)
    # Axes computed by a node it does not evaluate: unknown, never guessed as "every 1".
    assert _evaluate(helper.make_node("Squeeze", ["x", "unknown"], ["y"]), values, dims) is None
    assert _evaluate(helper.make_node("Identity", [""], ["y"]), values, dims) is None


def test_arithmetic_that_sizes_a_graph_is_evaluated_and_still_bounded(tmp_path, no_session):
    # Adaptive pooling exports index grids (Range, Mul, Div, Cast...) whose values size the
    # graph: they are evaluated, and a size so found is bounded like any other. Here the
    # arithmetic makes an Expand target of (784 x 784) x 784 from the input's shape.
    nodes = [
        helper.make_node("Shape", ["x"], ["n"], start=1),
        helper.make_node("Mul", ["n", "n"], ["nn"]),
        helper.make_node("Concat", ["nn", "n"], ["t"], axis=0),
        helper.make_node("Reshape", ["x", "row"], ["r"]),
        helper.make_node("Expand", ["r", "t"], ["y"]),
    ]
    path = tmp_path / "expand.onnx"
    path.write_bytes(_model(nodes, {"row": [1, 784]}).SerializeToString())
    with pytest.raises(UploadRejected, match=r"481,890,304 elements for one sample"):
        validate_upload(path, require_metadata=False)


@pytest.mark.parametrize(
    ("power", "refusal"),
    [(3, r"481,890,304 elements for one sample"), (4, "cannot be known before the graph runs")],
)
def test_a_range_from_shape_arithmetic_is_bounded(tmp_path, no_session, power, refusal):
    # 0 .. 784 ** power: a length found (784 ** 3) is bounded like any size; one past what
    # the evaluator holds as a size (784 ** 4 > 2 ** 31) is never pinned, so it stays unknown.
    nodes = [helper.make_node("Shape", ["x"], ["p1"], start=1)]
    for k in range(2, power + 1):
        nodes.append(helper.make_node("Mul", [f"p{k - 1}", "p1"], [f"p{k}"]))
    nodes += [
        helper.make_node("Squeeze", [f"p{power}", "zero"], ["lim"]),
        helper.make_node("Range", ["start", "lim", "step"], ["r"]),
        helper.make_node("Cast", ["r"], ["rf"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["rf", "zero"], ["y"]),
    ]
    consts = {"zero": [0], "start": 0, "step": 1}
    path = tmp_path / "range.onnx"
    path.write_bytes(_model(nodes, consts).SerializeToString())
    with pytest.raises(UploadRejected, match=refusal):
        validate_upload(path, require_metadata=False)


def test_evaluated_arithmetic_follows_onnx_semantics():
    from exporters.shapes import _evaluate

    i64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    values = {
        "a": i64(-7, 7),
        "b": i64(2, 2),
        "z": i64(0, 1),
        "f": np.array([-2.7, 2.7], np.float32),
        "s0": np.array(0, np.int64),
        "s9": np.array(9, np.int64),
        "s3": np.array(3, np.int64),
        "big": np.arange(4096, dtype=np.int64),
    }

    def ev(op, *ins, **attrs):
        return _evaluate(helper.make_node(op, list(ins), ["y"], **attrs), values, {})

    assert ev("Div", "a", "b").tolist() == [-3, 3]  # integer division truncates toward zero
    assert ev("Div", "a", "z") is None  # by zero: unknown, not a number a runtime may differ on
    assert ev("Cast", "f", to=onnx.TensorProto.INT64).tolist() == [-2, 2]
    assert ev("Range", "s0", "s9", "s3").tolist() == [0, 3, 6]
    assert ev("Min", "a", "b").tolist() == [-7, 2]
    assert ev("Mul", "a", "f") is None  # mixed types: not a valid ONNX node
    col = {"col": values["big"].reshape(-1, 1)}
    values |= col
    assert ev("Add", "col", "big") is None  # 4096 x 4096 values: more than shape arithmetic holds
