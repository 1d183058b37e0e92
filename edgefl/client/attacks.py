"""Poisoned clients, to measure fusion against (`simulate --attack KIND:COUNT`, issue 18).

An attacker is an ordinary client whose data, training or weights are poisoned before its
upload is exported: the upload is a valid artifact with an honest-looking header, as a
compromised device's would be. What a device says about itself (its label counts) follows the
poisoned labels, so a lie is consistent. Which clients attacked is recorded by the run that made
them (simulate's report), never in the artifact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from edgefl.errors import ConfigError
from edgefl.registry import Registry

SCALE = 20.0  # `scale`: logits x 20 outweigh the other teachers' in a logit average
SWAP = (0, 1)  # `swap`: the two classes a targeted attacker exchanges (digits 0 and 1 on MNIST)


@dataclass(frozen=True)
class Attack:
    name: str
    description: str
    roles: tuple[str, ...]  # client roles it applies to: classifier, generator
    labels: Callable[[np.ndarray, int, int], np.ndarray] | None = None  # (y, classes, seed)
    images: Callable[[np.ndarray, int], np.ndarray] | None = None  # (x in [0, 1], seed)
    weights: Callable[[nn.Module, int], None] | None = None  # in place, after training


def derangement(num_classes: int, seed: int) -> np.ndarray:
    """A seeded permutation that moves every class (no label stays right)."""
    rng = np.random.default_rng(seed)
    while True:
        perm = rng.permutation(num_classes)
        if num_classes < 2 or not np.any(perm == np.arange(num_classes)):
            return perm


def _flip(y: np.ndarray, num_classes: int, seed: int) -> np.ndarray:
    return derangement(num_classes, seed)[y]


def _swap(y: np.ndarray, num_classes: int, seed: int) -> np.ndarray:
    a, b = SWAP
    out = y.copy()
    out[y == a], out[y == b] = b, a
    return out


def _noise(x: np.ndarray, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(x.shape, dtype=np.float32)


def _random(model: nn.Module, seed: int) -> None:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(10_000 + seed)
        for m in model.modules():
            if m is not model and hasattr(m, "reset_parameters"):
                m.reset_parameters()


def _head(model: nn.Module) -> nn.Linear:
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Linear):
        raise ConfigError(
            "this attack changes a classifier's head; the model has none",
            hint="attack a classifier upload with it, or choose another attack kind",
        )
    return head


def _scale(model: nn.Module, seed: int) -> None:
    with torch.no_grad():
        head = _head(model)
        head.weight.mul_(SCALE)
        head.bias.mul_(SCALE)


def _invert(model: nn.Module, seed: int) -> None:
    with torch.no_grad():
        head = _head(model)
        head.weight.neg_()
        head.bias.neg_()


ATTACKS: Registry[Attack] = Registry("attack")
for _a in (
    Attack(
        "flip",
        "trains on labels moved by a seeded derangement (a CVAE then draws another "
        "class's images for each label)",
        ("classifier", "generator"),
        labels=_flip,
    ),
    Attack(
        "swap",
        f"targeted: exchanges classes {SWAP[0]} and {SWAP[1]} in its labels",
        ("classifier", "generator"),
        labels=_swap,
    ),
    Attack(
        "random",
        "uploads freshly initialised weights (never trained)",
        ("classifier", "generator"),
        weights=_random,
    ),
    Attack(
        "scale",
        f"multiplies its logits by {SCALE:g} (outweighs the others in an average)",
        ("classifier",),
        weights=_scale,
    ),
    Attack(
        "invert",
        "negates its logits (its least likely class becomes its answer)",
        ("classifier",),
        weights=_invert,
    ),
    Attack(
        "noise",
        "a CVAE trained on uniform noise: its decoder emits noise",
        ("generator",),
        images=_noise,
    ),
):
    ATTACKS.add(_a.name, _a)


def attack_for(name: str | None, role: str) -> Attack | None:
    """The named attack, checked against the client's role (None: an honest client)."""
    if name is None:
        return None
    attack = ATTACKS.get(name)
    if role not in attack.roles:
        fits = [a.name for a in ATTACKS if role in a.roles]
        raise ConfigError(
            f"attack {name!r} does not apply to a {role} client",
            hint=f"attacks for a {role}: {', '.join(fits)}",
        )
    return attack


ROLE_NAMES = {"classifier": "classifier", "cvae": "generator"}  # KIND@ROLE, as users say it


def parse_attacks(text: str) -> dict[str, int]:
    """`flip:2,noise:1,flip@cvae:1` -> {"flip": 2, "noise": 1, "flip@cvae": 1}, checked.
    KIND@classifier / KIND@cvae aims a kind that fits both at one role."""
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, count = part.partition(":")
        key = key.strip()
        name, at, role = key.partition("@")
        attack = ATTACKS.get(name)  # unknown: the valid names and the nearest
        if at and (role not in ROLE_NAMES or ROLE_NAMES[role] not in attack.roles):
            fits = [k for k, v in ROLE_NAMES.items() if v in attack.roles]
            raise ConfigError(
                f"--attack {part!r}: {name} can be aimed at {' or '.join(fits)}, not {role!r}",
                hint=f"e.g. --attack {name}@{fits[-1]}:2",
            )
        try:
            n = int(count) if sep else -1
        except ValueError:
            n = -1
        if n < 1:
            raise ConfigError(
                f"--attack expects KIND:COUNT with COUNT >= 1, got {part!r}",
                hint="e.g. --attack flip:2,noise:2",
            )
        out[key] = out.get(key, 0) + n
    return out


def assign(attacks: dict[str, int], roles: list[str]) -> list[str | None]:
    """Client -> attack name: for each kind in order, the first COUNT clients it applies to
    (KIND@ROLE: of that role) that no earlier kind took."""
    out: list[str | None] = [None] * len(roles)
    for key, count in attacks.items():
        name, _, role = key.partition("@")
        allowed = (ROLE_NAMES[role],) if role else ATTACKS.get(name).roles
        free = [i for i, r in enumerate(roles) if r in allowed and out[i] is None]
        if len(free) < count:
            raise ConfigError(
                f"--attack {key}:{count} needs {count} clients of role "
                f"{' or '.join(allowed)}, the run has {len(free)} left",
                hint="lower the count, or change --mix",
            )
        for i in free[:count]:
            out[i] = name
    return out
