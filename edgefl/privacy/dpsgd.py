"""DP-SGD (Abadi et al. 2016) for edgefl's models: one epoch of noisy, clipped steps.

Each step draws a Poisson batch (every sample in with probability q, as the accountant assumes),
computes each sample's gradient with torch.func (vmap of grad over a functional call), clips it to
L2 norm C over all parameters, sums, adds N(0, (sigma C)^2) to every coordinate and divides by the
expected batch size q n: a fixed divisor, so one sample moves the update by at most C / (q n).
Randomness inside the model (a CVAE's reparameterisation, dropout) is drawn per sample
(vmap's randomness="different"). BatchNorm mixes the samples of a batch, so a model holding one
cannot be trained this way: `dp_ready` says so and `replace_batchnorm` gives a form that can.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from edgefl.privacy.config import steps_per_epoch

# loss_of_one(forward, x, y): the loss of one sample, given as a batch of one (so the model and
# its loss run unchanged); `forward(*inputs)` is the model with the parameters being differentiated.
LossOfOne = Callable[[Callable[..., Any], torch.Tensor, torch.Tensor], torch.Tensor]
Transform = Callable[[torch.Tensor], torch.Tensor]  # e.g. augmentation, per sample


def poisson_batch(n: int, sample_rate: float, gen: torch.Generator) -> torch.Tensor:
    """Indices of a Poisson batch: each of n samples in independently with probability q."""
    return torch.nonzero(torch.rand(n, generator=gen) < sample_rate).flatten()


def _trainable(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: p for k, p in model.named_parameters() if p.requires_grad}


def per_sample_grads(
    model: nn.Module, loss_of_one: LossOfOne, xb: torch.Tensor, yb: torch.Tensor
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """({parameter name: gradients stacked over the batch}, each sample's loss)."""
    params = {k: p.detach() for k, p in _trainable(model).items()}
    # Frozen parameters and buffers enter the call as constants.
    frozen = {k: p for k, p in model.named_parameters() if not p.requires_grad}
    frozen.update(model.named_buffers())

    def loss(p, x, y):
        def forward(*inputs):
            return functional_call(model, (p, frozen), inputs)

        value = loss_of_one(forward, x.unsqueeze(0), y.unsqueeze(0))
        return value, value.detach()

    grads, losses = vmap(grad(loss, has_aux=True), in_dims=(None, 0, 0), randomness="different")(
        params, xb, yb
    )
    return grads, losses


def clipped_sum(
    model: nn.Module,
    loss_of_one: LossOfOne,
    xb: torch.Tensor,
    yb: torch.Tensor,
    clip: float,
    chunk: int | None = None,
) -> tuple[dict[str, torch.Tensor], float]:
    """(sum over the batch of each sample's gradient scaled to L2 norm <= clip, summed loss).
    `chunk` samples at a time bounds the per-sample gradients held at once (memory)."""
    sums = {k: torch.zeros_like(p) for k, p in _trainable(model).items()}
    loss_sum = 0.0
    step = chunk or max(1, len(xb))
    for i in range(0, len(xb), step):
        grads, losses = per_sample_grads(model, loss_of_one, xb[i : i + step], yb[i : i + step])
        # Each sample's norm over all parameters, without copying its gradients into one vector.
        norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads.values()))
        # min(1, C / ||g||): the 1e-12 only guards a zero gradient.
        scale = (clip / (norms + 1e-12)).clamp(max=1.0)
        for k, g in grads.items():
            sums[k] += torch.einsum("b,b...->...", scale, g)
        loss_sum += float(losses.sum())
    return sums, loss_sum


def noisy_step(
    model: nn.Module,
    sums: dict[str, torch.Tensor],
    noise_multiplier: float,
    clip: float,
    expected_batch: float,
    opt: torch.optim.Optimizer,
    gen: torch.Generator,
) -> None:
    """Add N(0, (sigma C)^2) to each summed coordinate, divide by the expected batch, step."""
    for k, p in _trainable(model).items():
        # Drawn on the CPU from the seeded generator (as the batches are): reproducible anywhere.
        noise = torch.normal(0.0, noise_multiplier * clip, p.shape, generator=gen)
        p.grad = (sums[k] + noise.to(p.device, p.dtype)) / expected_batch
    opt.step()
    opt.zero_grad(set_to_none=True)


def dp_train_epoch(
    model: nn.Module,
    loss_of_one: LossOfOne,
    xt: torch.Tensor,
    yt: torch.Tensor,
    *,
    sample_rate: float,
    noise_multiplier: float,
    clip: float,
    opt: torch.optim.Optimizer,
    gen: torch.Generator,
    steps: int | None = None,
    transform: Transform | None = None,
    chunk: int | None = None,
) -> float:
    """One epoch of DP-SGD (`steps`, default 1/q, Poisson batches); the mean loss per sample
    drawn (nan if every batch came out empty). Every step adds noise, an empty batch's too:
    the accountant counts each step's release, whatever its batch held. The loss is computed
    from the private data without noise: keep it on the device."""
    n = len(xt)
    total, count = 0.0, 0
    for _ in range(steps or steps_per_epoch(sample_rate)):
        idx = poisson_batch(n, sample_rate, gen).to(xt.device)
        xb, yb = xt[idx], yt[idx]
        if transform is not None and len(idx):
            xb = transform(xb)
        if len(idx):
            sums, loss_sum = clipped_sum(model, loss_of_one, xb, yb, clip, chunk)
        else:
            sums, loss_sum = {k: torch.zeros_like(p) for k, p in _trainable(model).items()}, 0.0
        noisy_step(model, sums, noise_multiplier, clip, sample_rate * n, opt, gen)
        total += loss_sum
        count += len(idx)
    return total / count if count else math.nan


# --- models DP-SGD can train ----------------------------------------------------------------

_BATCHNORM = nn.modules.batchnorm._BatchNorm  # BatchNorm1d/2d/3d, SyncBatchNorm, lazy forms


def dp_ready(model: nn.Module) -> str | None:
    """None if per-sample gradients are well defined for `model`, else why not, naming the
    first layer in the way."""
    for name, module in model.named_modules():
        if isinstance(module, _BATCHNORM):
            return (
                f"layer {name!r} is {type(module).__name__}: it normalises over the batch, so "
                "one sample's gradient depends on the others and cannot be clipped alone"
            )
    return None


def group_norm_for(bn: nn.Module) -> nn.Module:
    """A per-sample stand-in for a BatchNorm layer of C channels: GroupNorm with the most groups
    <= 32 (Wu & He 2018's default) that still leave >= 2 channels per group, since a group of one
    channel on a 1-d or 1x1 input normalises a single value to 0; Identity when C < 2. The
    BatchNorm's affine scale and shift carry over (per channel in both)."""
    c = bn.num_features
    if c < 2:
        return nn.Identity()
    groups = max(g for g in range(1, min(32, c // 2) + 1) if c % g == 0)
    gn = nn.GroupNorm(groups, c, eps=bn.eps, affine=bn.affine)
    if bn.affine:
        gn.to(bn.weight.device, bn.weight.dtype)
        with torch.no_grad():
            gn.weight.copy_(bn.weight)
            gn.bias.copy_(bn.bias)
    return gn


def replace_batchnorm(model: nn.Module) -> nn.Module:
    """Swap every BatchNorm layer of `model` for `group_norm_for`'s stand-in, in place (the
    model is returned too). The state dict changes (no running statistics): a server rebuilding
    the model must build the same form."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, _BATCHNORM):
                setattr(module, name, group_norm_for(child))
    return model
