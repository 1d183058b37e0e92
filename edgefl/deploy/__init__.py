"""`edgefl deploy`: a classifier edgefl made -> the file a device class runs, proved to fit.

A pipeline of stages that return values: ``plan_deploy`` checks everything a user can get wrong
(the file, its kind, the target, the profile, the data, the cost model's estimate against the
budget) before any conversion starts; ``deploy`` builds the target's files in a staging folder
beside ``--out``, measures them in their runtime, and only then moves them into ``--out``.
"""

from __future__ import annotations

import glob
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import exporters
from edgefl.deploy import measure
from edgefl.deploy.report import DeployReport
from edgefl.deploy.targets import TARGETS, Target
from edgefl.errors import ArtifactError, BudgetError, ConfigError, UnknownNameError
from edgefl.evaluate import other_dataset, require_classifier, trained_on
from edgefl.outputs import lock_outputs
from edgefl.profiles import Profile, get_profile
from edgefl.progress import printable

__all__ = ["TARGETS", "DeployReport", "DeployRequest", "Plan", "deploy", "plan_deploy"]

QUANTIZE_CHOICES = ("int8",)
_PROBE_SAMPLES = 32


@dataclass(frozen=True)
class DeployRequest:
    model: str
    profile: str
    target: str
    out: str
    calibrate: str | None = None  # DATASET[:SPLIT]
    eval: str | None = None  # DATASET[:SPLIT]
    quantize: str | None = None  # None | "int8"
    data_dir: str | None = None
    calibrate_samples: int = 256
    eval_samples: int = 1000
    overwrite: bool = False  # replace files in `out` another command made (see _check_outputs)


@dataclass
class Plan:
    """Everything checked and loaded; no file written yet."""

    request: DeployRequest
    artifact: exporters.Artifact
    profile: Profile
    target: Target
    quantize: str | None
    dataset: str | None
    calibration: np.ndarray | None
    calibrate_ref: str | None
    eval_x: np.ndarray | None
    eval_y: np.ndarray | None
    eval_ref: str | None
    probe_x: np.ndarray
    cost_estimate: dict[str, Any]

    @property
    def source_name(self) -> str:
        return Path(self.request.model).name

    @property
    def base(self) -> str:
        """Output files' stem: the model's, with the profile's name once (a global model made
        for the class, `fedmho.wristband.onnx`, gives `fedmho.wristband.tflite`)."""
        stem = Path(self.request.model).stem
        suffix = f".{self.profile.name}"
        return stem if stem.endswith(suffix) else stem + suffix

    @property
    def profile_summary(self) -> dict[str, Any]:
        p = self.profile
        return {
            "name": p.name,
            "ram_budget_bytes": p.ram_budget_bytes,
            "storage_bytes": p.storage_bytes,
            "macs_per_second": p.macs_per_second,
        }


def _read_source(path: str) -> exporters.Artifact:
    if not Path(path).is_file():
        raise ArtifactError(f"model file {path} not found", hint="pass a .onnx file edgefl wrote")
    try:
        art = exporters.read_artifact(path)
    except Exception as exc:  # not ONNX, or no edgefl metadata
        raise ArtifactError(
            f"{path} is not an edgefl ONNX model ({exc})",
            hint="pass a classifier or global model edgefl wrote (.onnx)",
        ) from None
    require_classifier(art, path, "deploy", strict=True)
    return art


def _example(art: exporters.Artifact, flag: str) -> str:
    """`flag` with the model's own dataset (its metadata names it; a global model from before
    it did: the registered datasets of its input shape and classes)."""
    from edgefl.data import DATASETS

    split = "train" if flag == "--calibrate" else "test"
    name, meta = trained_on(art), art.metadata
    if name:
        return f"{flag} {printable(name)}:{split}"
    task = (tuple(meta["input_shape"]), int(meta["num_classes"]))
    fits = [d.name for d in DATASETS if (tuple(d.input_shape), d.num_classes) == task]
    return " or ".join(f"{flag} {n}:{split}" for n in fits) or f"{flag} DATASET:{split}"


