"""A client's model upload written as ONNX: a classifier maps its input to logits, a CVAE
uploads its decoder only. Below client.run (a trained model's upload) and client.weightless
(the device's own model kept beside a predictions or prototypes upload)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.nn import functional as F

import exporters
from edgefl.errors import ArtifactError
from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import role_of


def export_model(model, spec: ModelSpec, meta: dict, path: Path) -> exporters.ExportReport:
    """Classifier: input -> logits. CVAE: the decoder only, (z, label one-hot) -> image."""
    model.eval()
    try:
        if role_of(spec) == "classifier":
            return exporters.export_onnx(
                model,
                (torch.zeros(2, *spec.input_shape),),
                path,
                input_names=["input"],
                output_names=["logits"],
                metadata=meta,
            )
        dec = model.decoder
        n = spec.num_classes

        def sample(batch: int):
            labels = torch.randint(0, n, (batch,))
            return torch.randn(batch, dec.latent_dim), F.one_hot(labels, n).float()

        return exporters.export_onnx(
            dec,
            sample(2),
            path,
            input_names=["z", "label"],
            output_names=["image"],
            metadata=meta | {"latent_dim": dec.latent_dim},
            sample_inputs=sample,
        )
    except exporters.ExportError as exc:
        raise ArtifactError(
            f"export failed: {exc}",
            hint="export another model (--model), and report this one's spec: a bug of edgefl's",
        ) from None
