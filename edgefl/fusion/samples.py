"""Synthetic samples from the decoders: how many of each class from each decoder, the draws
themselves, and FedMHO's class-mean filter over them."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.nn import functional as F

from edgefl.artifacts import Upload
from edgefl.fusion.base import FusionContext, client_label_counts, federation_label_counts
from edgefl.models.zoo import input_kind


def largest_remainder(total: int, weights: np.ndarray) -> np.ndarray:
    """Integers proportional to `weights` that sum to `total` exactly."""
    weights = np.asarray(weights, dtype=np.float64)
    if weights.sum() <= 0:
        weights = np.ones_like(weights)
    raw = total * weights / weights.sum()
    out = np.floor(raw).astype(np.int64)
    order = np.argsort(-(raw - out), kind="stable")
    out[order[: total - out.sum()]] += 1
    return out


def allocate(decoders, class_weights, total: int, power: float = 1.0) -> np.ndarray:
    """(decoders x classes) sample counts: `total` split over the classes by `class_weights`,
    each class's share split among the decoders by their label counts ** `power` (evenly where
    no decoder holds the class)."""
    class_weights = np.asarray(class_weights, dtype=np.float64)
    counts = client_label_counts(decoders, len(class_weights))  # K x C
    per_class = largest_remainder(total, class_weights)
    alloc = np.zeros_like(counts, dtype=np.int64)
    for c in range(len(class_weights)):
        alloc[:, c] = largest_remainder(int(per_class[c]), counts[:, c] ** power)
    return alloc


def generate(decoders, alloc: np.ndarray, seed: int, device, pixels: str = "mean"):
    """The synthetic set `alloc` (from `allocate`) asks for: images and labels, decoder by decoder."""
    gen = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for u, row in zip(decoders, alloc, strict=True):
        labels = np.repeat(np.arange(len(row)), row)
        xs.append(decode(u, labels, gen, device, pixels=pixels))
        ys.append(torch.from_numpy(labels).long())
    return torch.cat(xs), torch.cat(ys)


def class_totals(ctx: FusionContext, decoders, labels: str) -> np.ndarray:
    """How many samples each class gets (in proportion). A class no decoder holds gets none: a
    decoder conditioned on a label it never saw draws its own classes, labelled wrongly."""
    held = federation_label_counts(decoders, ctx.num_classes).astype(np.float64)
    if labels == "decoders":
        return held
    return ctx.label_counts.astype(np.float64) * (held > 0)


LABELS = ("federation", "decoders")
LABELS_HELP = (
    "class totals of the synthetic set: federation (every upload's label counts) or "
    "decoders (only the CVAE clients', FedCVAE's rule)"
)

PIXELS = ("auto", "bernoulli", "mean")
PIXELS_HELP = (
    "synthetic pixels: bernoulli draws from the decoder's outputs (a sample of the "
    "CVAE's Bernoulli likelihood), the outputs themselves (mean), or auto: bernoulli "
    "on images, mean on sensor windows (an acceleration is no coin flip)"
)


def decode(
    upload: Upload,
    labels: np.ndarray,
    gen: torch.Generator,
    device,
    batch: int = 1024,
    pixels: str = "mean",
):
    """Images from one decoder for the given labels, z ~ N(0, I). The CVAEs are trained with a
    per-pixel BCE, i.e. a Bernoulli likelihood whose parameters the decoder outputs: "bernoulli"
    draws each pixel from it (a sample of the model), "mean" returns the outputs themselves,
    blurred averages that no real digit looks like."""
    c = upload.meta["num_classes"]
    out = []
    module = upload.module  # once: a parked upload's is read from disk at each access
    for i in range(0, len(labels), batch):
        lab = torch.from_numpy(labels[i : i + batch]).long()
        z = torch.randn(len(lab), upload.latent_dim, generator=gen)
        onehot = F.one_hot(lab, c).float()
        with torch.no_grad():
            if module is not None:
                img = module.to(device)(z.to(device), onehot.to(device)).float().cpu()
            else:
                img = torch.from_numpy(upload.artifact.run(z.numpy(), onehot.numpy()))
        if _draws(pixels, upload.meta["input_shape"]):
            img = torch.bernoulli(img.clamp(0, 1), generator=gen)
        out.append(img)
    return torch.cat(out) if out else torch.zeros(0, *upload.meta["input_shape"])


def _draws(pixels: str, input_shape) -> bool:
    """Whether decoded outputs are drawn as Bernoulli samples. A pixel's Bernoulli draw is a
    plausible ink dot; a draw of a window's scaled acceleration is one of two full-scale
    extremes (FedCVAE-ENS on HAPT, 10 users, seed 0: 48.1% drawn, 53.6% with the outputs;
    `auto` picks by the input's kind)."""
    if pixels == "auto":
        return input_kind(tuple(input_shape)) == "image"
    return pixels == "bernoulli"


def class_mean_filter(x: torch.Tensor, y: torch.Tensor, keep_ratio: float, num_classes: int):
    """FedMHO's unsupervised filter ("K-means with one cluster" per class): keep the
    ceil(keep_ratio * n_c) samples of each class nearest to the class mean of flattened pixels."""
    keep = []
    for c in range(num_classes):
        idx = torch.nonzero(y == c).flatten()
        if len(idx) == 0:
            continue
        flat = x[idx].flatten(1)
        dist = (flat - flat.mean(0, keepdim=True)).norm(dim=1)
        k = math.ceil(keep_ratio * len(idx))
        keep.append(idx[torch.argsort(dist, stable=True)[:k]])
    keep_idx = torch.cat(keep).sort().values if keep else torch.zeros(0, dtype=torch.long)
    return x[keep_idx], y[keep_idx]


def per_class_counts(y: torch.Tensor, num_classes: int) -> list[int]:
    return torch.bincount(y, minlength=num_classes).tolist()
