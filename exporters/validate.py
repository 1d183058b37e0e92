"""Validation of UNTRUSTED uploads: everything a device sends is hostile until proven otherwise.
One file's checks; a folder of uploads is read by exporters.folder."""

from __future__ import annotations

import hashlib
import math
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from . import shapes
from .errors import UploadRejected
from .graph import (
    contract_problems,
    external_location,
    is_external,
    iter_graphs,
    iter_nodes,
    iter_tensors,
    value_dims,
    weights_hash,
    without_weights,
)
from .read import Artifact, artifact_from_bytes, get_metadata, session_options
from .schema import METADATA_KEY, validate_metadata
from .timing import timed

# Real uploads must pass: the FedMHO paper's VGG-9 is 277 MB at fp32 (69M parameters); the cap
# only stops absurd files before parsing (ONNX protobufs end at 2 GiB anyway).
DEFAULT_MAX_UPLOAD_BYTES = 512 * 1024 * 1024
# Per tensor (weights and declared shapes): VGG-9's first FC layer has 51.4M elements; a weight
# larger than this could not fit under the byte cap at fp32 anyway.
DEFAULT_MAX_TENSOR_ELEMENTS = DEFAULT_MAX_UPLOAD_BYTES // 4
MAX_DECLARED_DIM = 10**6

# Deliberately CLOSED: exactly the default-domain ops measured from torch 2.13's dynamo exporter
# (optimize=False, opset 18) for Conv/ConvTranspose/Linear/ReLU/LeakyReLU/Sigmoid/Tanh/Softmax/
# LogSoftmax/MaxPool/AvgPool/AdaptiveAvgPool/BatchNorm/Dropout/Upsample/cat/view/flatten, from the
# legacy TorchScript exporter for the same layers, and from onnxruntime's quantize_dynamic.
# Anything else (control flow, RNG, string ops, custom domains) is refused; widen it per call
# with allowed_ops=, never by default.
DEFAULT_ALLOWED_OPS: frozenset[str] = frozenset(
    {
        # layers
        "Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization",
        "MaxPool", "AveragePool", "ReduceMean", "Resize",
        "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Softmax", "LogSoftmax",
        # glue: Linear on >2-D inputs, view/flatten/cat, eval-mode Dropout
        "Add", "Transpose", "Reshape", "Concat", "Shape", "Squeeze", "Unsqueeze",
        "Constant", "Identity",
        # AdaptiveAvgPool2d to an output size that does not divide the input size
        "Abs", "Cast", "CastLike", "Div", "Expand", "Floor", "Gather", "GatherND",
        "GreaterOrEqual", "Max", "Min", "Mul", "Range", "Sign", "Sub", "Where",
        # ... and the sliced form edgefl exports it as (models.nets.SlicedAdaptiveAvgPool2d)
        "Slice",
        # legacy TorchScript exporter (dynamo=False), models from other tools
        "Flatten", "GlobalAveragePool",
        # onnxruntime.quantization.quantize_dynamic (int8)
        "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
    }
)  # fmt: skip

_DEFAULT_DOMAINS = ("", "ai.onnx")
_FLOAT_TYPES = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
}


