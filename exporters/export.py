"""torch module -> one self-contained, self-describing, parity-checked ONNX file."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnxruntime as ort

from . import graph_cache
from ._quiet import one_line, quiet
from .atomic import write_model_atomic
from .errors import ExportError
from .graph import contract_problems, weights_hash
from .read import session_options, set_metadata
from .schema import SCHEMA_VERSION, validate_metadata

if TYPE_CHECKING:
    import torch

MIN_OPSET = 18
# onnxruntime 1.31 loads IR <= 13 but older runtimes on devices stop earlier; torch 2.13 emits 10.
MAX_IR_VERSION = 10
# One ONNX file is one protobuf message, which ends at 2 GiB; exports keep the weights inline.
MAX_INLINE_BYTES = 2**31 - 1
_PARITY_BATCHES = (1, 5)


@dataclass(frozen=True)
class ExportReport:
    path: str
    size_bytes: int
    max_abs_diff: float
    opset: int
    ir_version: int
    seconds: float


def export_onnx(
    module: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    path: str | os.PathLike[str],
    *,
    input_names: list[str],
    output_names: list[str],
    metadata: dict[str, Any],
    opset: int = MIN_OPSET,
    atol: float = 1e-4,
    parity_trials: int = 3,
    sample_inputs: Callable[[int], tuple[torch.Tensor, ...]] | None = None,
) -> ExportReport:
    """Export ``module`` with a dynamic batch axis, stamp metadata, check parity, write atomically.

    Nothing is written unless the metadata is valid, the graph matches it, and onnxruntime agrees
    with torch within ``atol`` on ``parity_trials`` random batches.
    """
    start = time.perf_counter()
    example_inputs = tuple(example_inputs)
    if opset < MIN_OPSET:
        raise ExportError(f"opset {opset} is too old; edgefl artifacts need opset >= {MIN_OPSET}")
    if len(input_names) != len(example_inputs):
        raise ExportError(
            f"{len(input_names)} input_names for {len(example_inputs)} example inputs"
        )

    was_training = module.training
    module.eval()
    try:
        model, max_diff = _sealed(
            module,
            (example_inputs, input_names, output_names, opset),
            metadata,
            lambda data: _parity(
                module, data, example_inputs, input_names, parity_trials, sample_inputs
            ),
            atol,
        )
        if not max_diff <= atol:  # also catches NaN
            raise ExportError(
                f"onnxruntime and torch disagree: max difference {max_diff:.3g} (relative to "
                f"the sample's largest value above 1) > atol {atol:g}"
                " (the module may behave differently when traced)"
            )
    finally:
        module.train(was_training)

    target = write_model_atomic(model, path)
    return ExportReport(
        path=str(target),
        size_bytes=target.stat().st_size,
        max_abs_diff=float(max_diff),
        opset=opset,
        ir_version=model.ir_version,
        seconds=time.perf_counter() - start,
    )


def _sealed(module, graph_args: tuple, metadata: dict, parity, atol: float):
    """(model with its metadata sealed, parity difference). From the graph kept for the
    module's structure when there is one and it passes `parity`, else traced (and kept)."""
    key = _structure_key(module, *graph_args)
    kept = _TEMPLATES.get(key) if key is not None else None
    # The disk's key (it hashes source files) only where the disk is read or written.
    disk = _disk_key(key, module) if kept is None else None
    if kept is None and disk is not None:
        kept = _kept_on_disk(key, disk)
    for from_template in (True, False) if kept is not None else (False,):
        if from_template:
            model = _from_template(key, kept, module)
        else:
            model = _torch_to_onnx(module, *graph_args)
            _keep_template(key, model, module, disk)
        seal_metadata(model, metadata, "graph")
        max_diff = parity(model.SerializeToString())
        if max_diff <= atol or not from_template:
            break
        disk = disk or _disk_key(key, module)  # a graph read from disk earlier in the process
        _TEMPLATES.pop(key, None)  # not seen yet; the exporter's own graph decides
        _REFUSED.add(key)
        if disk is not None:
            graph_cache.forget(disk)
    return model, max_diff


