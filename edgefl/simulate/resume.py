"""Resuming a simulation: a finished upload or global model is reused only when it was made
with the settings asked for now; otherwise the run stops and says what differs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import exporters
from edgefl.client.rerun import federation_differs, training_differs
from edgefl.client.run import ClientJob, upload_val_accuracy
from edgefl.data.registry import DATASETS
from edgefl.errors import ConfigError
from edgefl.fusion import METHODS
from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import spec_label
from edgefl.outputs import sha256_file


def upload_path(cjob: ClientJob) -> Path:
    """Where a client's upload (or its data upload) lands in a run."""
    return Path(cjob.out_dir) / f"client-{cjob.client_index:03d}.onnx"


def finished(cjob: ClientJob) -> dict | None:
    """The summary of an upload a previous run finished (exports are atomic: a file that exists
    is complete), if it was made by the same job."""
    path = upload_path(cjob)
    if cjob.keep_model:  # a predictions client: its kept model is written first, then the upload
        pred, path = path, Path(cjob.keep_model) / path.name
        if not (pred.exists() and path.exists()):
            return None
        summary = finished(replace(cjob, keep_model=None, kind="model", out_dir=cjob.keep_model))
        return summary | {"predictions_path": str(pred), "predictions_bytes": pred.stat().st_size}
    if not path.exists():
        return None
    meta = exporters.read_artifact(path).metadata
    part = meta.get("partition", {})
    # Another dataset's, federation's or client's upload is never this run's: reusing it would
    # report its numbers under this run's dataset and setting.
    dataset = DATASETS.get(cjob.dataset).name if cjob.dataset in DATASETS else meta.get("dataset")
    differs = federation_differs(cjob, meta, dataset)
    if differs:
        raise ConfigError(
            f"{path} was made by a different run ({', '.join(differs)})",
            hint="use a fresh --out directory for a different setting",
        )
    spec = ModelSpec.from_dict(meta["spec"])
    role = "classifier" if meta["kind"] == "classifier" else "generator"
    differs = training_differs(cjob, spec, role, meta["training"])
    if differs:  # reusing it would report a model trained otherwise than asked
        raise ConfigError(
            f"{path} was trained with other settings ({differs})",
            hint="use a fresh --out directory, or delete that upload to retrain it",
        )
    row = {
        "path": str(path),
        "client_id": meta["client_id"],
        "role": role,
        "model": spec_label(spec),
        "profile": meta["profile"],
        "training": meta["training"],
        "label_counts": meta.get("label_counts"),  # None: withheld (--label-counts absent)
        "privacy": meta.get("privacy"),
        "num_classes": meta["num_classes"],
        "upload_bytes": path.stat().st_size,
        "costs": meta["costs"],
        "reused": True,
    }
    if isinstance(part.get("user"), int):  # whose data a drawn user client holds
        row["user"] = part["user"]
    if cjob.sim.attack and role == "classifier":  # its header claims its training's; the run tells
        row["upload_val_accuracy"] = upload_val_accuracy(cjob, path)
    return row


def reuse_global(method: str, options: dict, report: Path, input_shape, dataset: str) -> dict:
    """A finished global model is reused only if it was fused with the same configuration (as
    in effect on the task's input and dataset: the report records the options a method ran
    with)."""
    done = json.loads(report.read_text())
    cfg = METHODS.get(method).effective_config(options, input_shape, dataset)
    want = json.loads(json.dumps(cfg.as_dict(), default=str))
    have = done.get("config", {})
    diff = sorted(k for k in want.keys() | have.keys() if want.get(k) != have.get(k))
    if diff:
        changes = ", ".join(f"{k} {have.get(k)!r} -> {want.get(k)!r}" for k in diff)
        raise ConfigError(
            f"{report.with_suffix('.onnx')} was fused with other options ({changes})",
            hint=f"use a fresh --out, or delete {report.parent} to fuse again with the new options",
        )
    return done


def changed_uploads(done: dict, folder: Path, since_ns: int | None = None) -> list[str]:
    """The .onnx files of `folder` that are not the ones a finished global model's report says
    it was fused from: changed since (or recorded without a digest), added, or gone. Deleting an
    upload to retrain it must not leave a global model of the old one reported as this run's.
    A rejected file has no digest in the report: it counts as changed if it was written after
    `since_ns` (the report's own mtime)."""
    accepted = {a["file"]: a.get("sha256") for a in done.get("accepted", [])}
    rejected = {r["file"] for r in done.get("rejected", [])}
    now = {p.name for p in folder.glob("*.onnx")}
    differ = {n for n in now ^ (set(accepted) | rejected) if n.endswith(".onnx")}
    differ |= {n for n, h in accepted.items() if n in now and h != sha256_file(folder / n)}
    if since_ns is not None:
        differ |= {n for n in rejected & now if (folder / n).stat().st_mtime_ns > since_ns}
    return sorted(differ)