def validate_upload(
    path: str | os.PathLike[str],
    *,
    max_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
    allowed_ops: frozenset[str] = DEFAULT_ALLOWED_OPS,
    opset_range: tuple[int, int] = (18, 23),
    ir_range: tuple[int, int] = (7, 10),
    max_tensor_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS,
    require_metadata: bool = True,
    timings: dict[str, float] | None = None,
) -> Artifact:
    """Check one uploaded file; return it as an Artifact or raise UploadRejected(reason).

    Checks run cheapest and most dangerous first: nothing is parsed before its size is known,
    nothing external is ever opened, and onnxruntime sees the bytes only after every other check.
    `timings`, if given, accumulates seconds per stage (read, parse, checker, tensors, hash,
    session).
    """
    with timed(timings, "read"):
        data = _read_capped(Path(path), max_bytes)
    with timed(timings, "parse"):
        model = _parse(data)
        _reject_external(model)
        _check_versions_and_ops(model, allowed_ops, opset_range, ir_range)
        # Before the checker: its shape inference would otherwise trip over the absurd dims
        # first and report a vaguer "inferred shape differs".
        _check_declared_shapes(model, max_tensor_elements)
    with timed(timings, "checker"):
        # check_model(full_check=True) = the checker + strict, type-checking shape inference.
        # Inference needs the weights' shapes, not their values: it runs on a weightless copy,
        # which spares serialising and re-parsing every weight (0.7-2.3 s for a VGG-9).
        try:
            onnx.checker.check_model(model)
            inferred = shapes.infer(without_weights(model, keep_shapes=True))
        except Exception as exc:  # checker raises ValidationError, shape inference InferenceError
            raise UploadRejected(f"ONNX checker failed: {_first_line(exc)}") from None
        sizes = _check_activations(inferred)
        _check_declarations(model, sizes)
    with timed(timings, "tensors"):
        _check_tensors(model, max_tensor_elements)
    with timed(timings, "hash"):
        meta = _check_metadata(model, require_metadata)
    with timed(timings, "session"):
        session = _session(data)
    artifact = artifact_from_bytes(path, data, model, meta)
    artifact.sha256 = hashlib.sha256(data).hexdigest()
    artifact._sessions[("CPUExecutionProvider",)] = session
    # The session and the parsed model hold the weights already; a third copy in the bytes
    # would only raise the server's peak memory (another session re-serializes the model).
    artifact._data = b""
    return artifact


# Elements one intermediate tensor may hold for ONE sample. The largest activation of any zoo
# model is VGG-9's 64 x 32 x 32 = 65,536; a 224 x 224 x 64 image model's is 3.2M. The bound
# refuses a small file whose attributes (Conv pads, Resize scales, Expand/Tile shapes) would
# make onnxruntime allocate gigabytes once the parity check runs it (2026-11-23: Conv pads
# 2000 in a 42 kB upload asked for 4.1 GB).
MAX_ACTIVATION_ELEMENTS = 1 << 24
# All of them together, for one sample: an upper bound on what onnxruntime can hold at once
# while it runs the graph (its planner frees and reuses buffers, so it holds less), i.e. the
# memory cap of the parity run, fixed before it starts. VGG-9's sum to 0.68M on CIFAR-10.
MAX_TOTAL_ACTIVATION_ELEMENTS = 1 << 27


def _check_activations(inferred: onnx.ModelProto) -> dict[str, list[int]]:
    """Per-sample dims of every tensor the graph computes, each bounded (UploadRejected)."""
    sizes = shapes.computed(inferred)
    unsized = [name for name, dims in sizes.items() if dims is None]
    if unsized:
        raise UploadRejected(
            f"the size of tensor {unsized[0][:80]!r} cannot be known before the graph runs "
            f"({len(unsized)} such): the server does not run a graph to find out how much "
            "memory it takes"
        )
    total = 0
    for name, dims in sizes.items():
        n = math.prod(max(0, d) for d in dims)
        if n > MAX_ACTIVATION_ELEMENTS:
            raise UploadRejected(
                f"tensor {name[:80]!r} would hold {n:,} elements for one sample (limit "
                f"{MAX_ACTIVATION_ELEMENTS:,}): its graph grows far beyond its input"
            )
        total += n
    if total > MAX_TOTAL_ACTIVATION_ELEMENTS:
        raise UploadRejected(
            f"the tensors the graph computes would hold {total:,} elements in all for one "
            f"sample (limit {MAX_TOTAL_ACTIVATION_ELEMENTS:,}): more memory than a model's "
            "evaluation is allowed"
        )
    return sizes


def _check_declarations(model: onnx.ModelProto, sizes: dict[str, list[int]]) -> None:
    """The graph's value_info is the uploader's claim about its tensors' shapes, and it reaches
    onnxruntime with the bytes. Rather than rely on onnxruntime never sizing a buffer from a
    claim, a claim must agree with what the validator computed and bounded: a weight's with its
    dims, a computed tensor's with its dims (symbolic dims, e.g. the batch, are free), and a
    claim about a name the graph never computes stays under the per-tensor limit."""
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    for value in model.graph.value_info:
        declared = value_dims(value)
        if declared is None:
            continue
        known = weights.get(value.name, sizes.get(value.name))
        if not _declaration_agrees(declared, known):
            shown = [d if d is not None else "?" for d in declared]
            raise UploadRejected(
                f"value_info declares shape {shown} for tensor {value.name[:80]!r}, which the "
                f"graph computes as {known if known is not None else 'nothing'}: a declaration "
                "must agree with the graph"
            )


