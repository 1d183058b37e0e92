"""FedDF: ensemble distillation on unlabeled public data (Lin et al., NeurIPS 2020), one-shot.

The server loads the public set itself (`--opt public=mnist:public`: the same slice every client
held out, see edgefl.data.public.load_public), labels it with the mean logits of the classifier
uploads (the paper's AVGLOGITS), and distils a student with KL at temperature T, Adam with cosine
annealing. The student is fresh (`--student`, any zoo classifier), or, with `init=average`, starts
from the parameter average of same-architecture uploads as in the paper.

Its public-set options are `fusion.public_set`'s, shared with FedOL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from edgefl.fusion.averaging import average_classifiers, one_architecture
from edgefl.fusion.base import (
    FusionContext,
    FusionResult,
    Method,
    fedhydra_table1,
    fedmho_table3,
    pfedzkd_table2,
)
from edgefl.fusion.config import PublicSetConfig
from edgefl.fusion.options import option
from edgefl.fusion.public_set import public_samples
from edgefl.fusion.student import shuffled_epochs
from edgefl.fusion.teachers import mean_teacher_logits
from edgefl.models.zoo import spec_label


@dataclass(frozen=True)
class FedDFConfig(PublicSetConfig):
    """Paper: Adam lr 1e-3 with cosine annealing, AVGLOGITS teachers, up to 1e4 steps with
    early stopping on a validation set we do not have. Ours: a fixed number of epochs over the
    public set, T = 1 (plain softmax of the averaged logits), batch 64."""

    student: str = option(
        "auto",
        "zoo architecture of the student, e.g. scnn:width=32 (auto: "
        "cnn on images, cnn1d on sensor windows)",
    )
    init: str = option(
        "fresh",
        "fresh student, or the uploads' parameter average (the paper's)",
        choices=("fresh", "average"),
    )
    epochs: int = option(20, "distillation epochs over the public set", low=1)
    lr: float = option(1e-3, "Adam learning rate (cosine annealed)", low=0, low_open=True)
    batch_size: int = option(64, "distillation batch size", low=1)
    temperature: float = option(1.0, "distillation temperature T", low=0, low_open=True)


def kl_at(student_logits, target_probs, temperature: float) -> torch.Tensor:
    """KL(target || softmax(student / T)) per sample, mean over the batch, scaled by T^2 so the
    gradients do not shrink with the temperature (Hinton et al. 2015)."""
    log_s = F.log_softmax(student_logits / temperature, 1)
    kl = (torch.xlogy(target_probs, target_probs) - target_probs * log_s).sum(1)
    return kl.mean() * temperature**2


def fuse(ctx: FusionContext, cfg: FedDFConfig) -> FusionResult:
    teachers = ctx.require("classifier")
    with ctx.stage("public"):
        x = torch.from_numpy(public_samples(ctx, cfg))
    with ctx.stage("teacher"):
        targets = torch.softmax(mean_teacher_logits(teachers, x, ctx.device) / cfg.temperature, 1)
    if cfg.init == "average":
        kept, left = one_architecture(teachers, "feddf --init average")
        ctx.set_aside(left, used_for="teachers")  # the start is one architecture's average
        spec, student = average_classifiers(kept, "feddf --init average")
        student = student.to(ctx.device)
    else:
        spec, student = ctx.student(cfg.student)
    opt = torch.optim.Adam(student.parameters(), lr=cfg.lr)
    steps = cfg.epochs * math.ceil(len(x) / cfg.batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    gen = torch.Generator().manual_seed(cfg.seed)

    def loss_of(idx):
        logits = student(x[idx].to(ctx.device))
        return kl_at(logits, targets[idx].to(ctx.device), cfg.temperature)

    with ctx.stage("distill"):
        student.train()
        history = shuffled_epochs(
            opt,
            len(x),
            loss_of,
            epochs=cfg.epochs,
            batch_size=cfg.batch_size,
            gen=gen,
            progress=ctx.progress,
            note="KL",
            after_step=sched.step,
        )
    student.eval()
    info = {
        "teachers": [u.client_id for u in teachers],
        "public_samples": len(x),
        "student": spec_label(spec),
        "loss_history": history,
    }
    return FusionResult(student, spec, info, samples=x)


METHOD = Method(
    name="feddf",
    description="ensemble distillation of the classifiers into a student on a public set",
    paper="Lin et al., FedDF, NeurIPS 2020",
    consumes=("classifier",),
    needs_modules=False,  # teachers only run forward (onnxruntime for non-rebuildable ones)
    config_cls=FedDFConfig,
    fuse=fuse,
    references=fedmho_table3((88.73, 78.46, 62.58))
    + fedmho_table3((65.66, 59.21, 42.21), "fmnist")
    + pfedzkd_table2((65.34, 78.12, 89.23))
    + pfedzkd_table2((45.78, 62.56, 67.85), "fmnist")
    + fedhydra_table1((78.23, 73.59, 31.52, 10.10))
    + fedhydra_table1((73.44, 65.61, 46.68, 40.36), "fmnist"),
)
