"""A method's report: its staged outputs (global model, device classes' models, extra outputs)
exported and evaluated, and the entries on them (what was used and why not the rest, privacy,
the seconds of each stage, the host), written last beside the model it names by SHA-256."""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

import torch

import edgefl
from edgefl.artifacts import Upload
from edgefl.chance import global_warning, near_chance
from edgefl.fusion.base import FusionContext, FusionResult
from edgefl.models.zoo import spec_label
from edgefl.outputs import Staging, sha256_file
from edgefl.server.class_models import for_classes
from edgefl.server.export import evaluate_global, export_global, privacy_of
from edgefl.server.plan import FuseRun, Planned
from edgefl.server.selection import Used


def staged_report(
    p: Planned,
    run: FuseRun,
    used: Used,
    ctx: FusionContext,
    result: FusionResult,
    stage: Staging,
) -> dict[str, Any]:
    """The global model, its device classes' models and extra outputs staged, evaluated, and
    the report on them (all but its total time), the seconds of each stage included."""
    stages = {"ingest": run.found.seconds, **ctx.stages}
    if p.config.robust == "screen":
        stages["screen"] = used.verdict.seconds  # the one judgement all methods of the run share
    staged = stage.path(p.out)
    t = time.perf_counter()
    privacy = privacy_of(used.usable, run.found)
    input_shape = export_global(p, ctx, result, staged, extra={"privacy": privacy})
    stages["export"] = time.perf_counter() - t
    report = _report(p, ctx, run, used, result, staged, stage)
    report["privacy"] = privacy
    if p.classes is not None:
        t = time.perf_counter()
        report["for_classes"] = for_classes(p, ctx, result, stage, run)
        stages["for_classes"] = time.perf_counter() - t
    if run.eval_ref:
        t = time.perf_counter()
        report |= evaluate_global(p, input_shape, run.eval_ref, run.data_dir, staged)
        stages["eval"] = time.perf_counter() - t
        if near_chance(report.get("accuracy"), ctx.num_classes):
            report["warnings"] = [
                global_warning(
                    p.method.name,
                    report["accuracy"],
                    ctx.num_classes,
                    _val_accuracies(used.usable),
                )
            ]
    report["seconds"] = stages
    report["ingest_stages"] = run.found.stages
    report["uploads_parked"] = sum(u.parked is not None for u in run.found.uploads)
    if run.shared > 1:
        report["ingest_shared_by"] = run.shared  # one ingest served this many methods
    return report


def _report(
    p: Planned,
    ctx: FusionContext,
    run: FuseRun,
    used: Used,
    result: FusionResult,
    staged: Path,
    stage: Staging,
) -> dict[str, Any]:
    """The report's entries known once the model is staged: the method's own first, so that
    the core keys below can never be overwritten by a method."""
    found, device = run.found, run.device
    extra = p.method.outputs(result, staged) if p.method.outputs is not None else {}
    # A method names its extra outputs where it wrote them (staged): the report, where they go.
    extra = {k: str(stage.final(v)) if isinstance(v, str | Path) else v for k, v in extra.items()}
    return {
        **result.info,
        **extra,
        "method": p.method.name,
        "paper": p.method.paper,
        "config": p.config.as_dict(),
        "global_model": str(p.out),
        "global_bytes": staged.stat().st_size,
        # The bytes published (a rename moves them unchanged): a reader checks that the model
        # beside this report is the one it describes.
        "global_sha256": sha256_file(staged),
        "extra_outputs": extra,  # every file a method writes beside its global model, named
        "accepted": [
            {
                "file": u.name,
                "client_id": u.client_id,
                "kind": u.kind,
                "model": spec_label(u.spec) if u.spec else None,
                "sha256": u.artifact.sha256,  # the bytes validated and fused
            }
            for u in found.uploads
        ],
        "used": [u.client_id for u in used.usable],
        "rejected": [{"file": n, "reason": r} for n, r in found.rejected],
        "skipped": [{"file": n, "reason": r} for n, r in used.skipped],
        # Of skipped, those the method itself set aside (FedAvg's other architectures); those
        # it used in part only (FedMHO-MD's other architectures: teachers, not in w0); and what
        # the global model stands for when the method left uploads out ("5 of 10: vgg9 only").
        "set_aside": [{"file": u.name, "reason": r} for u, r in ctx.aside],
        "partly_used": [{"file": u.name, "reason": r} for u, r in ctx.partly],
        "scope": result.scope,
        "screened": used.screened,  # --robust screen: poisoned-looking uploads left out, and why
        "robust_notes": used.notes,
        "notes": found.notes,
        "folders_not_read": [{"folder": n, "reason": r} for n, r in found.folders],
        "device": str(device),
        "host": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
        },
        "edgefl_version": edgefl.__version__,
    }


def _val_accuracies(uploads: list[Upload]) -> list[float]:
    """The validation accuracies the classifier uploads declare (numbers only: metadata is data)."""
    out = []
    for u in uploads:
        acc = (u.meta.get("training") or {}).get("val_accuracy") if u.kind == "classifier" else None
        if isinstance(acc, int | float) and not isinstance(acc, bool) and 0 <= acc <= 1:
            out.append(float(acc))
    return out


def jsonable(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)
