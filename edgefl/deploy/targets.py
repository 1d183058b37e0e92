"""Deployment targets: one entry per device runtime, each building its files in a staging folder.

- ``onnx``: the plain fixed-batch graph (exporters.plain), optionally static QDQ int8.
- ``ort-mobile``: the same in ORT format (onnxruntime.tools), with the mobile usability checker's
  verdict for NNAPI and CoreML.
- ``tflite-micro``: a full-integer int8 .tflite converted by onnx2tf from the plain graph, a C
  array of it for firmware, and the arena TFLite Micro's own interpreter needs (bisection).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

import exporters
from edgefl.deploy import measure
from edgefl.deploy.describe import deployed_metadata, doc_string, shipped_weights, version_number
from edgefl.errors import ArtifactError, BudgetError
from edgefl.models.cost import ORT_FLOOR_BYTES
from exporters.plain import fold_batchnorm, plain_graph

if TYPE_CHECKING:
    from edgefl.deploy import Plan


@dataclass
class Built:
    """What a target made in the staging folder, and what it measured there."""

    files: list[tuple[Path, str]] = field(default_factory=list)  # (path, what it is)
    outputs: np.ndarray | None = None  # on the eval inputs, logits
    runtime: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    runtime: str
    build: Callable[[Plan, Path, Callable[[str], None]], Built]
    # Modules the target imports, and the command that installs them.
    needs: tuple[str, ...] = ()
    install: str = ""
    always_int8: bool = False
    # Peak memory the runtime adds beyond the model's own tensors (None: unknown).
    runtime_floor_bytes: int | None = None

    def missing(self) -> list[str]:
        return [m for m in self.needs if importlib.util.find_spec(m) is None]


def _plain(plan: Plan) -> onnx.ModelProto:
    try:
        model, _ = plain_graph(plan.artifact.model, batch=1)
        fold_batchnorm(model)
    except exporters.ExportError as exc:
        raise ArtifactError(
            f"{plan.source_name}: cannot make a plain graph: {exc}",
            hint="deploy a model edgefl wrote (a global model or a classifier upload)",
        ) from None
    return model


def _stamp(model: onnx.ModelProto, plan: Plan, quantization: dict | None, extra: dict) -> dict:
    costs = shipped_weights(model) | plan.cost_estimate | extra
    meta = deployed_metadata(
        plan.artifact.metadata,
        target=plan.target.name,
        profile=plan.profile_summary,
        dataset=plan.dataset,
        quantization=quantization,
        costs=costs,
    )
    meta["weights_sha256"] = exporters.weights_hash(model)
    exporters.set_metadata(model, meta)
    model.doc_string = doc_string(meta)
    model.model_version = version_number(plan.artifact.metadata)
    model.producer_name = "edgefl deploy"
    return meta


class _Calibration:
    """onnxruntime's CalibrationDataReader protocol over the calibration samples, one at a time."""

    def __init__(self, name: str, x: np.ndarray):
        self._items = iter([{name: x[i : i + 1]} for i in range(len(x))])

    def get_next(self):
        return next(self._items, None)

    def rewind(self):  # pragma: no cover - called only by some calibrators
        pass


def _static_int8(model: onnx.ModelProto, plan: Plan, tmp: Path) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    src, dst = tmp / "fp32.onnx", tmp / "int8.onnx"
    onnx.save(model, src)
    name = model.graph.input[0].name
    try:
        with contextlib.redirect_stdout(io.StringIO()), _quiet_logs():
            quantize_static(
                src,
                dst,
                _Calibration(name, plan.calibration),
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                activation_type=QuantType.QInt8,
                weight_type=QuantType.QInt8,
            )
    except Exception as exc:
        raise ArtifactError(
            f"static int8 quantization failed: {exc}",
            hint="ship fp32 (leave --quantize out), or calibrate on the model's own data",
        ) from None
    return onnx.load(dst)


