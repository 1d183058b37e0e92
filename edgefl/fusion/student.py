"""Training a fused model: the KD loss, the step and epoch loops every student and generator
trains in, the jitter and mixes of its samples, and `train_student` on a fixed set."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from edgefl.errors import ConfigError, FusionError
from edgefl.models.augment import CHOICES as AUGMENT_CHOICES
from edgefl.models.augment import jitter
from edgefl.models.zoo import input_kind
from edgefl.progress import no_progress


def kd_loss(student_logits, teacher_logits, reduction: str) -> torch.Tensor:
    """KL(softmax(teacher) || softmax(student)). reduction "mean" averages over batch AND classes
    (FedMHO's code: the KD term is scaled by 1/C); "batchmean" is the textbook KL per sample."""
    kl = F.kl_div(
        F.log_softmax(student_logits, 1), F.softmax(teacher_logits, 1), reduction="batchmean"
    )
    return kl / student_logits.shape[1] if reduction == "mean" else kl


def _per_sample_loss(logits, y, teacher, lam, kd_reduction: str, device) -> torch.Tensor:
    lam = lam.to(device)
    ce = F.cross_entropy(logits, y.to(device), reduction="none")
    kl = F.kl_div(F.log_softmax(logits, 1), F.softmax(teacher.to(device), 1), reduction="none")
    kl = kl.sum(1) / (logits.shape[1] if kd_reduction == "mean" else 1)
    return (lam * ce + (1 - lam) * kl).mean()


AUGMENT = AUGMENT_CHOICES
AUGMENT_HELP = (
    "training-time jitter of synthetic samples: affine (images: a random small "
    "rotation, scale and shift per sample and step), rotate (sensor windows: a random "
    "small 3-D rotation and gain), auto (affine on images, rotate on windows) or none"
)

# "clients": the jitter the clients' classifiers trained under by default (edgefl.client.run).
# A student of decoders' samples trains under it: their teachers and labels are invariant to it
# near real data, and on windows the test users' own orientations need it (FedMHO on issue 32's
# command: 73.35 -> 84.54, bench/results/fedmho_windows.md). Images: the clients train with no
# jitter, and an affine one cost FedHydra 18 points on MNIST Dir(0.1). The generator methods
# default to none (generator.GeneratorConfig says why).
STUDENT_JITTER_HELP = (
    "clients (the clients' own default: rotate on sensor windows, none on images), or "
    + AUGMENT_HELP
)


def student_jitter(augment: str, input_shape) -> str:
    """`augment` for `edgefl.models.augment.jitter`: "clients" is the jitter a client's
    classifier trains under by default (edgefl.client.run: rotate on sensor windows, else none)."""
    if augment != "clients":
        return augment
    return "none" if input_kind(tuple(input_shape)) == "image" else "rotate"


def pair_mixes(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """As many mixes lam * x_i + (1 - lam) * x_j as x has rows: lam ~ U(0, 1) per row, j a random
    permutation of the rows (drawn from `gen` in that order). A distilled student meets the
    teachers only at the samples it is shown; mixes ask the teachers between them."""
    lam = torch.rand(len(x), generator=gen).view(-1, *[1] * (x.dim() - 1)).to(x.device)
    return lam * x + (1 - lam) * x[torch.randperm(len(x), generator=gen).to(x.device)]


def descend(
    opt: torch.optim.Optimizer, loss: torch.Tensor, what: str = "the student", rate: str = "lr"
) -> float:
    """One step of `opt` on `loss`, the step every fused model's training loop takes; returns the
    loss. A non-finite loss stops the fusion before the step: past it every weight, and so every
    later output, is NaN, and the export would carry a model that cannot classify. `rate` is
    the option whose lowering the message suggests (a generator's is gen_lr)."""
    value = float(loss.detach())
    if not math.isfinite(value):
        raise FusionError(
            f"{what}'s training loss became {value}: its weights would be NaN from this step on",
            hint=f"lower the method's learning rate (--opt {rate}=...), or check the uploads it "
            "learns from",
        )
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return value


def shuffled_epochs(
    opt: torch.optim.Optimizer,
    n: int,
    loss_of,
    *,
    epochs: int,
    batch_size: int,
    gen: torch.Generator,
    progress=None,
    task: str = "epoch",
    note: str = "loss",
    what: str = "the student",
    after_step=None,
) -> list[float]:
    """The loop every fused model that learns from a fixed set trains in: `epochs` passes over
    its n samples, each in a fresh order drawn from `gen`, one `descend` per batch on
    `loss_of(indices)` (then `after_step()`, e.g. a rate schedule). Returns each epoch's mean
    loss per sample; reports each epoch to `progress` (if any) as `task`, its loss named `note`."""
    progress = progress or no_progress
    history = []
    progress(task, 0, epochs)
    for epoch in range(epochs):
        total = 0.0
        for idx in torch.randperm(n, generator=gen).split(batch_size):
            total += descend(opt, loss_of(idx), what) * len(idx)
            if after_step is not None:
                after_step()
        history.append(total / n)
        progress(task, epoch + 1, epochs, f"{note} {history[-1]:.4f}")
    return history


def pool_batches(n: int, batch_size: int, steps: int, rng: torch.Generator) -> list[torch.Tensor]:
    """The batches a pool of n synthetic samples is distilled in: one shuffled pass, or with
    `steps` (> 0) exactly that many batches, from fresh permutations as the pool allows
    (DENSE's and Co-Boosting's kd_steps)."""
    batches = list(torch.randperm(n, generator=rng).split(batch_size))
    if steps:
        while len(batches) < steps:
            batches += list(torch.randperm(n, generator=rng).split(batch_size))
        batches = batches[:steps]
    return batches


def _check_training(samples: int, kd_reduction: str) -> None:
    if samples == 0:
        raise FusionError(
            "no training samples left to train the global model on",
            hint="give the method samples: more --synthetic, a larger --public set, more uploads",
        )
    if kd_reduction not in ("mean", "batchmean"):
        raise ConfigError(
            f"--kd-reduction must be mean or batchmean, got {kd_reduction!r}",
            hint="--kd-reduction mean or --kd-reduction batchmean",
        )


def train_student(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor | None,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    device: torch.device,
    teacher: torch.Tensor | None = None,
    lam: float | torch.Tensor = 1.0,
    kd_reduction: str = "mean",
    optimizer: str = "adam",
    augment: str = "none",
    logit_bias: torch.Tensor | None = None,
    progress=None,
) -> list[float]:
    """Train on (x, y) with loss lam * CE(y) + (1 - lam) * KL(teacher || student); `lam` is one
    number or one per sample (each sample's two terms weighted, then averaged over the batch).
    `teacher` holds precomputed teacher logits for x (they never change: computed once).
    `logit_bias` (C,) is added to the student's logits in the loss only: a large negative entry
    takes that class out of the softmax, so no sample pushes its logit down."""
    _check_training(len(x), kd_reduction)
    gen = torch.Generator().manual_seed(seed)
    model.to(device).train()
    params = model.parameters()
    opt = (
        torch.optim.Adam(params, lr=lr)
        if optimizer == "adam"
        else torch.optim.SGD(params, lr=lr, momentum=0.9)
    )

    def loss_of(idx):
        logits = model(jitter(x[idx], augment, gen).to(device))
        if logit_bias is not None:
            logits = logits + logit_bias.to(device)
        if isinstance(lam, torch.Tensor):
            return _per_sample_loss(logits, y[idx], teacher[idx], lam[idx], kd_reduction, device)
        loss = torch.zeros((), device=device)
        if lam > 0 and y is not None:
            loss = loss + lam * F.cross_entropy(logits, y[idx].to(device))
        if lam < 1 and teacher is not None:
            loss = loss + (1 - lam) * kd_loss(logits, teacher[idx].to(device), kd_reduction)
        return loss

    history = shuffled_epochs(
        opt,
        len(x),
        loss_of,
        epochs=epochs,
        batch_size=batch_size,
        gen=gen,
        progress=progress,
    )
    model.eval()
    return history
