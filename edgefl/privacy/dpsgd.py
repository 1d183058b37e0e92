"""DP-SGD (Abadi et al. 2016) for edgefl's models: one epoch of noisy, clipped steps.

Each step draws a Poisson batch (every sample in with probability q, as the accountant assumes),
computes each sample's gradient with torch.func (vmap of grad over a functional call), clips it to
L2 norm C over all parameters, sums, adds N(0, (sigma C)^2) to every coordinate and divides by the
expected batch size q n: a fixed divisor, so one sample moves the update by at most C / (q n).
Randomness inside the model (a CVAE's reparameterisation, dropout) is drawn per sample
(vmap's randomness="different"). BatchNorm mixes the samples of a batch, so a model holding one
cannot be trained this way: `dp_ready` says so and `replace_batchnorm` gives a form that can.

Memory (what `edgefl.models.cost.Costs.dp_train_bytes` counts): a batch is gathered, and its
per-sample gradients held, `chunk` samples at a time, so a large expected batch costs only its
indices. A model whose every trainable parameter sits in a Linear layer fed one
vector per sample is clipped without them ("ghost clipping", Goodfellow 2015; Li et al. 2022):
a Linear's per-sample weight gradient is the outer product of the output gradient d_i and the
input a_i, so its squared norm is |d_i|^2 |a_i|^2; a second backward pass of the loss weighted by
each sample's clip factor gives the clipped sum. That costs two backward passes instead of one,
but no sample's gradient is ever held, which is what a 845 KiB wristband needs. Convolutions
would need their unfolded inputs (larger than their per-sample gradients on the zoo's small
convs), so a model holding one keeps the per-sample path.
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
# losses_of(forward, x, y): each sample's loss over a batch, shape (b,) (ghost clipping's form).
LossesOf = Callable[[Callable[..., Any], torch.Tensor, torch.Tensor], torch.Tensor]
StepProgress = Callable[[int], None]  # called after each step with the steps done this epoch
Transform = Callable[[torch.Tensor], torch.Tensor]  # e.g. augmentation, per sample


# Per-sample gradients held at once where no device budget sizes the chunk: a batch of VGG-9's
# (67M parameters) at once is 17 GB, and the process was killed without a word (measured,
# `client train --profile smartphone --dp 8`, 2026-11-29). A device profile's budget sizes the
# chunk instead (edgefl.models.cost.Costs.dp_chunk, passed in as TrainConfig.dp_chunk).
DP_GRADIENT_BYTES = 256 * 2**20


def dp_chunk(gradient_bytes: int, room: int = DP_GRADIENT_BYTES) -> int:
    """Samples whose per-sample gradients (`gradient_bytes` each) fit in `room` bytes; >= 1."""
    return max(1, room // max(1, gradient_bytes))


def default_chunk(model: nn.Module) -> int | None:
    """The chunk without a device budget: None (the whole batch) under ghost clipping, which
    holds no per-sample gradients, else DP_GRADIENT_BYTES of them (float32)."""
    if ghost_clippable(model):
        return None
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return dp_chunk(4 * params)


def poisson_batch(n: int, sample_rate: float, gen: torch.Generator) -> torch.Tensor:
    """Indices of a Poisson batch: each of n samples in independently with probability q."""
    return torch.nonzero(torch.rand(n, generator=gen) < sample_rate).flatten()


class _Drawn:
    """A Poisson batch that gathers (and transforms) its samples a slice at a time, as
    `clipped_sum` and `ghost_clipped_sum` take them: only a chunk's inputs are ever held (a
    wristband's expected batch of 256 digits is 800 KB, its whole budget 845 KiB)."""

    def __init__(self, data: torch.Tensor, idx: torch.Tensor, transform=None):
        self.data, self.idx, self.transform = data, idx, transform

    def __len__(self) -> int:
        return len(self.idx)

    def __getitem__(self, part: slice) -> torch.Tensor:
        out = self.data[self.idx[part]]
        return self.transform(out) if self.transform is not None else out


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
        # Each sample's norm over all parameters, without copying its gradients into one vector
        # (vector_norm reduces in place: g.pow(2) would hold a second chunk of gradients).
        norms = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads.values()]),
            dim=0,
        )
        # min(1, C / ||g||): the 1e-12 only guards a zero gradient.
        scale = (clip / (norms + 1e-12)).clamp(max=1.0)
        for k, g in grads.items():
            sums[k] += torch.einsum("b,b...->...", scale, g)
        loss_sum += float(losses.sum())
        del grads  # before the next chunk's are made: one chunk held at a time
    return sums, loss_sum


def ghost_clippable(model: nn.Module) -> bool:
    """Whether ghost clipping can clip `model`: every trainable parameter is a Linear layer's
    own weight or bias (a Linear's input must also be one vector per sample, and each called once
    per forward: `ghost_clipped_sum` checks that as it runs)."""
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if own and not isinstance(module, nn.Linear):
            return False
    return any(p.requires_grad for p in model.parameters())


class _NotGhostable(Exception):
    """A forward that ghost clipping's norms do not cover (a Linear called twice, or fed more
    than one vector per sample)."""


