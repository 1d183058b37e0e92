"""Methods judged per client (`Method.judged == "per-client"`, e.g. FedGH) inside a simulation:
each classifier client derives the artifact the method consumes from the model it trained (on
its training part, so the validation part stays a clean local test split), the server fuses
them, every client applies the global output to its own model (`Method.personalize`), and the
metric is the mean accuracy of the personalized models on each client's local test split,
beside each client alone (Standalone). Under --dp each such client trains again as a job of that
kind, so that what it uploads is released privately (`_again`), in simulate's `--jobs` workers."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

import exporters
from edgefl.client.run import device_split
from edgefl.client.weightless import derive_upload, personalize
from edgefl.data import load_dataset
from edgefl.errors import FusionError
from edgefl.fusion.base import Method
from edgefl.server.fuse import fuse_methods
from edgefl.server.plan import plan
from edgefl.simulate.pool import train_jobs
from edgefl.simulate.resume import finished


def _local_accuracy(path: Path, x: np.ndarray, y: np.ndarray) -> float:
    return float((exporters.read_artifact(path).run(x).argmax(1) == y).mean()) if len(y) else 0.0


def run_per_client(job, method: Method, cjobs, clients: list[dict], options: dict, log) -> dict:
    """A report in the server pipeline's shape (accuracy = mean personalized local accuracy)."""
    start = time.perf_counter()
    out = Path(job.out)
    name = method.name
    report_path = out / "global" / f"{name}.json"
    if report_path.exists():
        return json.loads(report_path.read_text())
    (kind,) = method.consumes  # what each client derives from its trained model
    members = [(cj, c) for cj, c in zip(cjobs, clients, strict=True) if c["role"] == "classifier"]
    if not members:
        raise FusionError(
            f"{name} needs classifier clients ({kind} come from their models)",
            hint="--mix with a profile that trains a classifier, e.g. smartphone:5,wristband:5",
        )
    data = load_dataset(job.dataset, "train", data_dir=job.data_dir)
    folder, splits, models = out / f"uploads-{kind}", {}, {}
    again = list(cjobs)  # each member's job again as a `kind` job, under --dp
    for cj, c in members:
        train_idx, val_idx = device_split(cj, data)
        splits[c["client_id"]] = val_idx
        path = folder / Path(c["path"]).name
        if cj.dp is None:  # exact statistics of the model it trained, on its training part
            if not path.exists():
                x, y = data.x[train_idx], data.y[train_idx]
                derive_upload(kind, c["path"], x, y, data.num_classes, path)
            models[c["client_id"]] = Path(c["path"])
        else:
            again[cj.client_index] = _again(cj, kind, folder, out)
            models[c["client_id"]] = out / f"models-{kind}" / path.name
    _train_again(again, [cj for cj, _ in members if cj.dp is not None], kind, job.jobs, log)
    output = out / "global" / f"{name}-{method.personalize}.onnx"  # e.g. fedgh-header.onnx
    planned = plan(name, options, output, folder)
    rep = fuse_methods([planned], str(folder), device=job.device, keep_going=False, log=log)[name]
    personal, alone = {}, {}
    for _, c in members:
        mine, own = out / "personalized" / Path(c["path"]).name, models[c["client_id"]]
        if not mine.exists():
            mine.parent.mkdir(parents=True, exist_ok=True)
            personalize(method.personalize, str(own), str(output), str(mine))
        val = splits[c["client_id"]]
        x, y = data.x[val], data.y[val]
        personal[c["client_id"]] = _local_accuracy(mine, x, y)
        alone[c["client_id"]] = _local_accuracy(own, x, y)
    result = {
        "method": name,
        "metric": "mean accuracy of personalized models on each client's local test split",
        "accuracy": float(np.mean(list(personal.values()))),
        "standalone_accuracy": float(np.mean(list(alone.values()))),
        "per_client": {cid: {name: personal[cid], "standalone": alone[cid]} for cid in personal},
        "used": rep["used"],
        "privacy": rep.get("privacy"),  # what the uploads it used spent, recomputed
        "global_output": str(output),
        "device": rep["device"],
        "total_seconds": time.perf_counter() - start,
    }
    exporters.atomic_write_text(report_path, json.dumps(result, indent=2))
    return result


def _again(cj, kind: str, folder: Path, out: Path):
    """Under --dp exact statistics would leave the device unprotected: the client trains again
    as a `kind` job, DP-SGD on part of its budget and the Gaussian mechanism on the rest
    (edgefl.client.privacy), and keeps that model (`models-KIND/`) to personalize: its
    Standalone is then that model's, trained on part of the budget."""
    seed = cj.sim.noise_seed  # a second release: noise of its own, not the first one's again
    if seed is not None:
        seed = int(np.random.SeedSequence([seed, 2]).generate_state(1)[0])
    return replace(
        cj,
        kind=kind,
        out_dir=str(folder),
        keep_model=str(out / f"models-{kind}"),
        sim=replace(cj.sim, noise_seed=seed),
    )


def _train_again(again: list, private: list, kind: str, jobs: int, log) -> None:
    """Train the `private` members' jobs again (`again[client index]`), in `jobs` workers; a
    finished (upload, kept model) pair is checked to be this job's and kept."""
    todo = [cj.client_index for cj in private if finished(again[cj.client_index]) is None]
    for i in todo:
        log(f"client-{i:03d}: trains again as a {kind} job, to release them under --dp")
    train_jobs(again, todo, jobs, log)
