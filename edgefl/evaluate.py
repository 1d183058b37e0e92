"""Evaluating an ONNX model on a dataset split through onnxruntime (what a user would deploy)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import exporters
from edgefl.data import DATASETS, load_dataset
from edgefl.errors import ArtifactError
from edgefl.progress import printable


@dataclass
class EvalResult:
    dataset: str
    split: str
    samples: int
    accuracy: float
    per_class: list[float]
    confusion: np.ndarray
    class_names: tuple[str, ...] = ()  # the dataset's (the model may name none)

    def as_dict(self) -> dict:
        return {
            "dataset": self.dataset,
            "split": self.split,
            "samples": self.samples,
            "accuracy": self.accuracy,
            "per_class_accuracy": self.per_class,
            "confusion": self.confusion.tolist(),
        }


CLASSIFIER_KINDS = ("classifier", "global")


def require_classifier(
    art: exporters.Artifact, path, verb: str, decoder_ok: bool = False, strict: bool = False
) -> None:
    """`art` classifies one sample (`decoder_ok`: or is a decoder): what `eval`, `infer` and
    `deploy` (the command's `verb`) can run. A decoder, a data upload (prototypes,
    predictions) and a partial model (a FedGH header) are each named, with what to do.
    `strict` (deploy's converters): one input named "input" of an image or window shape."""
    kind = art.kind
    if kind is None:  # a model no edgefl client exported: its run says what it takes
        return
    if kind == "decoder" and not decoder_ok:
        raise ArtifactError(
            f"{path} is a CVAE decoder upload: it generates samples, it does not classify",
            hint=f"{verb} a classifier: the global model from `edgefl server fuse`, or a "
            "client's own classifier (`edgefl client sample` draws a decoder's images)",
        )
    if kind not in CLASSIFIER_KINDS + (("decoder",) if decoder_ok else ()):
        raise ArtifactError(
            f"{path} is a {kind} artifact (data, not a model)",
            hint=f"{verb} a classifier or global model (.onnx) instead",
        )
    shape = art.metadata.get("input_shape") or []
    inputs = art.input_names
    partial = "representation" in inputs or len(inputs) != 1 or len(art.output_names) != 1
    if strict:
        partial = partial or inputs != ["input"] or len(shape) < 2
    if kind != "decoder" and partial:
        raise ArtifactError(
            f"{path} takes {art.input_names} of shape {shape}, not one sample: a FedGH header "
            "or another partial model",
            hint="apply it first (`edgefl client apply-header MODEL.onnx HEADER.onnx --out "
            f"personalized.onnx`) and {verb} the result",
        )


def trained_on(art: exporters.Artifact) -> str | None:
    """The dataset the model's metadata names (a client's upload, a global model since
    1ffc1e5), None where it names none; upload text, shown escaped by the caller."""
    name = art.metadata.get("dataset")
    return name if isinstance(name, str) and name else None


def other_dataset(art: exporters.Artifact, name: str) -> str | None:
    """The registered dataset the model names where `name` is another registered one (of the
    same shape it passes every shape check: Fashion's model on MNIST digits), else None."""
    return other_registered(trained_on(art), name)


def other_registered(own, name: str) -> str | None:
    """`own` (a dataset a model names: upload text) where both it and `name` are registered
    datasets and they differ, else None."""
    registered = isinstance(own, str) and own in DATASETS and name in DATASETS
    return own if registered and own != name else None


def _own_data_hint(art: exporters.Artifact) -> str:
    own = trained_on(art)
    return "evaluate on the dataset the federation trained on" + (
        f" ({printable(own)}, as the model's metadata says)" if own else ""
    )


def evaluate_artifact(
    art: exporters.Artifact, dataset: str, split: str = "test", data_dir=None, batch: int = 1000
) -> EvalResult:
    require_classifier(art, art.path, "evaluate")
    data = load_dataset(dataset, split, data_dir=data_dir)
    shape = tuple(art.metadata.get("input_shape", data.input_shape))
    if data.input_shape != shape:
        raise ArtifactError(
            f"model expects inputs {shape}, dataset {dataset} has {data.input_shape}",
            hint=_own_data_hint(art),
        )
    c = int(art.metadata.get("num_classes", data.num_classes))
    if c != data.num_classes:
        raise ArtifactError(
            f"model predicts {c} classes, dataset {dataset} has {data.num_classes}",
            hint=_own_data_hint(art),
        )
    chunks = []
    for i in range(0, len(data), batch):
        try:  # a model from another tool may expect other inputs or need external data
            logits = art.run(data.x[i : i + batch])
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise ArtifactError(
                f"onnxruntime cannot run {art.path} on {dataset}: {first}",
                hint=f"pass a classifier that takes a batch of {dataset}'s samples "
                f"{list(data.input_shape)}, e.g. a global model `server fuse` wrote",
            ) from None
        if logits.ndim != 2 or logits.shape[1] != c:
            raise ArtifactError(
                f"model output has shape {list(logits.shape)}, expected [batch, {c}] for {dataset}",
                hint=f"pass a classifier with one output of {c} logits (one per class), "
                "e.g. a global model `server fuse` wrote",
            )
        chunks.append(logits.argmax(1))
    preds = np.concatenate(chunks)
    confusion = np.zeros((c, c), dtype=np.int64)
    np.add.at(confusion, (data.y, preds), 1)
    support = confusion.sum(1)
    per_class = [
        float(confusion[i, i] / support[i]) if support[i] else float("nan") for i in range(c)
    ]
    accuracy = float((preds == data.y).mean())
    names = tuple(data.class_names)
    return EvalResult(data.name, split, len(data), accuracy, per_class, confusion, names)


def parse_eval_ref(ref: str) -> tuple[str, str]:
    from edgefl.data import parse_dataset_ref

    name, split = parse_dataset_ref(ref)
    return name, split or "test"
