"""Model inversion: inputs a frozen classifier maps to given soft labels (data-free
methods' pseudo-samples, `server fuse --for`'s transfer set, the screen's coverage)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from edgefl.fusion.averaging import combine_outputs
from edgefl.fusion.generator import BNStatLoss
from edgefl.fusion.options import option

INVERSION_CHUNK = 256  # images optimised together; each image's loss is its own (sum, not mean)

# Mean `roughness` of a dataset's training images (Fashion-MNIST's 60,000: 49.24), a statistic
# of the data like a paper's per-dataset setting: where a smoothness prior leaves images free.
REAL_ROUGHNESS = {"fmnist": 49.24}


# The `smooth` option's help where a generator (DENSE, FedHydra) pays the prior.
GENERATOR_SMOOTH_HELP = (
    "generator loss: weight of a smoothness prior on its images (each image's squared steps "
    "between neighbouring values past `smooth_from`, averaged over the batch; 0: the "
    "paper's loss)"
)


def smooth_from_option():
    """The `smooth_from` option of methods with a smoothness prior: real images' roughness where
    it was measured, 0 elsewhere (charged from the first step)."""
    return option(
        None,
        "roughness an image keeps free of the smoothness prior, which charges smooth * "
        "max(0, roughness - this): real images' mean, so only detail no real image has is taken",
        otherwise=0.0,
        by_dataset=REAL_ROUGHNESS,
        low=0,
    )


def invert(
    teacher: nn.Module | list[nn.Module],
    targets: torch.Tensor,
    input_shape,
    *,
    steps: int,
    lr: float,
    tau: float,
    gen: torch.Generator,
    device: torch.device,
    init_std: float = 1.0,
    smooth: float = 0.0,
    smooth_from: float = 0.0,
    bn: float = 0.0,
) -> torch.Tensor:
    """Pseudo-images x with softmax(teacher(x) / tau) ~ targets: Adam on v, x = sigmoid(v),
    v ~ N(0, init_std^2 I). Only v gets gradients: the teacher's parameters are never touched.
    `smooth` weighs a prior that real inputs satisfy and the teacher's loss does not ask for:
    the squared differences of neighbouring samples along every spatial axis (`roughness`),
    charged only past `smooth_from` (real inputs' own roughness: detail no real input has).

    Adam moves every coordinate of v by about `lr` per step whatever its gradient, so what the
    teacher ignores drifts as far as what it reads, and the start's noise stays: x carries
    noise of the size of init_std and lr * steps. Pixels saturate at 0 or 1 anyway; a sensor
    window's information is a small deviation around its range's centre, which that noise
    drowns (`inversion_defaults`).

    `bn` weighs DeepInversion's prior (Yin et al. 2020): at each BatchNorm layer of the teacher,
    the distance of the chunk's mean and variance of the layer's input from the layer's running
    ones, i.e. from what the teacher's own training data gave there (`BNStatLoss`; a teacher
    without BatchNorm adds nothing). It is a batch's term, so it is scaled by the chunk's size
    to weigh against the summed cross-entropy as against a mean. Teachers in a list: their mean."""
    teachers = [t.to(device).eval() for t in (teacher if isinstance(teacher, list) else [teacher])]
    stats = BNStatLoss(teachers) if bn else None
    if stats is not None:
        stats.recording = True  # every pass here is the teacher's own
    out = []
    try:
        for chunk in targets.split(INVERSION_CHUNK):
            y = chunk.to(device)
            v = init_std * torch.randn(len(y), *input_shape, generator=gen)
            v = v.to(device).requires_grad_(True)
            opt = torch.optim.Adam([v], lr=lr)
            for _ in range(steps):
                x = torch.sigmoid(v)
                logp = _log_mean_softmax(teachers, x, tau)
                # soft-target cross-entropy, summed: images are independent
                loss = -(y * logp).sum()
                if smooth:
                    loss = loss + smooth * excess_roughness(x, smooth_from).sum()
                if stats is not None:
                    loss = loss + bn * len(y) * stats.value(device)
                    stats.reset()
                (v.grad,) = torch.autograd.grad(loss, [v])
                opt.step()
            out.append(torch.sigmoid(v).detach().cpu())
    finally:
        if stats is not None:
            stats.remove()  # the teacher leaves as it came: no hooks
    return torch.cat(out) if out else torch.zeros(0, *input_shape)


def _log_mean_softmax(teachers: list[nn.Module], x: torch.Tensor, tau: float) -> torch.Tensor:
    """log of the teachers' mean softmax(T(x) / tau) (the ensemble's `probabilities`); one
    teacher's log_softmax as it was, bit for bit."""
    if len(teachers) == 1:
        return F.log_softmax(teachers[0](x) / tau, dim=1)
    return combine_outputs(torch.stack([t(x) / tau for t in teachers]), "probabilities")


def roughness(x: torch.Tensor) -> torch.Tensor:
    """Per sample, the sum of squared differences between neighbouring values along every spatial
    axis (dims 2 and up; an axis of size 1, like a window's (C, 1, L) middle one, adds nothing):
    a window's steps in time, an image's in both directions."""
    total = torch.zeros(len(x), dtype=x.dtype, device=x.device)
    for dim in range(2, x.dim()):
        if x.shape[dim] > 1:
            total = total + x.diff(dim=dim).pow(2).flatten(1).sum(1)
    return total


def excess_roughness(x: torch.Tensor, free: float | None) -> torch.Tensor:
    """Per sample, the `roughness` past `free` (a smoothness prior's charge: only detail no real
    input has)."""
    return (roughness(x) - (free or 0.0)).clamp_min(0)
