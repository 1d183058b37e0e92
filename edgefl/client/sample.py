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


def sample_grid(path: str, *, per_class: int, out: str, seed: int = 0) -> Path:
    art = read_artifact(path)
    if art.metadata.get("kind") != "decoder":
        raise ArtifactError(
            f"{path} is a {art.metadata.get('kind')!r} artifact, not a decoder",
            hint="pass the .onnx of a client that trained a CVAE",
        )
    from edgefl.data.plots import plot_image_grid, plot_signal_grid

    c = art.metadata["num_classes"]
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(c), per_class)
    shape = art.metadata["input_shape"]
    images = decode(art, labels, rng).reshape(c, per_class, *shape)
    names = art.metadata.get("class_names") or [str(i) for i in range(c)]
    title = f"{art.metadata.get('client_id')}: samples per class"
    if input_kind(shape) == "signal":  # windows of sensor channels: lines, not pixels
        return plot_signal_grid(np.clip(images, 0, 1), out, row_labels=names, title=title)
    return plot_image_grid(np.clip(images, 0, 1), out, row_labels=names, title=title)
