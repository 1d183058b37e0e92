"""Torch modules of the zoo. Every classifier is `head(features(x))` with `head` one nn.Linear:
FedGH swaps the head, pFedZKD reads its rows, FedMHO/FedHydra only need logits.
Every CVAE keeps its decoder in `self.decoder`, the only part that ever leaves a device.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class Classifier(nn.Module):
    def __init__(self, features: nn.Sequential, head: nn.Linear):
        super().__init__()
        self.features = features
        self.head = head

    @property
    def representation_size(self) -> int:
        return self.head.in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class SlicedAdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
    """nn.AdaptiveAvgPool2d with the same windows, computed from slices where the output size
    does not divide the input size. torch exports that case as Gather/GatherND/Where arithmetic
    that phones' NNAPI and CoreML cannot run (VGG-9: 3x3 -> 7x7 on MNIST); slices, sums and
    concatenation they can. No weights, so state dicts and the cost model are unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = self.output_size if isinstance(self.output_size, tuple) else (self.output_size,) * 2
        pairs = [(a, x.shape[a], w) for a, w in zip((-2, -1), size, strict=True) if w is not None]
        if all(have % want == 0 for _, have, want in pairs):
            return super().forward(x)  # even windows: exported as plain pooling
        for axis, have, want in pairs:
            if want != have:
                x = torch.cat([_window_mean(x, axis, have, want, i) for i in range(want)], axis)
        return x


def _window_mean(x: torch.Tensor, axis: int, have: int, want: int, i: int) -> torch.Tensor:
    """Mean over adaptive pooling's window i: [floor(i*have/want), ceil((i+1)*have/want))."""
    start, end = (i * have) // want, -((-(i + 1) * have) // want)
    total = x.narrow(axis, start, 1)
    for j in range(start + 1, end):
        total = total + x.narrow(axis, j, 1)
    return total if end - start == 1 else total * (1.0 / (end - start))


