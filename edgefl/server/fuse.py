"""The server pipeline every method shares: ingest -> rebuild -> fuse -> export -> eval -> report.

Uploads are only read. The global model and the report are written atomically (temporary file
+ rename), so a crash or Ctrl-C never leaves a half-written output.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import edgefl
import exporters
from edgefl.errors import ArtifactError, ConfigError, FusionError
from edgefl.fusion import METHODS
from edgefl.fusion.base import FusionContext
from edgefl.server.ingest import ingest


@dataclass(frozen=True)
class FuseJob:
    uploads: str
    method: str
    out: str = "global.onnx"
    options: dict[str, Any] | None = None  # method config overrides, by field name
    device: str = "auto"
    eval: str | None = None  # DATASET[:SPLIT]
    data_dir: str | None = None
    strict: bool = False
    max_upload_bytes: int = exporters.DEFAULT_MAX_UPLOAD_BYTES
    report: str | None = None  # default: <out>.json


def resolve_device(name: str, flag: str = "--device") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"{flag} cuda: no CUDA device is available", hint=f"use {flag} auto or cpu"
        )
    if name not in ("cpu", "cuda"):
        raise ConfigError(f"{flag} must be auto, cpu or cuda, got {name!r}")
    return torch.device(name)


def run_fuse(job: FuseJob, log=None) -> dict[str, Any]:
    log = log or (lambda msg: None)
    method = METHODS.get(job.method)
    cfg = method.make_config(dict(job.options or {}))
    device = resolve_device(job.device)
    out = Path(job.out)
    if out.suffix != ".onnx":
        raise ConfigError(f"--out must end in .onnx, got {out}")
    report_path = Path(job.report) if job.report else out.with_suffix(".json")
    uploads = Path(job.uploads).resolve()
    for flag_name, path in (("--out", out), ("--report", report_path)):
        if uploads in path.resolve().parents:  # uploads are only ever read
            raise ConfigError(
                f"{flag_name} {path} is inside the upload directory {job.uploads}",
                hint="the server never writes among the uploads: write the global model and "
                "its report elsewhere, e.g. --out global.onnx",
            )
    stages: dict[str, float] = {}

    start = time.perf_counter()
    found = ingest(job.uploads, max_upload_bytes=job.max_upload_bytes, strict=job.strict)
    stages["ingest"] = time.perf_counter() - start
    usable = [u for u in found.uploads if u.kind in method.consumes]
    skipped = [(u.name, f"{u.kind} artifacts are not used by {method.name}")
               for u in found.uploads if u.kind not in method.consumes]  # fmt: skip
    if method.needs_gradients:
        for u in [u for u in usable if u.module is None]:
            skipped.append(
                (u.name, f"{method.name} needs a rebuilt torch module: {u.forward_only}")
            )
        usable = [u for u in usable if u.module is not None]
    if not usable:
        raise FusionError(
            f"none of the {len(found.uploads)} accepted uploads can be used by {method.name} "
            f"(it consumes: {', '.join(method.consumes)})",
            hint="`edgefl server methods` lists what each method needs",
        )
    log(f"{len(usable)} upload(s) used by {method.name}; {len(found.rejected)} rejected")

    torch.manual_seed(cfg.seed)
    ctx = FusionContext(usable, device=device, seed=cfg.seed, log=log)
    result = method.fuse(ctx, cfg)
    stages.update(ctx.stages)

    input_shape = tuple(result.input_shape or ctx.input_shape)
    meta = {
        "kind": "global",
        "spec": result.spec.to_dict() if result.spec else None,
        "input_shape": list(input_shape),
        "num_classes": ctx.num_classes,
        "class_names": [str(c) for c in ctx.class_names],
        "client_id": "server",
        "method": method.name,
        "config": cfg.as_dict(),
        "client_ids": [u.client_id for u in usable],
        "edgefl_version": edgefl.__version__,
    }
    t = time.perf_counter()
    model = result.model.to("cpu").eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    # A report left by an earlier run must not outlive the model it describes: if this run is
    # interrupted between publishing the new model and its report, leave no report, not the old.
    report_path.unlink(missing_ok=True)
    try:
        exporters.export_onnx(
            model, (torch.zeros(2, *input_shape),), out,
            input_names=[result.input_name or "input"], output_names=["logits"], metadata=meta,
        )  # fmt: skip
    except exporters.ExportError as exc:
        raise ArtifactError(f"exporting the global model failed: {exc}") from None
    stages["export"] = time.perf_counter() - t
    if "stratification" in result.info:  # FedHydra: the client x class weights as a picture
        from edgefl.fusion.fedhydra import plot_stratification

        strat = result.info["stratification"]
        heat = out.with_suffix(".stratification.png")
        plot_stratification(strat["U_r"], strat["client_ids"], strat["class_names"], heat)
        result.info["stratification_png"] = str(heat)

    # Method entries first: core keys below can never be overwritten by a method.
    report: dict[str, Any] = {
        **result.info,
        "method": method.name,
        "paper": method.paper,
        "config": cfg.as_dict(),
        "global_model": str(out),
        "global_bytes": out.stat().st_size,
        "accepted": [
            {
                "file": u.name,
                "client_id": u.client_id,
                "kind": u.kind,
                "model": u.spec.label if u.spec else None,
            }
            for u in found.uploads
        ],  # fmt: skip
        "used": [u.client_id for u in usable],
        "rejected": [{"file": n, "reason": r} for n, r in found.rejected],
        "skipped": [{"file": n, "reason": r} for n, r in skipped],
        "notes": found.notes,
        "device": str(device),
        "host": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
        },  # fmt: skip
        "edgefl_version": edgefl.__version__,
    }
    if job.eval and result.input_shape is not None:
        # Not an image classifier (FedGH's header): it is judged after `client apply-header`,
        # by each personalized model on its client's local test split.
        report["eval"] = {
            "skipped": f"the {method.name} output takes input {list(input_shape)}, "
            "not images; evaluate the personalized client models instead"
        }
    elif job.eval:
        from edgefl.evaluate import evaluate_artifact, parse_eval_ref

        t = time.perf_counter()
        name, split = parse_eval_ref(job.eval)
        ev = evaluate_artifact(exporters.read_artifact(out), name, split, data_dir=job.data_dir)
        stages["eval"] = time.perf_counter() - t
        report["eval"] = ev.as_dict()
        report["accuracy"] = ev.accuracy
    report["seconds"] = stages
    report["total_seconds"] = time.perf_counter() - start
    exporters.atomic_write_text(report_path, json.dumps(report, indent=2, default=_jsonable))
    report["report_path"] = str(report_path)
    return report


def _jsonable(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)
