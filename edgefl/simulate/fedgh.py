"""FedGH inside a simulation (FedGH paper, one-shot): each classifier client derives its class
prototypes from the model it trained (same train split as its training, so the validation part
stays a clean local test split), the server trains the shared header on them, every client
splices the header into its own model, and the metric is FedGH's: the mean accuracy of the
personalized models on each client's local test split, beside each client alone (Standalone)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

import exporters
from edgefl.client.public import apply_header, class_prototypes, data_metadata, write_prototypes
from edgefl.client.run import client_shard
from edgefl.data import load_dataset, train_val_split
from edgefl.errors import FusionError
from edgefl.models.spec import ModelSpec
from edgefl.server.fuse import FuseJob, run_fuse
from edgefl.server.ingest import rebuild


def _local_accuracy(path: Path, x: np.ndarray, y: np.ndarray) -> float:
    return float((exporters.read_artifact(path).run(x).argmax(1) == y).mean()) if len(y) else 0.0


def run_fedgh(job, cjobs, clients: list[dict], options: dict, log) -> dict:
    """A report in run_fuse's shape (accuracy = mean personalized local accuracy)."""
    start = time.perf_counter()
    out = Path(job.out)
    report_path = out / "global" / "fedgh.json"
    if report_path.exists():
        return json.loads(report_path.read_text())
    members = [(cj, c) for cj, c in zip(cjobs, clients, strict=True) if c["role"] == "classifier"]
    if not members:
        raise FusionError("fedgh needs classifier clients (prototypes come from their models)")
    data = load_dataset(job.dataset, "train", data_dir=job.data_dir)
    protos, splits = out / "uploads-prototypes", {}
    for cj, c in members:
        train_idx, val_idx = train_val_split(
            client_shard(cj, data), 0.1, seed=cj.seed + cj.client_index
        )
        splits[c["client_id"]] = val_idx
        path = protos / Path(c["path"]).name
        if path.exists():
            continue
        art = exporters.read_artifact(c["path"])
        module, _ = rebuild(art)
        classes, means, counts = class_prototypes(
            module, data.x[train_idx], data.y[train_idx], data.num_classes
        )
        label = ModelSpec.from_dict(art.metadata["spec"]).label
        write_prototypes(path, classes, means, counts, data_metadata(art.metadata, label))
    header = out / "global" / "fedgh-header.onnx"
    rep = run_fuse(FuseJob(uploads=str(protos), method="fedgh", out=str(header),
                           options=options, device=job.device,
                           report=str(out / "global" / "fedgh-header.json")))  # fmt: skip
    personal, alone = {}, {}
    for _, c in members:
        mine = out / "personalized" / Path(c["path"]).name
        if not mine.exists():
            mine.parent.mkdir(parents=True, exist_ok=True)
            apply_header(c["path"], str(header), str(mine))
        val = splits[c["client_id"]]
        x, y = data.x[val], data.y[val]
        personal[c["client_id"]] = _local_accuracy(mine, x, y)
        alone[c["client_id"]] = _local_accuracy(Path(c["path"]), x, y)
    result = {
        "method": "fedgh",
        "metric": "mean accuracy of personalized models on each client's local test split",
        "accuracy": float(np.mean(list(personal.values()))),
        "standalone_accuracy": float(np.mean(list(alone.values()))),
        "per_client": {cid: {"fedgh": personal[cid], "standalone": alone[cid]} for cid in personal},
        "used": rep["used"],
        "header": str(header),
        "device": rep["device"],
        "total_seconds": time.perf_counter() - start,
    }
    exporters.atomic_write_text(report_path, json.dumps(result, indent=2))
    return result