@contextlib.contextmanager
def _quiet_logs():
    """onnxruntime's tools log INFO lines through their own handlers: off while they run."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _onnx_model(plan: Plan, tmp: Path) -> tuple[onnx.ModelProto, dict | None]:
    model = _plain(plan)
    if plan.quantize != "int8":
        return model, None
    q = _static_int8(model, plan, tmp)
    return q, {
        "scheme": "static QDQ int8 (onnxruntime quantize_static, per-channel weights)",
        "calibration": plan.calibrate_ref,
        "calibration_samples": len(plan.calibration),
    }


def _ort_measures(path: Path, plan: Plan, built: Built, status) -> None:
    status(f"measuring {path.name} in onnxruntime")
    built.runtime["memory_bytes"] = measure.ort_resident_increase(path)
    built.runtime["memory_what"] = "onnxruntime resident increase (load + one inference)"
    x = plan.eval_x if plan.eval_x is not None else plan.probe_x
    outputs, seconds = measure.ort_outputs(path, x)
    built.runtime["latency_ms_per_sample"] = 1000 * seconds
    built.outputs = outputs


def build_onnx(plan: Plan, stage: Path, status) -> Built:
    status("plain fixed-batch graph" + (", static int8" if plan.quantize == "int8" else ""))
    with tempfile.TemporaryDirectory(prefix="edgefl-deploy-") as tmp:
        model, quant = _onnx_model(plan, Path(tmp))
    _stamp(model, plan, quant, {})
    path = stage / f"{plan.base}.onnx"
    onnx.save(model, path)
    built = Built(files=[(path, "ONNX model, batch 1")])
    _ort_measures(path, plan, built, status)
    return built


def mobile_verdict(path: Path) -> dict:
    """onnxruntime's mobile usability checker, per execution provider: supported nodes, verdict."""
    from onnxruntime.tools.mobile_helpers import usability_checker as uc
    from onnxruntime.tools.onnx_model_utils import ModelProtoWithShapeInfo

    model = ModelProtoWithShapeInfo(path).model_with_shape_info
    checks = {
        "NNAPI": lambda m: uc.check_nnapi_partitions(m, True),
        "CoreML": lambda m: uc.check_coreml_partitions(
            m, True, "coreml_supported_mlprogram_ops.md"
        ),
    }
    out = {}
    for ep, check in checks.items():
        info = check(model)
        out[ep] = {
            "supported_nodes": info.num_supported_nodes,
            "nodes": info.num_nodes,
            "partitions": info.num_partitions,
            "verdict": info.suitability().name,
        }
    return out


def build_ort_mobile(plan: Plan, stage: Path, status) -> Built:
    from onnxruntime.tools.convert_onnx_models_to_ort import (
        OptimizationStyle,
        convert_onnx_models_to_ort,
    )

    status("plain fixed-batch graph" + (", static int8" if plan.quantize == "int8" else ""))
    with tempfile.TemporaryDirectory(prefix="edgefl-deploy-") as tmp:
        model, quant = _onnx_model(plan, Path(tmp))
        meta = _stamp(model, plan, quant, {})
        src = Path(tmp, "onnx", f"{plan.base}.onnx")
        src.parent.mkdir()
        onnx.save(model, src)
        status("mobile usability check (NNAPI, CoreML)")
        verdict = mobile_verdict(src)
        status("converting to ORT format")
        out_dir = Path(tmp, "ort")
        try:
            with contextlib.redirect_stdout(io.StringIO()), _quiet_logs():
                # Runtime style: the form onnxruntime recommends where NNAPI/CoreML may run it.
                convert_onnx_models_to_ort(src, out_dir, [OptimizationStyle.Runtime])
        except Exception as exc:
            raise ArtifactError(
                f"ORT format conversion failed: {exc}",
                hint="deploy with --target onnx (onnxruntime runs it as it is)",
            ) from None
        made = sorted(out_dir.glob("*.ort"))
        if not made:
            raise ArtifactError(
                "ORT format conversion wrote no .ort file",
                hint="deploy with --target onnx (onnxruntime runs it as it is)",
            )
        path = stage / f"{plan.base}.ort"
        shutil.move(made[0], path)
    # An .ort file holds no metadata onnxruntime's tools let us read back: the record beside it
    # says what it was deployed from (what a rerun's overwrite check reads).
    meta["files"] = {"ort": path.name}
    sidecar = stage / f"{plan.base}.json"
    sidecar.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    built = Built(files=[(path, "ORT format model, batch 1"), (sidecar, "metadata sidecar (JSON)")])
    built.runtime["mobile_usability"] = verdict
    _ort_measures(path, plan, built, status)
    return built


def _nhwc(x: np.ndarray) -> np.ndarray:
    """onnx2tf's TFLite inputs are channels-last: (N, C, ...) -> (N, ..., C)."""
    return np.moveaxis(x, 1, -1) if x.ndim >= 3 else x