def _disk_key(key: str | None, module) -> str | None:
    """`key`'s name on disk (`graph_cache.disk_key`); None where nothing is kept there: no
    structure key, a refused one, templates off, or the cache disabled."""
    if key is None or key in _REFUSED or _TEMPLATES_MAX <= 0 or graph_cache.folder() is None:
        return None
    return graph_cache.disk_key(key, module)


def _kept_on_disk(key: str, disk: str) -> _Template | None:
    """The graph an earlier process kept on disk (`graph_cache`) under `disk`, now also kept in
    this process for `key`; None when none was kept."""
    found = graph_cache.load(disk)
    if found is None:
        return None
    _TEMPLATES[key] = template = _Template(*found)
    while len(_TEMPLATES) > _TEMPLATES_MAX:
        _TEMPLATES.popitem(last=False)
    return template


def seal_metadata(model, metadata: dict, what: str) -> dict:
    """Stamp schema version and weights hash, refuse metadata that fails the schema or does not
    match the model (`what` names the model's content in the message), attach it; return it."""
    meta = copy.deepcopy(metadata)
    meta["schema_version"] = SCHEMA_VERSION
    meta["weights_sha256"] = weights_hash(model)
    problems = validate_metadata(meta)
    if problems:
        raise ExportError("invalid metadata: " + "; ".join(problems))
    problems = contract_problems(model, meta)
    if problems:
        raise ExportError(f"{what} does not match its metadata: " + "; ".join(problems))
    try:
        set_metadata(model, meta)
    except (TypeError, ValueError) as exc:
        raise ExportError(f"metadata is not JSON-serializable: {exc}") from exc
    return meta


@functools.cache
def _reuse_torchlib_registry() -> None:
    """torch's ONNX exporter rebuilds its operator registry from torchlib on every export, about
    0.5 s of a small model's 0.7 (parsing ~500 functions' Python source). Installed once per
    process (cached), this builds it once per opset and gives each export its own copy of the
    tables (cheap: the entries are shared, the lists are not), so a registration made during
    one export cannot leak into the next."""
    from torch.onnx._internal.exporter import _constants
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    build = ONNXRegistry.from_torchlib.__func__

    @functools.cache
    def built(cls, opset):
        with _torchlib_listed_without_parsing():
            return build(cls, opset_version=opset)

    def fresh_copy(cls, opset_version=None):
        base = built(cls, opset_version or _constants.TORCHLIB_OPSET)
        fresh = cls.__new__(cls)
        fresh.__dict__.update(base.__dict__)
        fresh.functions = {k: list(v) for k, v in base.functions.items()}
        return fresh

    ONNXRegistry.from_torchlib = classmethod(fresh_copy)


def torchlib_functions() -> list:
    """torchlib's functions as onnxscript lists them for torch's registry build, without parsing
    each one's Python source for its domain (~0.45 s a process for ~560 functions; the build
    does not use it): the domain is the function's opset's, equal for every one (checked in
    tests/wire/test_export_registry.py)."""
    from onnxscript._framework_apis.torch_2_5 import _OnnxFunctionMeta
    from onnxscript.function_libs.torch_lib import ops, registration  # noqa: F401 registers

    metas = []
    for name, funcs in registration.default_registry.items():
        if name.startswith("internal::"):  # onnxscript's own helpers, not ATen operators
            continue
        for is_complex, group in ((False, funcs.overloads), (True, funcs.complex)):
            metas += [_OnnxFunctionMeta(name, f, f.opset.domain, f.name, is_complex) for f in group]
    return metas


@contextlib.contextmanager
def _torchlib_listed_without_parsing():
    """`torchlib_functions` in onnxscript's place while torch builds its registry, only then."""
    from onnxscript._framework_apis import torch_2_5
    from torch.onnx._internal._lazy_import import onnxscript_apis

    original = getattr(onnxscript_apis, "get_torchlib_ops", None)  # imports it if lazy
    module = getattr(onnxscript_apis, "_module", None) or onnxscript_apis
    if original is not torch_2_5.get_torchlib_ops:  # another onnxscript: left as it is
        yield
        return
    module.get_torchlib_ops = torchlib_functions
    try:
        yield
    finally:
        module.get_torchlib_ops = original


