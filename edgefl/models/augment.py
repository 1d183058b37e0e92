"""Training-time jitter, one draw per sample and step, for the two kinds of input edgefl trains
on: images get a small affine warp; windows of a body-worn sensor get a small 3-D rotation and
gain. Both the devices (local training) and the server (a global model on synthetic samples)
use them, so they live below both.

Why rotation for sensor windows: each user wears the device a little differently, so the
gravity vector and the axes of motion sit at a different angle in every user's data. A model
that saw one user sees one orientation and fails on the next user: 7 UCI HAPT users' phone
models (cnn1d, 50 epochs each) scored 54 % on the test users on average; with every window
turned by up to 15 degrees about a random axis and scaled by up to 10 % (sensor gain, body
size) they scored 71 % from the same data, their ensemble 80 % instead of 61 % (by hand,
2026-11-23, 2 CPUs; the federation in bench/results/hapt.md). Accelerometer and gyroscope
turn by the same rotation, as a device does.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from edgefl.errors import ConfigError
from edgefl.models.zoo import input_kind

CHOICES = ("auto", "affine", "rotate", "none")
FULL_SCALE = (2.0, 4.0)  # accelerometer g, gyroscope rad/s: edgefl.data.hapt's fixed map


def check_choice(augment: str) -> None:
    if augment not in CHOICES:
        raise ConfigError(
            f"--augment must be one of {', '.join(CHOICES)}, got {augment!r}",
            hint="rotate for sensor windows, affine for images; auto picks the right one",
        )


def resolve(augment: str, shape) -> str:
    """ "auto" -> "affine" on images, "rotate" on sensor windows; refuse a kind's wrong jitter."""
    check_choice(augment)
    kind = input_kind(tuple(shape))
    if augment == "auto":
        return "affine" if kind == "image" else "rotate"
    if (augment, kind) in (("affine", "signal"), ("rotate", "image")):
        raise ConfigError(
            f"augment {augment!r} is for {'images' if augment == 'affine' else 'sensor windows'}, "
            f"not {kind}s",
            hint="use auto, which picks the right one, or none",
        )
    return augment


def jitter(x: torch.Tensor, augment: str, gen: torch.Generator) -> torch.Tensor:
    """A batch (N, C, H, W) under `augment` (auto / affine / rotate / none)."""
    how = resolve(augment, x.shape[1:])
    if how == "affine":
        return affine_jitter(x, gen)
    if how == "rotate":
        return rotate_windows(x, gen)
    return x


def affine_jitter(
    x: torch.Tensor,
    gen: torch.Generator,
    *,
    degrees: float = 10.0,
    scale: float = 0.1,
    shift: float = 0.1,
) -> torch.Tensor:
    """Each image of an (N, C, H, W) batch under its own random rotation (+-degrees), scale
    (1 +- scale) and shift (+- shift of the side), sampled bilinearly with zero padding."""
    n = len(x)
    u = torch.rand(n, 4, generator=gen) * 2 - 1
    angle = u[:, 0] * degrees * torch.pi / 180
    s = 1 + u[:, 1] * scale
    cos, sin = torch.cos(angle) / s, torch.sin(angle) / s
    theta = torch.stack(
        [
            torch.stack([cos, -sin, u[:, 2] * 2 * shift], 1),
            torch.stack([sin, cos, u[:, 3] * 2 * shift], 1),
        ],
        1,
    ).to(x.device, x.dtype)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, padding_mode="zeros", align_corners=False)


def rotate_windows(
    x: torch.Tensor,
    gen: torch.Generator,
    *,
    degrees: float = 15.0,
    gain: float = 0.1,
    shift: bool = True,
) -> torch.Tensor:
    """Each window of an (N, C, 1, L) batch in [0, 1] (C = 3: accelerometer x/y/z; 6: then the
    gyroscope) turned about its own random axis by up to +-degrees and scaled by 1 +- gain, in
    the sensor's units, then mapped back and clipped to [0, 1], and (with `shift`) started at
    a random time."""
    n, c = x.shape[:2]
    if c % 3:
        raise ConfigError(
            f"rotate needs x/y/z channel triples, got {c} channels",
            hint="use --augment none for this data",
        )
    u = torch.rand(n, 5, generator=gen)
    axis = F.normalize(torch.randn(n, 3, generator=gen), dim=1)
    angle = (u[:, 0] * 2 - 1) * degrees * math.pi / 180
    k = torch.zeros(n, 3, 3)  # the axis' cross-product matrix (Rodrigues' formula)
    k[:, 0, 1], k[:, 0, 2], k[:, 1, 2] = -axis[:, 2], axis[:, 1], -axis[:, 0]
    k = k - k.transpose(1, 2)
    sin, cos = torch.sin(angle)[:, None, None], torch.cos(angle)[:, None, None]
    rot = torch.eye(3) + sin * k + (1 - cos) * (k @ k)
    rot = rot * (1 + (u[:, 1] * 2 - 1) * gain)[:, None, None]
    rot = rot.to(x.device, x.dtype)
    out = []
    for g in range(c // 3):  # each sensor's triple, the same rotation
        full = FULL_SCALE[min(g, len(FULL_SCALE) - 1)]
        v = x[:, 3 * g : 3 * g + 3, 0, :] * (2 * full) - full
        out.append(((rot @ v + full) / (2 * full)).clamp(0.0, 1.0))
    out = torch.cat(out, 1)[:, :, None, :]
    # And a random start in time (a circular shift): a window is cut at any phase of the
    # movement, while the samples of decoders that learnt aligned windows (edgefl.data.align)
    # all start at one; a model must not tell the two apart.
    if not shift:
        return out
    shifts = (u[:, 2] * x.shape[-1]).long().tolist()
    return torch.stack([torch.roll(w, s, dims=-1) for w, s in zip(out, shifts, strict=True)])
