"""Uploads that carry no weights: predictions on a public set (FedOL, Qin et al. 2025) and
per-class mean representations (FedGH, Yi et al. 2023), plus splicing FedGH's global header back
into a device's own model.

Both uploads are ONNX data artifacts (exporters.write_constant_artifact), so the server validates
them exactly like model uploads. The public set is shared knowledge: the server loads the same
samples (`load_public`) and compares fingerprints (`public_fingerprint`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import exporters
from edgefl.artifacts import RebuildRejected, read_header, rebuild
from edgefl.client.export import export_model
from edgefl.client.privacy import LabelRelease
from edgefl.data import parse_dataset_ref
from edgefl.data.public import DEFAULT_PUBLIC_SIZE, is_carved, load_public, public_fingerprint
from edgefl.errors import ArtifactError, ConfigError
from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import spec_label

# --- what a client computes -----------------------------------------------------------------


@torch.no_grad()
def softmax_predictions(model: nn.Module, x: np.ndarray, batch: int = 512) -> np.ndarray:
    """The model's class probabilities on x, float32 (N, C)."""
    model.eval()
    out = [
        torch.softmax(model(torch.from_numpy(x[i : i + batch])).float(), 1).numpy()
        for i in range(0, len(x), batch)
    ]
    return np.concatenate(out).astype(np.float32)


def representation_layer(model: nn.Module) -> tuple[nn.Module, nn.Linear]:
    """(features, head) of a zoo classifier: head(features(x)), head one nn.Linear."""
    features, head = getattr(model, "features", None), getattr(model, "head", None)
    if not isinstance(features, nn.Module) or not isinstance(head, nn.Linear):
        raise ConfigError(
            f"{type(model).__name__} has no representation layer (features -> Linear head)",
            hint="use a zoo classifier, e.g. fedgh-cnn1..5 (500-d representation, as in FedGH)",
        )
    return features, head


@torch.no_grad()
def class_sums(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    num_classes: int,
    clip: float | None = None,
    batch: int = 512,
) -> tuple[np.ndarray, np.ndarray]:
    """(K x R float64 per-class sums of features(x), K counts); `clip`: each representation
    scaled down to that L2 norm first where longer (the DP release's bounded contribution:
    edgefl.client.privacy)."""
    features, head = representation_layer(model)
    model.eval()
    sums = torch.zeros(num_classes, head.in_features, dtype=torch.float64)
    counts = torch.zeros(num_classes, dtype=torch.int64)
    for i in range(0, len(x), batch):
        rep = features(torch.from_numpy(x[i : i + batch])).flatten(1).double()
        if clip is not None:
            rep = rep * (clip / rep.norm(dim=1, keepdim=True).clamp_min(1e-12)).clamp(max=1.0)
        yb = torch.from_numpy(np.asarray(y[i : i + batch], dtype=np.int64))
        sums.index_add_(0, yb, rep)
        counts += torch.bincount(yb, minlength=num_classes)
    return sums.numpy(), counts.numpy()


def class_prototypes(
    model: nn.Module, x: np.ndarray, y: np.ndarray, num_classes: int, batch: int = 512
) -> tuple[list[int], np.ndarray, list[int]]:
    """FedGH's local averaged representations: per held class s, mean of features(x) over the
    samples of class s. Returns (classes, P x R float32 means, counts)."""
    sums, counts = class_sums(model, x, y, num_classes, batch=batch)
    held = np.flatnonzero(counts > 0)
    means = (sums[held] / counts[held, None]).astype(np.float32)
    return held.tolist(), means, counts[held].tolist()


def data_metadata(meta: dict[str, Any], spec_label: str) -> dict[str, Any]:
    """A data artifact keeps the model upload's metadata, minus its spec: the server must not
    try to rebuild a model from it (no weights leave the device)."""
    out = copy.deepcopy(meta)
    out["spec"] = None
    out["model"] = spec_label
    return out


def write_predictions(
    path: Path,
    probs: np.ndarray,
    meta: dict[str, Any],
    *,
    fingerprint: str,
    public: str,
    fp16: bool = False,
) -> exporters.ExportReport:
    """The FedOL upload: softmax outputs on the public set, N x C (float16 halves the bytes)."""
    if fp16:
        probs = probs.astype(np.float16)
    meta = meta | {
        "kind": "predictions",
        "public": public,
        "public_fingerprint": fingerprint,
        "public_size": int(len(probs)),
        "dtype": str(probs.dtype),
    }
    try:
        return exporters.write_constant_artifact(path, {"predictions": probs}, meta)
    except exporters.ExportError as exc:
        raise ArtifactError(
            f"writing predictions failed: {exc}",
            hint="write to a folder you can write with room left (--out)",
        ) from None