def _declaration_agrees(declared: list, known: list[int] | None) -> bool:
    """A declared shape agrees with the dims computed for its tensor (None: nothing computes
    it, so it must stay under the per-tensor limit); a symbolic dim agrees with any."""
    ints = [d for d in declared if isinstance(d, int)]
    if known is None:
        return all(0 <= d <= MAX_DECLARED_DIM for d in ints) and (
            math.prod(ints) <= MAX_ACTIVATION_ELEMENTS
        )
    return len(declared) == len(known) and all(
        not isinstance(d, int) or d == k for d, k in zip(declared, known, strict=True)
    )


def _first_line(exc: BaseException, limit: int = 240) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    line = lines[0] if lines else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _read_capped(path: Path, max_bytes: int) -> bytes:
    fd = open_upload(path, max_bytes)
    try:
        chunks, remaining = [], max_bytes + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:  # grew after stat
        raise UploadRejected(f"file is over the {max_bytes}-byte limit")
    return data


def open_upload(path: Path, max_bytes: int) -> int:
    """A read-only descriptor on the upload at `path` (the caller closes it), or UploadRejected:
    a symlink, not a regular file, hard-linked, over `max_bytes`, or swapped while opened."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise UploadRejected(f"cannot stat file: {exc.strerror}") from None
    if stat.S_ISLNK(info.st_mode):
        raise UploadRejected("is a symlink; uploads must be regular files")
    if not stat.S_ISREG(info.st_mode):
        raise UploadRejected("not a regular file")
    if info.st_nlink > 1:
        # Another path shares this inode: it may be a file outside the upload directory (a hard
        # link is as foreign as a symlink), so its bytes are not the client's to send.
        raise UploadRejected(
            f"has {info.st_nlink} hard links; uploads must be files of their own (copy it in)"
        )
    if info.st_size > max_bytes:
        raise UploadRejected(f"file is {info.st_size} bytes, over the {max_bytes}-byte limit")
    # O_NOFOLLOW/O_NONBLOCK: if the file is swapped for a symlink or FIFO after lstat, fail
    # rather than follow it or block; fstat re-checks what was actually opened.
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise UploadRejected(f"cannot open file: {exc.strerror}") from None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise UploadRejected("not a regular file")
        if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino) or opened.st_nlink > 1:
            raise UploadRejected("was replaced or hard-linked while being opened")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _parse(data: bytes) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        # Parsing bytes loads no external data: that only happens via onnx.load(path).
        model.ParseFromString(data)
    except Exception:
        raise UploadRejected("not a valid ONNX file (protobuf parse failed)") from None
    if not data or model.ir_version <= 0 or not model.HasField("graph"):
        raise UploadRejected("not a valid ONNX file (no IR version or no graph)")
    return model


def _reject_external(model: onnx.ModelProto) -> None:
    for where, tensor in iter_tensors(model):
        if is_external(tensor):
            raise UploadRejected(
                f"{where} claims external data at '{external_location(tensor)}'; "
                "weights must be inside the file"
            )


def _check_versions_and_ops(
    model: onnx.ModelProto,
    allowed_ops: frozenset[str],
    opset_range: tuple[int, int],
    ir_range: tuple[int, int],
) -> None:
    if not ir_range[0] <= model.ir_version <= ir_range[1]:
        raise UploadRejected(
            f"IR version {model.ir_version} outside the accepted range {ir_range[0]}..{ir_range[1]}"
        )
    opsets = [o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS]
    if len(opsets) != 1:
        raise UploadRejected("missing (or repeated) default-domain opset import")
    if not opset_range[0] <= opsets[0] <= opset_range[1]:
        raise UploadRejected(
            f"opset {opsets[0]} outside the accepted range {opset_range[0]}..{opset_range[1]}"
        )
    if model.functions:
        raise UploadRejected("model-local functions are not allowed")
    if model.training_info:
        raise UploadRejected("training_info graphs are not allowed")
    for where, graph in iter_graphs(model):
        if graph.sparse_initializer:
            raise UploadRejected(f"sparse initializers are not supported ({where})")
    for node in iter_nodes(model):
        if node.domain not in _DEFAULT_DOMAINS:
            raise UploadRejected(
                f"operator '{node.domain}::{node.op_type}' is from a non-standard domain"
            )
        if node.op_type not in allowed_ops:
            raise UploadRejected(f"operator '{node.op_type}' is not in the allowed operator list")
        # Subgraph-carrying nodes (If/Loop/Scan) are reachable only if the caller allowed them;
        # their bodies are then checked too, because iter_nodes walks nested graphs.


def _check_tensors(model: onnx.ModelProto, max_elements: int) -> None:
    for where, tensor in iter_tensors(model):
        if any(d < 0 for d in tensor.dims):
            raise UploadRejected(f"{where} has a negative dimension {list(tensor.dims)}")
        count = math.prod(tensor.dims)
        if count > max_elements:
            raise UploadRejected(
                f"{where} has {count} elements, over the {max_elements}-element limit"
            )
        # Every tensor is decoded, whatever its type: the weights hash decodes them all, and a
        # tensor whose bytes do not fit its type and dims (a predictions tensor re-typed to
        # uint16, which no operator's type check reaches) broke it with a bare ValueError.
        try:
            values = numpy_helper.to_array(tensor)
        except Exception:
            raise UploadRejected(
                f"{where} is malformed (data does not match its type and dims)"
            ) from None
        finite = (
            tensor.data_type not in _FLOAT_TYPES
            or np.isfinite(values.astype(np.float32, copy=False)).all()
        )
        if not finite:
            raise UploadRejected(f"{where} contains NaN or infinite values")
    for node in iter_nodes(model):
        for attr in node.attribute:
            floats = [attr.f] if attr.type == onnx.AttributeProto.FLOAT else list(attr.floats)
            if not all(math.isfinite(f) for f in floats):
                raise UploadRejected(
                    f"attribute '{attr.name}' of node '{node.name or node.op_type}' is not finite"
                )


def _check_declared_shapes(model: onnx.ModelProto, max_elements: int) -> None:
    graph = model.graph
    for role, values in (("input", graph.input), ("output", graph.output)):
        for value in values:
            declared = value_dims(value) or []
            dims = [d for d in declared if isinstance(d, int)]
            if any(d < 0 or d > MAX_DECLARED_DIM for d in dims) or math.prod(dims) > max_elements:
                shown = [d if d is not None else "?" for d in declared]
                raise UploadRejected(
                    f"absurd declared dimension on graph {role} '{value.name}': {shown}"
                )


def _check_metadata(model: onnx.ModelProto, require: bool) -> dict[str, Any]:
    try:
        meta = get_metadata(model)
    except ValueError as exc:
        raise UploadRejected(f"metadata '{METADATA_KEY}' unreadable: {exc}") from None
    if meta is None:
        if require:
            raise UploadRejected(f"no '{METADATA_KEY}' metadata; not an edgefl artifact")
        return {}
    problems = validate_metadata(meta)
    if problems:
        raise UploadRejected("invalid metadata: " + "; ".join(problems))
    try:
        actual = weights_hash(model)
    except ValueError as exc:  # _check_tensors decodes every tensor first; kept as a refusal
        raise UploadRejected(f"weights unreadable: {exc}") from None
    if actual != meta["weights_sha256"]:
        raise UploadRejected(
            f"weights hash mismatch: metadata says {meta['weights_sha256'][:12]}..., "
            f"weights hash to {actual[:12]}... (file altered or corrupted)"
        )
    problems = contract_problems(model, meta)
    if problems:
        raise UploadRejected("graph does not match its metadata: " + "; ".join(problems))
    return meta


def _session(data: bytes) -> ort.InferenceSession:
    try:
        return ort.InferenceSession(
            data, sess_options=session_options(), providers=["CPUExecutionProvider"]
        )
    except Exception as exc:
        raise UploadRejected(f"onnxruntime cannot load the model: {_first_line(exc)}") from None
