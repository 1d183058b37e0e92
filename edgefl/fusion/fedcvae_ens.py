"""FedCVAE-Ens (Heinbaugh et al., ICLR 2023), as FedMHO's baseline: every client uploads a CVAE
decoder and its label counts; the server samples each decoder in proportion to its client's
data share, with labels drawn from that client's label distribution, and trains a classifier
from scratch on the union."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from edgefl.fusion.base import (
    PIXELS,
    PIXELS_HELP,
    FusionConfig,
    FusionContext,
    FusionResult,
    Method,
    decode,
    fedmho_table3,
    largest_remainder,
    per_class_counts,
    train_student,
)
from edgefl.fusion.options import option


@dataclass(frozen=True)
class FedCVAEConfig(FusionConfig):
    synthetic: int = option(5_000, "samples generated (the official code's count)", low=1)
    student: str = option("cnn", "zoo architecture of the global model, trained from scratch")
    epochs: int = option(20, "global training epochs", low=1)
    lr: float = option(1e-3, "global Adam learning rate", low=0, low_open=True)
    batch_size: int = option(64, "global batch size", low=1)
    # A classifier trained from scratch on the decoders' mean images (blurred averages) meets
    # sharp real digits at test time; drawing the pixels: +2.3 points on MNIST Dir(0.5)
    # (bench/results/fedcvae_diagnosis.md).
    pixels: str = option("bernoulli", PIXELS_HELP, choices=PIXELS)


def fuse(ctx: FusionContext, cfg: FedCVAEConfig) -> FusionResult:
    decoders = ctx.require("decoder", "fedcvae-ens")
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    sizes = np.array([u.label_counts.sum() for u in decoders], dtype=np.float64)
    per_client = largest_remainder(cfg.synthetic, sizes)
    xs, ys = [], []
    with ctx.stage("generate"):
        for u, n in zip(decoders, per_client, strict=True):
            pmf = u.label_counts / u.label_counts.sum()
            labels = rng.choice(ctx.num_classes, size=int(n), p=pmf)
            xs.append(decode(u, labels, gen, ctx.device, pixels=cfg.pixels))
            ys.append(torch.from_numpy(labels).long())
    x, y = torch.cat(xs), torch.cat(ys)
    spec, model = ctx.student(cfg.student)
    with ctx.stage("train"):
        history = train_student(
            model, x, y, epochs=cfg.epochs, lr=cfg.lr, batch_size=cfg.batch_size,
            seed=cfg.seed, device=ctx.device, log=ctx.log,
        )  # fmt: skip
    info = {
        "synthetic_per_client": dict(
            zip([u.client_id for u in decoders], per_client.tolist(), strict=True)
        ),
        "synthetic_per_class": per_class_counts(y, ctx.num_classes),
        "loss_history": history,
    }
    return FusionResult(model, spec, info)


METHOD = Method(
    name="fedcvae-ens",
    description="decoders only: sample by data share and label pmf, train a classifier from scratch",
    paper="Heinbaugh et al., ICLR 2023 (FedCVAE-Ens; baseline in FedMHO)",
    consumes=("decoder",),
    needs_gradients=False,
    config_cls=FedCVAEConfig,
    fuse=fuse,
    references=fedmho_table3((92.61, 91.37, 89.73)),
)
