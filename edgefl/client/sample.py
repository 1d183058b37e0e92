"""Drawing from an uploaded decoder through onnxruntime (no torch needed on the server side)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgefl.errors import ArtifactError
from edgefl.models.zoo import input_kind
from exporters import read_artifact


def decode(artifact, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    meta = artifact.metadata
    z = rng.standard_normal((len(labels), meta["latent_dim"])).astype(np.float32)
    onehot = np.eye(meta["num_classes"], dtype=np.float32)[labels]
    return artifact.run(z, onehot)


def held_classes(meta: dict) -> list[bool] | None:
    """Per class, whether the client trained on any sample of it (its upload's `label_counts`);
    None when the upload does not say (then no row is marked)."""
    counts = meta.get("label_counts")
    if not counts or len(counts) != meta.get("num_classes"):
        return None
    return [int(n) > 0 for n in counts]


MAX_PER_CLASS = 32  # draws a row: the picture's width caps it, and past this they blur


def sample_grid(path, *, per_class: int, out: str, seed: int = 0) -> Path:
    """Save a picture of `per_class` draws per class from a decoder (a path, or an artifact
    already read); rows of classes the client never held are greyed and labelled "not held"
    (the decoder was never taught them)."""
    from edgefl.plots import save_figure

    return save_figure(sample_figure(path, per_class=per_class, seed=seed), out)


def sample_figure(path, *, per_class: int, seed: int = 0):
    """The Figure `sample_grid` saves (tests read its axes)."""
    art = read_artifact(path) if isinstance(path, str | Path) else path
    if art.metadata.get("kind") != "decoder":
        raise ArtifactError(
            f"{art.path} is a {art.metadata.get('kind')!r} artifact, not a decoder",
            hint="pass the .onnx of a client that trained a CVAE",
        )
    from edgefl.data.plots import image_grid_figure, signal_grid_figure

    c = art.metadata["num_classes"]
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(c), per_class)
    shape = art.metadata["input_shape"]
    images = np.clip(decode(art, labels, rng).reshape(c, per_class, *shape), 0, 1)
    names = art.metadata.get("class_names") or [str(i) for i in range(c)]
    from edgefl.plots import label_text

    # the id is the upload's text: drawn as written, never as mathtext
    title = f"{label_text(art.metadata.get('client_id'), limit=60)}: samples per class"
    held = held_classes(art.metadata)
    if input_kind(shape) == "signal":  # windows of sensor channels: lines, not pixels
        return signal_grid_figure(images, row_labels=names, title=title, held=held)
    return image_grid_figure(images, row_labels=names, title=title, held=held)