def c_array(data: bytes, name: str) -> tuple[str, str]:
    """(.h, .cc) text holding `data` as an aligned const array for firmware."""
    header = (
        f"// Generated by edgefl deploy: the model flatbuffer for TFLite Micro.\n#pragma once\n"
        f"#include <cstddef>\n\nextern const unsigned char {name}[];\n"
        f"extern const size_t {name}_len;\n"
    )
    rows = [", ".join(f"0x{b:02x}" for b in data[i : i + 12]) for i in range(0, len(data), 12)]
    body = ",\n  ".join(rows)
    source = (
        f'#include "{name}.h"\n\n// 16-byte aligned: TFLite Micro reads tensors in place.\n'
        f"alignas(16) const unsigned char {name}[] = {{\n  {body}\n}};\n"
        f"const size_t {name}_len = {len(data)};\n"
    )
    return header, source


def build_tflite_micro(plan: Plan, stage: Path, status) -> Built:
    path = _convert_tflite(plan, stage, status)
    flash = path.stat().st_size
    limit = plan.profile.ram_budget_bytes
    status(f"measuring the TFLite Micro arena (bisection up to {limit:,} bytes)")
    arena = measure.min_arena(path, limit)
    if arena is None:
        _check_tflm_runs(plan, path)
    _check_tflm_budget(plan, arena, flash)
    built = Built()
    x = plan.eval_x if plan.eval_x is not None else plan.probe_x
    status(f"running {len(x)} samples in TFLite Micro")
    outputs, figures = measure.tflm_run(path, arena, _nhwc(x))
    built.outputs = outputs
    split = measure.tflm_split(path, arena)
    if split:  # activations (head) and what persists (tail), as the allocator reports them
        built.runtime["arena_split"] = {"activations": split["head"], "persistent": split["tail"]}
    built.runtime.update(
        {
            "memory_bytes": arena,
            "memory_what": "TFLite Micro arena (minimum, found by bisection)",
            "flash_bytes": flash,
            "latency_ms_per_sample": 1000 * figures["seconds_per_sample"],
            "latency_what": "TFLite Micro reference kernels on this machine's CPU",
        }
    )
    h_path, cc_path = _write_c_array(path, plan, stage)
    costs = plan.cost_estimate | {
        "flash_bytes": flash,
        "arena_bytes": arena,
        "weight_dtype": "int8",
    }
    meta = deployed_metadata(
        plan.artifact.metadata,
        target=plan.target.name,
        profile=plan.profile_summary,
        dataset=plan.dataset,
        quantization=_tflite_quantization(plan, figures),
        costs=costs,
        layout="NHWC (channels last)",
    )
    meta["doc_string"] = doc_string(meta)
    meta["model_version"] = version_number(plan.artifact.metadata)
    meta["files"] = {"tflite": path.name, "c_source": cc_path.name, "c_header": h_path.name}
    sidecar = stage / f"{plan.base}.json"
    sidecar.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    built.files = [
        (path, "full-integer int8 TFLite flatbuffer"),
        (cc_path, "C array (firmware)"),
        (h_path, "C header"),
        (sidecar, "metadata sidecar (JSON)"),
    ]
    return built


def _convert_tflite(plan: Plan, stage: Path, status) -> Path:
    """The plain graph as a full-integer int8 .tflite in `stage` (onnx2tf, in a child)."""
    model = _plain(plan)
    with tempfile.TemporaryDirectory(prefix="edgefl-tflite-") as tmp:
        src = Path(tmp, "model.onnx")
        # onnx2tf rewrites its input file in place: it gets a copy, without our metadata.
        del model.metadata_props[:]
        onnx.save(model, src)
        calib = Path(tmp, "calib.npy")
        np.save(calib, _nhwc(plan.calibration))
        status(
            f"converting to full-integer int8 TFLite (onnx2tf, {len(plan.calibration)} "
            "calibration samples)"
        )
        args = ("onnx2tf", str(src), str(Path(tmp, "tf")), str(calib))
        result, said = measure.child(*args)
        if not result or not result.get("ok"):
            said = said or json.dumps(result)  # a run that ended but made no file
            raise ArtifactError(
                f"onnx2tf could not convert {plan.source_name}: {said}",
                hint="deploy with --target onnx, or a zoo model TFLite Micro runs (edgefl models)",
            )
        path = stage / f"{plan.base}.tflite"
        shutil.copyfile(result["tflite"], path)
    return path