def _load_split(ref: str, flag: str, art: exporters.Artifact, data_dir, limit: int, seed: int):
    from edgefl.data import load_dataset, parse_dataset_ref

    name, split = parse_dataset_ref(ref)
    own = other_dataset(art, name)
    if own:  # it would pass the shape check below: wrong int8 ranges, a meaningless accuracy
        raise ConfigError(
            f"{flag} {ref}: the model was trained on {printable(own)}, not {name}",
            hint=f"name the model's own data, e.g. {_example(art, flag)}",
        )
    # Calibration reads training data; accuracy is measured on the test split, as `eval` does
    # (a bare --eval DATASET scored the training split and did not say so).
    split = split or ("train" if flag == "--calibrate" else "test")
    data = load_dataset(name, split, data_dir=data_dir)
    meta = art.metadata
    want_shape, want_classes = tuple(meta["input_shape"]), int(meta["num_classes"])
    if tuple(data.x.shape[1:]) != want_shape or data.num_classes != want_classes:
        raise ConfigError(
            f"{flag} {ref}: samples of shape {tuple(data.x.shape[1:])} with {data.num_classes} "
            f"classes, but the model takes {want_shape} with {want_classes} classes",
            hint=f"name data of the model's own task, e.g. {_example(art, flag)}",
        )
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.permutation(len(data.x))[:limit])
    return data.x[idx].astype(np.float32), data.y[idx], name, f"{name}:{split}"


def _estimate(art: exporters.Artifact, int8: bool) -> dict[str, Any]:
    """The cost model's figures for the file as it will ship (int8 counted as int8)."""
    from edgefl.models.cost import costs
    from edgefl.models.spec import ModelSpec

    spec = art.metadata.get("spec")
    out: dict[str, Any] = {}
    if spec:
        try:
            c = costs(ModelSpec.from_dict(spec))
        except Exception:  # a spec this edgefl cannot build: count the file instead
            c = None
        if c is not None:
            width = 1 if int8 else 4
            activations = c.infer_peak_bytes // 4 - c.upload_params  # the largest step, in values
            out = {
                "macs": c.macs,
                "params": c.upload_params,
                "estimated_weight_bytes": width * c.upload_params,
                "estimated_activation_bytes": width * activations,
                "estimated_infer_peak_bytes": width * (c.upload_params + activations),
                "estimated_tflm_arena_bytes": c.tflm_arena_bytes,
            }
    if not out:
        params = sum(math.prod(t.dims) for t in art.model.graph.initializer)
        out = {"params": params, "estimated_weight_bytes": (1 if int8 else 4) * params}
    return out


def _check_fit(target: Target, profile: Profile, est: dict[str, Any]) -> None:
    weights = est["estimated_weight_bytes"]
    if weights > profile.storage_bytes:
        raise BudgetError(
            f"the model's weights take {weights:,} bytes as shipped; {profile.name} has "
            f"{profile.storage_bytes:,} bytes of storage (cost model)",
            hint="deploy a smaller model or choose a larger --profile",
        )
    if target.always_int8:  # weights stay in flash; the arena: activations + persistent data
        need = est.get("estimated_tflm_arena_bytes")
    else:
        need = est.get("estimated_infer_peak_bytes")
        if need is not None and target.runtime_floor_bytes:
            need += target.runtime_floor_bytes
    if need is not None and need > profile.ram_budget_bytes:
        floor = (
            f" including {target.runtime}'s own {target.runtime_floor_bytes / 2**20:.1f} MiB"
            if target.runtime_floor_bytes and not target.always_int8
            else ""
        )
        raise BudgetError(
            f"{target.name} needs about {need:,} bytes of RAM{floor}; {profile.name} allows "
            f"{profile.ram_budget_bytes:,} (cost model, before conversion)",
            hint="for a microcontroller use --target tflite-micro; else deploy a smaller model "
            f"(`edgefl models --profile {profile.name}`) or choose a larger --profile",
        )