@dataclass(frozen=True)
class _Template:
    model: onnx.ModelProto  # the exported graph; the initializers named in `weights` hold no data
    weights: tuple[tuple[int, str], ...]  # (initializer index, parameter or buffer name)


# Exported graphs by module structure (`_structure_key`): a module built like one exported
# before in this process gets that graph with its own weights (`_from_template`) instead of a
# new trace: a small model's export 0.5 s -> 0.01 s (bench/results/export_template.md; a
# simulate exports one architecture per client, a server one per method). Every export is
# still parity-checked; a template whose graph fails it is dropped and the module exported
# afresh. A template holds no weights.
_TEMPLATES: OrderedDict[str, _Template] = OrderedDict()
_TEMPLATES_MAX = 16
_REFUSED: set[str] = set()  # keys whose template once failed the parity check: none again
_WEIGHT_FIELDS = {"name", "data_type", "dims", "raw_data"}


class _NotPlain(Exception):
    """A module attribute whose value the structure key cannot state exactly."""


def _plain(value, digest) -> None:
    """Feed `value` to `digest` exactly (arrays by their bytes), or raise _NotPlain: a graph
    may depend on any attribute a forward reads, so only values known whole are keyed."""
    import torch

    if value is None or isinstance(value, bool | int | float | str | bytes | torch.dtype):
        digest.update(f"{type(value).__name__}:{value!r};".encode())
    elif isinstance(value, torch.Tensor | np.ndarray):
        try:
            arr = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
        except TypeError:  # a dtype numpy has no type for (bfloat16)
            raise _NotPlain(str(value.dtype)) from None
        digest.update(f"array:{arr.dtype}:{arr.shape};".encode())
        digest.update(np.ascontiguousarray(arr).tobytes())
    elif isinstance(value, list | tuple | set | frozenset | dict):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset | dict) else value
        digest.update(f"{type(value).__name__}[{len(items)}](".encode())
        for item in items:
            _plain(item, digest)
            if isinstance(value, dict):
                _plain(value[item], digest)
        digest.update(b")")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        digest.update(f"{type(value).__module__}.{type(value).__qualname__}".encode())
        _plain({f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, digest)
    else:
        raise _NotPlain(type(value).__qualname__)


def _structure_key(module, example_inputs, input_names, output_names, opset) -> str | None:
    """What an exported graph depends on besides its weights' values: each submodule's class
    and attributes (parameters' and buffers' names, shapes and dtypes; any other value whole),
    the inputs' shapes and dtypes, the names and the opset. None (no template) for a module
    with a forward hook or an attribute that is not plain data."""
    digest = hashlib.sha256()
    _plain((list(input_names), list(output_names), opset), digest)
    _plain([(tuple(x.shape), x.dtype) for x in example_inputs], digest)
    try:
        for name, sub in module.named_modules():
            cls = type(sub)
            digest.update(f"module {name} {cls.__module__}.{cls.__qualname__};".encode())
            for attr, value in sorted(vars(sub).items()):
                if attr in ("_parameters", "_buffers"):
                    shapes = {
                        k: t if t is None else (tuple(t.shape), t.dtype) for k, t in value.items()
                    }
                    _plain((attr, shapes), digest)
                elif attr == "_modules":
                    _plain(list(value), digest)
                elif "hook" in attr:
                    if value and "forward" in attr:
                        return None  # a forward hook may change what is traced
                else:
                    _plain((attr, value), digest)
    except _NotPlain:
        return None
    return digest.hexdigest()


def _keep_template(key: str | None, model: onnx.ModelProto, module, disk: str | None) -> None:
    """Keep `model`'s graph for `key` when each of its initializers is either a parameter's
    or buffer's exact value, stored raw (a weight, filled in per export), or named after none
    (a constant); otherwise keep nothing; and on disk under `disk` (None: not). Built field by
    field: a copy of the model would hold its weights' memory for as long as the template
    lives."""
    if key is None or key in _REFUSED or _TEMPLATES_MAX <= 0:
        return
    state = _tensors(module)
    graph = onnx.GraphProto()
    weights = []
    for i, tensor in enumerate(model.graph.initializer):
        if tensor.name not in state:
            graph.initializer.append(tensor)
            continue
        try:
            value = _raw(state[tensor.name])
            data_type = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
        except (TypeError, KeyError, ValueError):  # a dtype numpy or ONNX has no type for
            return
        if (
            data_type != tensor.data_type
            or {f.name for f, _ in tensor.ListFields()} != _WEIGHT_FIELDS
            or tuple(tensor.dims) != value.shape
            or tensor.raw_data != value.tobytes()
        ):
            return  # stored otherwise, or a value computed from the weights: export each time
        graph.initializer.add(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
        weights.append((i, tensor.name))
    _copy_fields(model.graph, graph, skip="initializer")
    template = onnx.ModelProto(graph=graph)
    _copy_fields(model, template, skip="graph")
    _TEMPLATES[key] = _Template(template, tuple(weights))
    while len(_TEMPLATES) > _TEMPLATES_MAX:
        _TEMPLATES.popitem(last=False)
    if disk is not None:  # for the next process: it skips torch.export's imports and trace
        graph_cache.store(disk, template, tuple(weights))


def _copy_fields(src, dst, skip: str) -> None:
    for field, value in src.ListFields():
        if field.name == skip:
            continue
        if isinstance(value, bool | int | float | str | bytes):
            setattr(dst, field.name, value)
        elif hasattr(value, "CopyFrom"):  # a message
            getattr(dst, field.name).CopyFrom(value)
        else:  # a repeated field
            getattr(dst, field.name).extend(value)


def _tensors(module) -> dict:
    """Every parameter and buffer (non-persistent and shared ones too) by each of its names."""
    named = (
        *module.named_parameters(remove_duplicate=False),
        *module.named_buffers(remove_duplicate=False),
    )
    return dict(named)


def _raw(tensor) -> np.ndarray:
    """A parameter's or buffer's values as the exporter stores them: contiguous, little-endian."""
    value = tensor.detach().cpu().numpy()
    return np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))