def ghost_clipped_sum(
    model: nn.Module,
    losses_of: LossesOf,
    xb: torch.Tensor,
    yb: torch.Tensor,
    clip: float,
    chunk: int | None = None,
) -> tuple[dict[str, torch.Tensor], float]:
    """`clipped_sum`'s result without per-sample gradients (see the module's docstring); for a
    `ghost_clippable` model. Falls back to `clipped_sum` if a forward breaks the rule."""
    params = _trainable(model)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if any(p.grad is not None for p in params.values()):
        raise ValueError("ghost clipping accumulates into .grad: clear it first (set_to_none)")
    loss_sum = 0.0
    step = chunk or max(1, len(xb))
    try:
        for i in range(0, len(xb), step):
            loss_sum += _ghost_chunk(
                model, linears, losses_of, xb[i : i + step], yb[i : i + step], clip
            )
    except _NotGhostable:
        for p in params.values():
            p.grad = None

        def loss_of_one(forward, x, y):
            return losses_of(forward, x, y).sum()

        return clipped_sum(model, loss_of_one, xb, yb, clip, chunk)
    # The clipped sums were accumulated in .grad (one buffer of the weights' size, no copy).
    sums = {k: p.grad if p.grad is not None else torch.zeros_like(p) for k, p in params.items()}
    for p in params.values():
        p.grad = None
    return sums, loss_sum


def _ghost_chunk(model, linears, losses_of, xb, yb, clip) -> float:
    """Clip one chunk's samples by their ghost norms; their clipped sum is added to .grad."""
    seen: list[tuple[nn.Linear, torch.Tensor, torch.Tensor]] = []

    def record(module, inputs, out):
        seen.append((module, inputs[0], out))

    handles = [m.register_forward_hook(record) for m in linears]
    try:
        losses = losses_of(model, xb, yb)
    finally:
        for h in handles:
            h.remove()
    if len({id(m) for m, _, _ in seen}) != len(seen) or any(a.dim() != 2 for _, a, _ in seen):
        raise _NotGhostable
    # Pass 1: each Linear's output gradient. Samples are independent (no BatchNorm), so the
    # gradient of the summed loss at sample i's output is that of sample i's own loss.
    outs = [out for _, _, out in seen]
    d_outs = torch.autograd.grad(losses.sum(), outs, retain_graph=True, allow_unused=True)
    sq = torch.zeros(len(xb), device=xb.device)
    for (m, a, _), d in zip(seen, d_outs, strict=True):
        if d is None:
            continue
        if m.weight.requires_grad:  # |d_i a_i^T|_F^2 = |d_i|^2 |a_i|^2
            sq += d.pow(2).sum(1) * a.pow(2).sum(1)
        if m.bias is not None and m.bias.requires_grad:
            sq += d.pow(2).sum(1)
    del d_outs, outs
    seen.clear()  # the layer outputs: autograd keeps what pass 2 needs
    scale = (clip / (sq.sqrt() + 1e-12)).clamp(max=1.0)
    # Pass 2: the gradient of sum_i scale_i loss_i is the clipped sum; backward adds it to .grad.
    (losses * scale.detach()).sum().backward()
    return float(losses.detach().sum())


def noisy_step(
    model: nn.Module,
    sums: dict[str, torch.Tensor],
    noise_multiplier: float,
    clip: float,
    expected_batch: float,
    opt: torch.optim.Optimizer,
    gen: torch.Generator,
) -> None:
    """Add N(0, (sigma C)^2) to each summed coordinate, divide by the expected batch, step.
    The sums become the gradients in place (no second buffer of the weights' size)."""
    for k, p in _trainable(model).items():
        # Drawn on the CPU from the seeded generator (as the batches are): reproducible anywhere.
        noise = torch.normal(0.0, noise_multiplier * clip, p.shape, generator=gen)
        p.grad = sums[k].add_(noise.to(p.device, p.dtype)).div_(expected_batch)
        del noise
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
    losses_of: LossesOf | None = None,
    on_step: StepProgress | None = None,
    target: Transform | None = None,
) -> float:
    """One epoch of DP-SGD (`steps`, default 1/q, Poisson batches); the mean loss per sample
    drawn (nan if every batch came out empty). Every step adds noise, an empty batch's too:
    the accountant counts each step's release, whatever its batch held. The loss is computed
    from the private data without noise: keep it on the device. With `losses_of` (each sample's
    loss over a batch), a `ghost_clippable` model is clipped without per-sample gradients.
    `transform` (augmentation) and `target` (labels to the loss's targets, a CVAE's one-hot)
    run on each chunk as it is gathered: nothing the size of the data is made."""
    n = len(xt)
    total, count = 0.0, 0
    ghost = losses_of is not None and ghost_clippable(model)
    for step in range(steps or steps_per_epoch(sample_rate)):
        idx = poisson_batch(n, sample_rate, gen).to(xt.device)
        xb, yb = _Drawn(xt, idx, transform), _Drawn(yt, idx, target)
        if len(idx) and ghost:
            sums, loss_sum = ghost_clipped_sum(model, losses_of, xb, yb, clip, chunk)
        elif len(idx):
            sums, loss_sum = clipped_sum(model, loss_of_one, xb, yb, clip, chunk)
        else:
            sums, loss_sum = {k: torch.zeros_like(p) for k, p in _trainable(model).items()}, 0.0
        noisy_step(model, sums, noise_multiplier, clip, sample_rate * n, opt, gen)
        del sums
        total += loss_sum
        count += len(idx)
        if on_step is not None:
            on_step(step + 1)
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