def plan_deploy(req: DeployRequest) -> Plan:
    """Every check, in the order a user would fix them; nothing is converted or written."""
    target = _requested_target(req)
    quantize = "int8" if target.always_int8 else req.quantize
    art = _read_source(req.model)
    profile = get_profile(req.profile)
    missing = target.missing()
    if missing:
        raise ConfigError(
            f"--target {target.name} needs {', '.join(missing)}, not installed", hint=target.install
        )
    _check_out_folder(Path(req.out))
    calibration = calibrate_ref = None
    dataset = trained_on(art)
    if quantize == "int8":
        calibration, name = _calibration(req, target, art)
        calibrate_ref, dataset = req.calibrate, dataset or name
    eval_x = eval_y = eval_ref = None
    if req.eval:
        eval_x, eval_y, name, eval_ref = _load_split(
            req.eval, "--eval", art, req.data_dir, req.eval_samples, seed=1
        )
        dataset = dataset or name
    est = _estimate(art, quantize == "int8")
    _check_fit(target, profile, est)
    made = Plan(
        req,
        art,
        profile,
        target,
        quantize,
        dataset,
        calibration,
        calibrate_ref,
        eval_x,
        eval_y,
        eval_ref,  # with its split, named
        _probe(art, calibration),
        est,
    )
    _check_outputs(made)
    return made


def _requested_target(req: DeployRequest) -> Target:
    """The --target, once it and --quantize are known choices."""
    if req.target not in TARGETS:
        raise UnknownNameError("target", req.target, TARGETS)
    target = TARGETS[req.target]
    if req.quantize is not None and req.quantize not in QUANTIZE_CHOICES:
        raise ConfigError(
            f"--quantize {req.quantize}: not a choice",
            hint=f"--quantize {' or '.join(QUANTIZE_CHOICES)}, or leave it out",
        )
    if req.calibrate and not target.always_int8 and req.quantize != "int8":
        # fp32 needs no calibration: taking the flag silently would let a user believe the
        # file was quantized with their data
        raise ConfigError(
            f"--calibrate {req.calibrate}: --target {target.name} without --quantize int8 "
            "ships fp32, which is not calibrated",
            hint="add --quantize int8 to ship int8 calibrated on it, or leave --calibrate out",
        )
    return target