def write_prototypes(
    path: Path,
    classes: list[int],
    means: np.ndarray,
    counts: list[int] | None,
    meta: dict[str, Any],
) -> exporters.ExportReport:
    """The FedGH upload: per held class the mean representation; ids and counts in metadata
    (schema-checked JSON ints, the same as label_counts) so the tensor is the only payload.
    `counts` None: not stated (the user withheld or noised the label counts, and exact
    per-class counts are that histogram)."""
    meta = meta | {
        "kind": "prototypes",
        "representation_size": int(means.shape[1]),
        "classes": [int(c) for c in classes],
    }
    if counts is not None:
        meta["counts"] = [int(c) for c in counts]
    try:
        return exporters.write_constant_artifact(path, {"prototypes": means}, meta)
    except exporters.ExportError as exc:
        raise ArtifactError(
            f"writing prototypes failed: {exc}",
            hint="write to a folder you can write with room left (--out)",
        ) from None


# --- the branch of run_client -----------------------------------------------------------------


def prepare(job, role: str) -> np.ndarray | None:
    """Checks made before any training (a mistake should not cost a training run); returns the
    public samples for a predictions job."""
    if job.kind == "model":
        return None
    if job.keep_model and Path(job.keep_model).resolve() == Path(job.out_dir).resolve():
        raise ConfigError(
            "--keep-model must not be the upload directory: the weights would be uploaded",
            hint="e.g. --keep-model local",
        )
    if role != "classifier":
        raise ConfigError(
            f"a {job.kind} upload needs a classifier, but this client trains a {role}",
            hint="pass --model with a zoo classifier (e.g. cnn, fedgh-cnn1)",
        )
    if job.quantize:
        raise ConfigError(
            f"--quantize applies to model uploads, not to {job.kind}",
            hint=f"drop --quantize (a {job.kind} upload holds no weights)",
        )
    if job.kind == "prototypes":
        return None
    if not job.public:
        raise ConfigError(
            "a predictions upload needs --public",
            hint="e.g. --public mnist:public, or a .npz of unlabelled samples (array x)",
        )
    if (
        is_carved(job.public)
        and parse_dataset_ref(job.public)[0] != parse_dataset_ref(job.dataset)[0]
    ):
        raise ConfigError(
            f"--public {job.public} is carved from another dataset than --dataset {job.dataset}",
            hint="use <dataset>:public, or a separate public .npz",
        )
    if is_carved(job.public) and job.public_size < 1:
        raise ConfigError(
            f"--public {job.public} needs --public-size >= 1: the same slice must be held out of "
            "every client's data and loaded by the server",
            hint=f"e.g. --public-size {DEFAULT_PUBLIC_SIZE} (and the same on the server)",
        )
    return load_public(
        job.public,
        public_size=job.public_size,
        seed=job.partition_seed,
        subset=job.subset,
        data_dir=job.data_dir,
        partition=str(job.partition),
    )


def export_data_artifact(
    job,
    model: nn.Module,
    spec,
    data,
    train_idx: np.ndarray,
    meta: dict,
    path: Path,
    public,
    prototypes=None,
) -> tuple[exporters.ExportReport, dict[str, Any]]:
    """Write the job's predictions or prototypes artifact; returns (report, its metadata).
    `prototypes`: (classes, means, counts) released already (under --dp), else computed here.
    With `job.keep_model`, the trained model is also exported there, for the device itself
    (FedGH splices the global header into it); keep that directory apart from the uploads."""
    kept = {}
    if job.keep_model:
        kept = {"kept_model": str(Path(job.keep_model) / path.name)}
        export_model(model, spec, meta, Path(kept["kept_model"]))
    base = data_metadata(meta, spec_label(spec))
    if job.kind == "predictions":
        probs = softmax_predictions(model, public)
        report = write_predictions(
            path,
            probs,
            base,
            fingerprint=public_fingerprint(public),
            public=job.public,
            fp16=job.fp16,
        )
    else:
        # Training samples only: the shard's validation part stays a clean local test split.
        classes, means, counts = prototypes or class_prototypes(
            model, data.x[train_idx], data.y[train_idx], data.num_classes
        )
        if prototypes is None and LabelRelease.parse(job.label_counts).mode != "exact":
            counts = None  # the exact histogram --label-counts withholds or noises
        report = write_prototypes(path, classes, means, counts, base)
    return report, exporters.read_artifact(path).metadata | kept