def _from_template(key: str, template: _Template, module) -> onnx.ModelProto:
    with contextlib.suppress(KeyError):  # another thread's export may have dropped it
        _TEMPLATES.move_to_end(key)
    state = _tensors(module)
    model = onnx.ModelProto()
    model.CopyFrom(template.model)
    for i, name in template.weights:
        model.graph.initializer[i].raw_data = _raw(state[name]).tobytes()
    return model


def _torch_to_onnx(
    module: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    input_names: Sequence[str],
    output_names: Sequence[str],
    opset: int,
) -> onnx.ModelProto:
    import torch  # lazily: the server imports exporters to validate and never needs torch

    # The dynamo exporter (the default) handled every layer type we ship, including adaptive
    # pooling to non-divisor sizes that the legacy TorchScript exporter refuses, so no fallback.
    # optimize=False: the optimizer folds BatchNorm into the preceding Conv yet keeps the name
    # "conv.weight" on the fused values, silently breaking load-by-name on the server.
    # f=None returns the program in memory; the file is written once, atomically, by us, always
    # with weights inline (the equivalent of external_data=False).
    _reuse_torchlib_registry()
    batch = torch.export.Dim("batch")
    try:
        with quiet(), torch.no_grad():
            program = torch.onnx.export(
                module,
                example_inputs,
                None,
                input_names=list(input_names),
                output_names=list(output_names),
                opset_version=opset,
                dynamic_shapes=tuple({0: batch} for _ in example_inputs),
                external_data=False,
                optimize=False,
                verbose=False,
                dynamo=True,
            )
    except Exception as exc:
        raise ExportError(
            f"ONNX export of {type(module).__name__} failed: {one_line(exc)}"
        ) from exc
    model = program.model_proto
    strip_debug_records(model)
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION
    got_in = [v.name for v in model.graph.input]
    got_out = [v.name for v in model.graph.output]
    if got_in != list(input_names) or got_out != list(output_names):
        # e.g. a pass-through module whose output IS its input gets a single merged name.
        raise ExportError(
            f"exported graph has inputs {got_in} and outputs {got_out}, "
            f"expected {list(input_names)} and {list(output_names)}"
        )
    return model