# An interpreter that fails at every arena up to the profile's RAM may lack an op, not memory:
# one try at this size tells the two apart (a probabilities ensemble failed at every size up to
# 256 MiB while the logits' ensemble of the same members ran in 21,552 bytes).
TFLM_PROBE_ARENA = 256 * 2**20


def _check_tflm_runs(plan: Plan, path: Path) -> None:
    """ArtifactError, with the interpreter's own words, if TFLite Micro cannot run `path` even
    with TFLM_PROBE_ARENA bytes: then no arena is what it lacks."""
    if plan.profile.ram_budget_bytes >= TFLM_PROBE_ARENA:
        return
    said = measure.tflm_try(path, TFLM_PROBE_ARENA)
    if said is None:
        return
    raise ArtifactError(
        f"TFLite Micro cannot run {plan.source_name} as full-integer int8 TFLite with any arena "
        f"(tried up to {TFLM_PROBE_ARENA:,} bytes; the interpreter said: {said}); the file's "
        f"ops: {', '.join(measure.tflite_ops(path))}",
        hint="one of those ops (or its int8 form) is one TFLite Micro's interpreter lacks: "
        "deploy the model to onnx or ort-mobile, or distil it into a zoo classifier for the "
        f"band (`edgefl server fuse UPLOADS --method METHOD --for {plan.profile.name}`)",
    )


def _check_tflm_budget(plan: Plan, arena: int | None, flash: int) -> None:
    """BudgetError unless the measured arena fits the profile's RAM and the file its storage."""
    limit = plan.profile.ram_budget_bytes
    if arena is None or arena > limit or flash > plan.profile.storage_bytes:
        need = f"more than {limit:,}" if arena is None else f"{arena:,}"
        raise BudgetError(
            f"{plan.source_name} as full-integer int8 TFLite needs a {need}-byte arena and "
            f"{flash:,} bytes of flash; {plan.profile.name} allows {limit:,} bytes of RAM and "
            f"{plan.profile.storage_bytes:,} of storage (measured with TFLite Micro)",
            hint="deploy a smaller model (`edgefl models --profile "
            f"{plan.profile.name}` lists what fits) or choose a larger --profile",
        )


def _write_c_array(path: Path, plan: Plan, stage: Path) -> tuple[Path, Path]:
    """The .tflite as C source for firmware in `stage`: (.h path, .cc path)."""
    name = re.sub(r"\W", "_", plan.base)
    if not re.match(r"[A-Za-z_]", name):
        name = f"model_{name}"
    header, source = c_array(path.read_bytes(), name)
    h_path, cc_path = stage / f"{name}.h", stage / f"{name}.cc"
    h_path.write_text(header)
    cc_path.write_text(source)
    return h_path, cc_path


def _tflite_quantization(plan: Plan, figures: dict) -> dict:
    """The deployed metadata's quantization record, with the int8 tensors' scales."""
    return {
        "scheme": "full-integer int8 (onnx2tf + TFLite converter, per-channel weights)",
        "calibration": plan.calibrate_ref,
        "calibration_samples": len(plan.calibration),
        "input": {
            "dtype": "int8",
            "scale": figures["input_scale"],
            "zero_point": figures["input_zero_point"],
            "shape": figures["input_shape"],
        },
        "output": {
            "dtype": "int8",
            "scale": figures["output_scale"],
            "zero_point": figures["output_zero_point"],
        },
    }


_TFLITE_NEEDS = ("onnx2tf", "tensorflow", "tf_keras", "tflite_micro")
TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "onnx",
            "plain ONNX graph, batch fixed to 1 (any ONNX runtime)",
            "onnxruntime",
            build_onnx,
            runtime_floor_bytes=ORT_FLOOR_BYTES,
        ),
        Target(
            "ort-mobile",
            "ORT format for onnxruntime mobile (phones: CPU, NNAPI, CoreML)",
            "onnxruntime",
            build_ort_mobile,
            runtime_floor_bytes=ORT_FLOOR_BYTES,
        ),
        Target(
            "tflite-micro",
            "full-integer int8 TFLite + C array for microcontrollers",
            "TFLite Micro",
            build_tflite_micro,
            needs=_TFLITE_NEEDS,
            install='pip install "edgefl[deploy]"',
            always_int8=True,
        ),
    )
}
