"""The pipeline's --for step: one model per device class, distilled from a method's global model
(edgefl.server.classes picks each class's student and distils it) and staged with the global
model, so that they are published as one unit."""

from __future__ import annotations

import time
from typing import Any

from edgefl.errors import FusionError
from edgefl.fusion.base import FusionContext, FusionResult
from edgefl.models.zoo import spec_label
from edgefl.outputs import Staging, sha256_file
from edgefl.server import classes as device_classes
from edgefl.server.export import evaluate_global, export_global, privacy_of
from edgefl.server.plan import FuseRun, Planned


def for_classes(
    p: Planned, ctx: FusionContext, result: FusionResult, stage: Staging, run: FuseRun
) -> dict[str, Any]:
    """One model per device class of `--for`, staged with the global model (same unit)."""
    if p.method.judged != "global":
        why = (
            f"{p.method.name} yields no global classifier (it is judged per client), so "
            "there is nothing to distil per device class"
        )
        run.log(f"{p.method.name}: --for refused: {why}")
        return {"refused": why}
    teacher = result.model.to("cpu").eval()
    transfer, out = None, {}
    for i, (profile, target) in enumerate(p.class_outs):
        start = time.perf_counter()
        spec, model = device_classes.student_for(profile, ctx, result, p.classes.max_macs)
        if model is None:
            if transfer is None:  # one transfer set serves every class
                transfer = _transfer_set(p, ctx, result, teacher)
            model, entry = _distil_class(p, ctx, run, teacher, transfer, profile, spec, i)
        else:
            entry = {"from": "the global model itself (it fits this class)"}
        staged = stage.path(target)
        sub = FusionResult(model, spec, {})
        extra = {"profile": profile.name, "privacy": privacy_of(ctx.uploads, run.found)}
        shape = export_global(p, ctx, sub, staged, extra=extra)
        if run.eval_ref:
            entry |= evaluate_global(p, shape, run.eval_ref, run.data_dir, staged)
        entry["seconds"] = time.perf_counter() - start
        out[profile.name] = device_classes.class_entry(
            profile, spec, target, staged, sha256_file(staged), **entry
        )
    teacher.to(ctx.device)
    return out


def _transfer_set(p: Planned, ctx: FusionContext, result: FusionResult, teacher):
    """(samples, where they came from): what every device class's student is distilled on."""
    try:
        return device_classes.transfer_set(ctx, result, teacher, p.classes.samples, p.config.seed)
    except RuntimeError as exc:  # e.g. a global model with no gradient to invert
        raise FusionError(
            f"--for: no transfer data for distillation: {exc}",
            hint="use a method that exposes its samples",
        ) from None


def _distil_class(
    p: Planned,
    ctx: FusionContext,
    run: FuseRun,
    teacher,
    transfer,
    profile,
    spec,
    i: int,
) -> tuple[Any, dict[str, Any]]:
    """(the `i`th device class's student distilled from `teacher`, its report entries)."""
    req, name, progress = p.classes, p.method.name, run.progress
    x, source = transfer
    run.log(
        f"{name}: distilling {spec_label(spec)} for {profile.name} on {len(x)} samples ({source})"
    )
    steps = (
        (lambda task, d, n, note="": progress(f"{name} {profile.name} {task}", d, n, note))
        if progress
        else None
    )
    model, history = device_classes.distil(
        teacher,
        spec,
        x,
        epochs=req.epochs,
        seed=p.config.seed + i,
        device=ctx.device,
        progress=steps,
    )
    return model, {
        "from": "distilled",
        "transfer": {"source": source, "samples": len(x)},
        "epochs": req.epochs,
        "temperature": device_classes.TEMPERATURE,
        "loss_history": history,
    }