def strip_debug_records(model: onnx.ModelProto) -> None:
    """Drop the exporter's debugging records on nodes and tensors (torch 2.13 writes each node's
    Python stack trace, module path and FX node). They would leave the device in every upload:
    the exporting machine's file paths (its user and install folders), about 1 KB a node (a
    third of a small CNN's file), and a size that depends on where edgefl is installed. Names,
    shapes and the model's own metadata stay."""
    graphs = [model.graph, *(f for f in model.functions)]
    for graph in graphs:
        for node in graph.node:
            del node.metadata_props[:]
    g = model.graph
    for value in (*g.value_info, *g.input, *g.output, *g.initializer):
        del value.metadata_props[:]


def _parity(
    module: torch.nn.Module,
    data: bytes,
    example_inputs: tuple[torch.Tensor, ...],
    input_names: Sequence[str],
    trials: int,
    sample_inputs: Callable[[int], tuple[torch.Tensor, ...]] | None,
) -> float:
    import torch

    session = ort.InferenceSession(
        data, sess_options=session_options(), providers=["CPUExecutionProvider"]
    )
    # A private generator: the check must not shift the caller's global RNG stream.
    generator = torch.Generator().manual_seed(0)
    worst = 0.0
    for trial in range(trials):
        batch = _PARITY_BATCHES[trial % len(_PARITY_BATCHES)]
        if sample_inputs is not None:
            inputs = tuple(sample_inputs(batch))
        else:
            inputs = tuple(
                torch.randn((batch, *x.shape[1:]), generator=generator, dtype=x.dtype)
                for x in example_inputs
            )
        with torch.no_grad():
            expected = module(*inputs)
        expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
        if len(inputs) != len(input_names) or len(expected) != len(session.get_outputs()):
            raise ExportError(
                f"parity check: got {len(inputs)} inputs / {len(expected)} torch outputs for a "
                f"graph with {len(input_names)} inputs / {len(session.get_outputs())} outputs"
            )
        feed = {n: x.detach().cpu().numpy() for n, x in zip(input_names, inputs, strict=True)}
        got = session.run(None, feed)
        for want, have in zip(expected, got, strict=True):
            worst = max(worst, max_relative_diff(want.detach().cpu().numpy(), have))
    return worst


def max_relative_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Max |a - b| over a's batch, each sample's difference relative to the largest |value| of
    that sample's `a` where it exceeds 1. float32 rounding grows with the values summed, and a
    small output can be the difference of large ones: a classifier trained at a large learning
    rate (DP-SGD's) gave 1e-3 logits 5.9e-4 apart beside 30-unit ones, and a global model's
    logits on random inputs reach the hundreds (1.2e-4 apart at ~500: 7 significant digits)."""
    if a.shape != b.shape:
        return float("inf")
    a64, b64 = np.atleast_1d(a).astype(np.float64), np.atleast_1d(b).astype(np.float64)
    if a64.size == 0:
        return 0.0
    both_nan = np.isnan(a64) & np.isnan(b64)
    largest = np.nanmax(np.abs(a64.reshape(len(a64), -1)), axis=1, initial=0.0)
    scale = np.maximum(1.0, largest).reshape((-1,) + (1,) * (a64.ndim - 1))
    diff = np.where(both_nan, 0.0, np.abs(a64 - b64) / scale)
    return float(np.where(np.isnan(diff), np.inf, diff).max())