def flat_size(features: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Size of `features`' output for one sample, found by running it once on zeros."""
    with torch.no_grad():
        return int(features(torch.zeros(1, *input_shape)).flatten(1).shape[1])


class MLPDecoder(nn.Module):
    """p(x | z, y): [z ++ onehot(y)] -> Linear-ReLU -> Linear-Sigmoid, reshaped to the image."""

    def __init__(self, latent: int, num_classes: int, hidden: int, image_shape: tuple[int, ...]):
        super().__init__()
        self.latent_dim = latent
        self.image_shape = tuple(image_shape)
        out = math.prod(image_shape)
        self.net = nn.Sequential(
            nn.Linear(latent + num_classes, hidden), nn.ReLU(), nn.Linear(hidden, out), nn.Sigmoid()
        )

    def forward(self, z: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([z, label], dim=1)).view(-1, *self.image_shape)


class MLPEncoder(nn.Module):
    """q(z | x, y): [x ++ onehot(y)] -> Linear-ReLU -> (mu, logvar)."""

    def __init__(self, latent: int, num_classes: int, hidden: int, image_shape: tuple[int, ...]):
        super().__init__()
        inp = math.prod(image_shape)
        self.body = nn.Sequential(nn.Linear(inp + num_classes, hidden), nn.ReLU())
        self.mu = nn.Linear(hidden, latent)
        self.logvar = nn.Linear(hidden, latent)

    def forward(self, x: torch.Tensor, label: torch.Tensor):
        h = self.body(torch.cat([x.flatten(1), label], dim=1))
        return self.mu(h), self.logvar(h)


class ConvEncoder(nn.Module):
    """FedMHO's CVAE-large encoder: conv 64-128-256 with pooling, FC 256 (label joins at the FC)."""

    def __init__(self, latent: int, num_classes: int, image_shape: tuple[int, ...]):
        super().__init__()
        c = image_shape[0]
        self.conv = nn.Sequential(
            nn.Conv2d(c, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(128, 256, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.fc = nn.Sequential(
            nn.Linear(flat_size(self.conv, image_shape) + num_classes, 256), nn.ReLU()
        )
        self.mu = nn.Linear(256, latent)
        self.logvar = nn.Linear(256, latent)

    def forward(self, x: torch.Tensor, label: torch.Tensor):
        h = self.fc(torch.cat([self.conv(x), label], dim=1))
        return self.mu(h), self.logvar(h)


class ConvDecoder(nn.Module):
    """FedMHO's CVAE-large decoder: FC(L+C,256)-FC(256,256*s*s), ConvT 256->128, up x2,
    ConvT 128->64, up x2, ConvT 64->c, Sigmoid (s = H/4)."""

    def __init__(self, latent: int, num_classes: int, image_shape: tuple[int, ...]):
        super().__init__()
        self.latent_dim = latent
        self.image_shape = tuple(image_shape)
        c, h, w = image_shape
        self.s = (h // 4, w // 4)
        self.fc = nn.Sequential(
            nn.Linear(latent + num_classes, 256),
            nn.ReLU(),
            nn.Linear(256, 256 * self.s[0] * self.s[1]),
            nn.ReLU(),
        )
        self.deconv = nn.Sequential(
            nn.ConvTranspose2d(256, 128, 3, padding=1),
            nn.ReLU(),
            nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
            nn.ConvTranspose2d(128, 64, 3, padding=1),
            nn.ReLU(),
            nn.Upsample(size=(h, w), mode="bilinear", align_corners=False),
            nn.ConvTranspose2d(64, c, 3, padding=1),
            nn.Sigmoid(),
        )

    def forward(self, z: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        h = self.fc(torch.cat([z, label], dim=1)).view(-1, 256, *self.s)
        return self.deconv(h)


class CVAE(nn.Module):
    """Conditional VAE. forward(x, onehot) -> (reconstruction, mu, logvar)."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module, num_classes: int):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.num_classes = num_classes

    @property
    def latent_dim(self) -> int:
        return self.decoder.latent_dim

    def forward(self, x: torch.Tensor, label: torch.Tensor):
        mu, logvar = self.encoder(x, label)
        # Reparameterisation trick: z = mu + sigma * eps keeps sampling differentiable.
        z = mu + torch.exp(0.5 * logvar) * torch.randn_like(mu)
        return self.decoder(z, label), mu, logvar

    @torch.no_grad()
    def sample(self, labels: torch.Tensor, generator: torch.Generator | None = None):
        onehot = F.one_hot(labels, self.num_classes).float()
        z = torch.randn(len(labels), self.latent_dim, generator=generator)
        return self.decoder(z, onehot)


class Centre(nn.Module):
    """Sensor windows arrive in [0, 1] (the fixed map of `edgefl.data.hapt`, which the CVAEs'
    Sigmoid outputs share) but vary by about +-0.1 around a channel's offset: mapping [0, 1]
    back to [-2, 2] (g, for the accelerometer) gives SGD inputs of unit scale, which it needs
    (at [0, 1] a user's 400 windows barely move a CNN in 3 epochs). A constant, so FedAvg and
    every exporter see plain Sub/Mul."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - 0.5) * 4.0


class SignalEncoder(nn.Module):
    """q(z | x, y) for multichannel windows (C, 1, L): two strided (1, 4) convolutions halve the
    length twice, then [features ++ onehot(y)] -> Linear-ReLU -> (mu, logvar)."""

    def __init__(
        self, latent: int, num_classes: int, width: int, hidden: int, shape: tuple[int, ...]
    ):
        super().__init__()
        c, _, length = shape
        self.conv = nn.Sequential(
            nn.Conv2d(c, width, (1, 4), stride=(1, 2), padding=(0, 1)),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, (1, 4), stride=(1, 2), padding=(0, 1)),
            nn.ReLU(),
            nn.Flatten(),
        )
        self.body = nn.Sequential(
            nn.Linear(2 * width * (length // 4) + num_classes, hidden), nn.ReLU()
        )
        self.mu = nn.Linear(hidden, latent)
        self.logvar = nn.Linear(hidden, latent)

    def forward(self, x: torch.Tensor, label: torch.Tensor):
        h = self.body(torch.cat([self.conv(x), label], dim=1))
        return self.mu(h), self.logvar(h)


class SignalDecoder(nn.Module):
    """p(x | z, y) for windows (C, 1, L): [z ++ onehot(y)] -> Linear-ReLU -> Linear-ReLU to
    (2w, 1, L/4), then two (1, 4) transposed convolutions of stride 2 back to (C, 1, L), Sigmoid.
    Convolutions, not one wide Linear, so that neighbouring samples of a window come out
    correlated as a sensor's are, at a fraction of the weights."""

    def __init__(
        self, latent: int, num_classes: int, width: int, hidden: int, shape: tuple[int, ...]
    ):
        super().__init__()
        self.latent_dim = latent
        self.image_shape = tuple(shape)
        c, _, length = shape
        self.start = (2 * width, 1, length // 4)
        self.fc = nn.Sequential(
            nn.Linear(latent + num_classes, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 2 * width * (length // 4)),
            nn.ReLU(),
        )
        self.deconv = nn.Sequential(
            nn.ConvTranspose2d(2 * width, width, (1, 4), stride=(1, 2), padding=(0, 1)),
            nn.ReLU(),
            nn.ConvTranspose2d(width, c, (1, 4), stride=(1, 2), padding=(0, 1)),
            nn.Sigmoid(),
        )

    def forward(self, z: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return self.deconv(self.fc(torch.cat([z, label], dim=1)).view(-1, *self.start))
