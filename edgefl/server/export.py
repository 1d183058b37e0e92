"""Stages export and evaluate: a fused model (the global one, or a device class's) as one ONNX
file with what it was made of in its metadata (the privacy of the uploads used included), and
its accuracy on the --eval split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import edgefl
import exporters
from edgefl.artifacts import Upload
from edgefl.errors import FusionError
from edgefl.fusion.base import FusionContext, FusionResult
from edgefl.server.ingest import Ingest
from edgefl.server.plan import Planned


def export_global(
    p: Planned,
    ctx: FusionContext,
    result: FusionResult,
    path: Path | None = None,
    extra: dict[str, Any] | None = None,
) -> tuple[int, ...]:
    """The global model as one ONNX file at `path` (default: its target, `p.out`); `extra`:
    more metadata (a device class's model names its profile)."""
    path = p.out if path is None else path
    input_shape = tuple(result.input_shape or ctx.input_shape)
    aside = {id(u) for u, _ in ctx.aside}  # uploads the method itself left out
    used = [u for u in ctx.uploads if id(u) not in aside]
    # The task's dataset where the uploads used name one: deploy suggests its data by it.
    named = {u.meta.get("dataset") for u in used if isinstance(u.meta.get("dataset"), str)}
    meta = {
        "kind": "global",
        "spec": result.spec.to_dict() if result.spec else None,
        "input_shape": list(input_shape),
        "num_classes": ctx.num_classes,
        "class_names": [str(c) for c in ctx.class_names],
        "client_id": "server",
        "method": p.method.name,
        "config": p.config.as_dict(),
        "client_ids": [u.client_id for u in used],
        "edgefl_version": edgefl.__version__,
        **({"dataset": named.pop()} if len(named) == 1 else {}),
        **(extra or {}),
    }
    model = result.model.to("cpu").eval()
    try:
        exporters.export_onnx(
            model,
            (torch.zeros(2, *input_shape),),
            path,
            input_names=[result.input_name or "input"],
            output_names=["logits"],
            metadata=meta,
        )
    except exporters.ExportError as exc:
        # This method's failure, not the run's: beside other methods it is reported and the
        # rest still fuse (a FusionError is refused per method).
        raise FusionError(
            f"exporting the global model failed: {exc}",
            hint="report it with the method and its options; the other methods still fuse",
        ) from None
    return input_shape


def evaluate_global(
    p: Planned, input_shape, eval_ref: str, data_dir: str | None, path: Path | None = None
) -> dict:
    """Report entries: the global model's (at `path`, default `p.out`) accuracy on
    DATASET[:SPLIT], or why it is not judged that way (a per-client method's output takes
    representations, not images)."""
    if p.method.judged != "global":
        return {
            "eval": {
                "skipped": f"the {p.method.name} output takes input {list(input_shape)}, not "
                "images; evaluate the personalized client models instead"
            }
        }
    from edgefl.evaluate import evaluate_artifact, parse_eval_ref

    name, split = parse_eval_ref(eval_ref)
    model = p.out if path is None else path
    ev = evaluate_artifact(exporters.read_artifact(model), name, split, data_dir=data_dir)
    return {"eval": ev.as_dict(), "accuracy": ev.accuracy}


def privacy_of(used: list[Upload], found: Ingest) -> dict[str, Any]:
    """The privacy of what a global model was made of, by the uploads' records (recomputed at
    the ingest). DP-SGD's guarantee is per training sample ("unit"), and each sample is in one
    upload only, so the model is (epsilon, delta)-DP for each sample at the largest of the used
    uploads' own (parallel composition), when every used upload is private as a whole;
    otherwise epsilon is null and `not_private` says how many are not. A client's data as a
    whole (a person's, on a wristband) has only what group privacy gives k samples: k x epsilon
    (docs/privacy.md)."""
    spent = [found.privacy.get(u.name) for u in used]
    private = [s for s in spent if s is not None and s.epsilon is not None]
    whole = len(private) == len(spent) and bool(spent)
    return {
        "max_epsilon_allowed": found.max_epsilon,
        "uploads": len(spent),
        "private": len(private),
        "not_private": len(spent) - len(private),
        "unit": "sample",
        "epsilon": max(s.epsilon for s in private) if whole else None,
        "delta": max(s.delta for s in private) if whole else None,
        "accountant": "rdp" if private else None,
        "label_counts_absent": sum("label_counts" not in u.meta for u in used),
        # a simulation's seeded noise: the epsilon it spent, replayable by who knows the seed
        "replayable": sum(s.replayable for s in private),
    }