def _check_out_folder(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file", hint="name a folder, e.g. --out deploy")
    from edgefl.outputs import check_writable

    check_writable(out, "--out", "deploy", folder_ok=True)


def _calibration(
    req: DeployRequest, target: Target, art: exporters.Artifact
) -> tuple[np.ndarray, str]:
    """(the int8 calibration samples, their dataset's name), from --calibrate."""
    if not req.calibrate:
        raise ConfigError(
            f"--target {target.name}"
            + ("" if target.always_int8 else " --quantize int8")
            + " needs calibration data",
            hint="add --calibrate DATASET:SPLIT of the model's task, e.g. "
            + _example(art, "--calibrate"),
        )
    calibration, _, name, _ = _load_split(
        req.calibrate, "--calibrate", art, req.data_dir, req.calibrate_samples, seed=0
    )
    return calibration, name


def _probe(art: exporters.Artifact, calibration: np.ndarray | None) -> np.ndarray:
    """What a build runs without --eval: the first calibration samples, else seeded noise."""
    if calibration is not None:
        return calibration[:_PROBE_SAMPLES]
    shape = tuple(art.metadata["input_shape"])
    return np.random.default_rng(0).random((_PROBE_SAMPLES, *shape), dtype=np.float32)


def _check_outputs(plan: Plan) -> None:
    """Files of this deploy's name already in --out (`<model stem>.<profile>.*` and its C
    sources) are replaced only when they were deployed from the same model (the same weights,
    read from the file's own metadata or from the record beside it: the .json sidecar or the
    .onnx); anything else needs --overwrite. Checked before any conversion."""
    from edgefl.outputs import check_replace, describe_result, existing_result, replacing_error

    out, base = Path(plan.request.out), plan.base
    if plan.request.overwrite or not out.is_dir():
        return
    c_name = re.sub(r"\W", "_", base)
    names = {p.name for p in out.glob(glob.escape(base) + ".*")}
    names |= {
        f"{stem}{ext}"
        for stem in (c_name, f"model_{c_name}")
        for ext in (".h", ".cc")
        if (out / f"{stem}{ext}").exists()
    }
    records = [existing_result(out / f"{base}{ext}") for ext in (".json", ".onnx")]
    beside = next((r for r in records if r is not None), None)
    weights = plan.artifact.metadata.get("weights_sha256")

    def deployed_from_this(made: dict) -> bool:
        record = made if made.get("deployed") else beside
        return (
            bool(record and record.get("deployed"))
            and (record.get("source") or {}).get("weights_sha256") == weights
        )

    for name in sorted(names):
        path = out / name
        if path.suffix in (".json", ".onnx"):
            check_replace(path, "--out", False, deployed_from_this)
        elif not (beside and deployed_from_this(beside)):  # no record of its own: the one beside
            what = describe_result(beside) if beside else "a file no deploy record describes"
            raise replacing_error(path, "--out", what)


def _reference(art: exporters.Artifact, x: np.ndarray) -> np.ndarray:
    return np.concatenate([art.run(x[i : i + 256]) for i in range(0, len(x), 256)])


def deploy(req: DeployRequest, status: Callable[[str], None] | None = None) -> DeployReport:
    """Plan, build in a staging folder, measure, publish into ``req.out``; the report. --out
    is held from the check of what it holds to the publish: a second deploy there stops."""
    # in --out (one lock however it is spelt): this model's files there
    with lock_outputs([Path(req.out) / f"{Path(req.model).stem}.*"]):
        return _deploy(req, status or (lambda _msg: None))


def _deploy(req: DeployRequest, status: Callable[[str], None]) -> DeployReport:
    plan = plan_deploy(req)
    out = Path(req.out)
    parent = out.parent if out.parent != Path("") else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.deploy-", dir=parent))
    try:
        built = plan.target.build(plan, stage, status)
        x = plan.eval_x if plan.eval_x is not None else plan.probe_x
        status("comparing with the fp32 source model")
        reference = _reference(plan.artifact, x)
        agree = measure.agreement(
            built.outputs,
            reference,
            plan.eval_y if plan.eval_y is not None else reference.argmax(1),
        )
        published = _publish(stage, out, [p for p, _ in built.files])
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    files = [
        {"path": str(path), "what": what, "bytes": path.stat().st_size}
        for path, (_, what) in zip(published, built.files, strict=True)
    ]
    return DeployReport(
        model=req.model,
        target=plan.target.name,
        runtime=plan.target.runtime,
        profile=plan.profile_summary,
        quantization=plan.quantize,
        files=files,
        runtime_figures=built.runtime,
        cost_estimate=plan.cost_estimate,
        accuracy=agree.as_dict() if plan.eval_y is not None else None,
        eval_ref=plan.eval_ref,
        parity=None
        if plan.eval_y is not None
        else {
            "samples": agree.samples,
            "argmax_agreement": agree.argmax_agreement,
            "max_abs_logit_diff": agree.max_abs_logit_diff,
        },
    )


def _publish(stage: Path, out: Path, paths: list[Path]) -> list[Path]:
    """Move each finished file into `out` (created), each with one rename: a reader never sees
    a partial file, and a failure before this point leaves `out` untouched."""
    out.mkdir(parents=True, exist_ok=True)
    done = []
    for path in paths:
        target = out / path.name
        os.replace(path, target)
        done.append(target)
    return done