# --- from a trained model to a data upload, and a global output back into the model ---------


def derive_upload(
    kind: str, model_path: str, x: np.ndarray, y: np.ndarray, num_classes: int, path: Path
) -> None:
    """Write the `kind` upload a device computes from its trained classifier (its own file at
    `model_path`, read once and rebuilt) and its training samples x, y."""
    if kind != "prototypes":
        raise ConfigError(
            f"a client cannot derive {kind} uploads from a trained model alone",
            hint="prototypes are derived from a model and its training data",
        )
    art = exporters.read_artifact(model_path)
    module, _ = rebuild(art)
    label = spec_label(ModelSpec.from_dict(art.metadata["spec"]))
    classes, means, counts = class_prototypes(module, x, y, num_classes)
    meta = data_metadata(art.metadata, label)
    privacy = meta.get("privacy")
    if isinstance(privacy, dict):  # exact means: no DP release of prototypes here
        privacy.pop("prototypes", None)
        if (privacy.get("label_counts") or {}).get("release", "exact") != "exact":
            counts = None  # the model's upload withheld or noised its label counts
    write_prototypes(path, classes, means, counts, meta)


def personalize(how: str, model_path: str, global_path: str, out: str) -> dict[str, Any]:
    """Apply a per-client method's global output to this device's model (`Method.personalize`
    names one of `APPLIERS`: the name, not a function, is what travels to a device)."""
    if how not in APPLIERS:
        raise ConfigError(
            f"no way to personalize a model with a {how!r} output",
            hint=f"known: {', '.join(APPLIERS)}",
        )
    return APPLIERS[how](model_path, global_path, out)


# --- FedGH: the global header back into the device's model ------------------------------------


_OWN_MODEL = (
    "pass the model this device kept (`edgefl client prototypes --keep-model DIR` wrote it "
    "there), then the server's header"
)


def apply_header(model_path: str, header_path: str, out: str) -> dict[str, Any]:
    """Replace the head of this device's classifier (its own, trusted artifact) with the server's
    global header, and re-export. The header is validated like any file from outside."""

    try:
        art = exporters.read_artifact(model_path)
    except Exception as exc:
        raise ArtifactError(f"cannot read {model_path}: {exc}", hint=_OWN_MODEL) from None
    if art.kind != "classifier":
        raise ArtifactError(
            f"{model_path} is a {art.kind} artifact, not a classifier", hint=_OWN_MODEL
        )
    try:
        module, why = rebuild(art)
    except (RebuildRejected, ConfigError) as exc:
        raise ArtifactError(f"cannot rebuild {model_path}: {exc}", hint=_OWN_MODEL) from None
    if module is None:
        raise ArtifactError(f"cannot personalize {model_path}: {why}", hint=_OWN_MODEL)
    _, head = representation_layer(module)
    weight, bias = read_header(header_path, head.in_features, head.out_features)
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(weight))
        head.bias.copy_(torch.from_numpy(bias))
    header_meta = exporters.read_artifact(header_path).metadata
    meta = {k: v for k, v in art.metadata.items() if k not in ("schema_version", "weights_sha256")}
    meta["personalized_from"] = {
        "model_sha256": art.metadata["weights_sha256"],
        "header": Path(header_path).name,
        "header_sha256": header_meta["weights_sha256"],
        "method": header_meta.get("method"),
    }
    try:
        report = exporters.export_onnx(
            module,
            (torch.zeros(2, *art.metadata["input_shape"]),),
            out,
            input_names=list(art.input_names),
            output_names=list(art.output_names),
            metadata=meta,
        )
    except exporters.ExportError as exc:
        raise ArtifactError(
            f"exporting the personalized model failed: {exc}",
            hint="check that --out names a file in a folder you can write",
        ) from None
    return {
        "path": report.path,
        "size_bytes": report.size_bytes,
        "representation_size": head.in_features,
        "header": str(header_path),
        "header_method": header_meta.get("method"),
    }


# What a per-client method's output is, by the name a device is sent: how it applies it.
APPLIERS = {"header": apply_header}
