"""Leaving out a class the decoders cannot draw under DP (fedmho-cw's `restrict`).

A DP-SGD decoder that saw a class a few times a batch draws noise for it. Distilling those draws
teaches the global model that nothing is that class, and every draw of another class pushes its
logit down, so w0's knowledge of it (the classifier clients hold most of it) is trained away.
Left out: its draws dropped, its logit out of the student's softmax during training, then its
output bias set from the kept draws (`calibrate_left_out`).
"""

from __future__ import annotations

import numpy as np
import torch

from edgefl.errors import ConfigError
from edgefl.fusion.base import client_label_counts, federation_label_counts
from edgefl.fusion.options import option
from edgefl.privacy import DPPlan

# A class's draws read as that class under this share are unread (see `restrict`); a class a
# DP-trained decoder expects fewer than NOISE_FLOOR x its noise multiplier of a batch is below
# its noise. Chosen, with the calibration's 0.99, on one federation (MNIST Dir(0.5) seed 0 at
# epsilon 8, bench/results/fedmho_cw_restrict.md: its bands' fours 7.5, every other class
# but sevens (17) over 79); a read floor of 0.6 or 0.8 left out more and did worse.
READ_FLOOR = 0.5
NOISE_FLOOR = 10.0


RESTRICT_HELP = (
    "leave out a class the classifiers hold most of whose draws their teacher reads as that "
    f"class under {READ_FLOOR:g} of the time: its draws dropped, its logit out of the softmax, "
    "then its output bias set from the kept draws, so w0's knowledge of it is not trained "
    "away; dp: only a class no decoder saw above its DP-SGD noise; always: any"
)


def restrict_option(default: str):
    """The `restrict` option (off, dp or always) with its default."""
    return option(default, RESTRICT_HELP, choices=("dp", "always", "off"))


def evidence_share(decoders, classifiers, num_classes: int) -> torch.Tensor:
    """(C,): the decoders' share of the class-c samples both sides hold (1 where no classifier
    holds the class: there is no teacher worth hearing)."""
    held = federation_label_counts(decoders, num_classes).astype(np.float64)
    taught = federation_label_counts(classifiers, num_classes).astype(np.float64)
    total = held + taught
    return torch.from_numpy(np.where(taught > 0, held / np.where(total > 0, total, 1), 1.0)).float()


def read_rates(teacher: torch.Tensor, y: torch.Tensor, num_classes: int) -> list[float | None]:
    """Per class: how often the teacher's top class is the draw's label (None: no draws)."""
    top = teacher.argmax(1)
    return [
        round(float((top[y == c] == c).float().mean()), 4) if bool((y == c).any()) else None
        for c in range(num_classes)
    ]


def _dp_rate_and_noise(record) -> tuple[float | None, float]:
    """A privacy record's DP-SGD sampling rate and noise multiplier, read as the upload's own
    `DPPlan` ((None, 0) without one; ingest has already rejected unreadable records)."""
    try:
        plan = DPPlan.from_dict(record["dp_sgd"])
    except (ConfigError, KeyError, TypeError):
        return None, 0.0
    return plan.sample_rate, plan.noise_multiplier


def below_noise(decoders, num_classes: int) -> np.ndarray:
    """(C,) bool: classes every decoder saw below its DP-SGD noise. A DP-SGD step sums clipped
    per-sample gradients (each at most C) over a Poisson batch of rate q and adds noise of std
    sigma C: class c's part is at most q n_c C, so q n_c / sigma bounds its signal to noise.
    A decoder without DP holds each class it declares; one withholding its counts, every class."""
    if any(len(u.label_counts) != num_classes for u in decoders):
        return np.zeros(num_classes, dtype=bool)
    counts = client_label_counts(decoders, num_classes)
    low = np.ones(num_classes, dtype=bool)
    for u, n in zip(decoders, counts, strict=True):
        q, sigma = _dp_rate_and_noise(u.meta.get("privacy"))
        if q is None:
            low &= n == 0
        else:
            low &= q * n / max(sigma, 1e-12) < NOISE_FLOOR
    return low


def restriction(rates, decoders_share: torch.Tensor, floor: float, candidates=None) -> list[int]:
    """The classes to leave out (of `candidates`, default all): those the classifiers hold most
    of (the decoders' share under one half) whose draws the teacher reads below `floor`; none
    unless two classes stay. Where the decoders hold most of a class their draws are its
    evidence, and a teacher that knows little of it cannot judge them."""
    low = [
        c
        for c, r in enumerate(rates)
        if r is not None
        and r < floor
        and float(decoders_share[c]) < 0.5
        and (candidates is None or candidates[c])
    ]
    read = sum(r is not None for r in rates) - len(low)
    return low if read >= 2 else []


def output_bias(model: torch.nn.Module, num_classes: int) -> torch.Tensor | None:
    """The bias of the model's output layer (its last Linear, num_classes wide), if it has one."""
    last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1:]
    if last and last[0].out_features == num_classes and last[0].bias is not None:
        return last[0].bias
    return None


def calibrate_left_out(model, x, left_out, device, quantile=0.99) -> None:
    """Set each left-out class's output bias so that at most 1 - quantile of the kept draws
    (every one of another class) rank it above their best other class."""
    with torch.no_grad():
        logits = torch.cat(
            [model(x[i : i + 1024].to(device)).cpu() for i in range(0, len(x), 1024)]
        )
        bias = output_bias(model, logits.shape[1])
        others = logits.clone()
        others[:, left_out] = -float("inf")
        best_other = others.max(1).values
        for c in left_out:
            bias[c] -= float(torch.quantile(logits[:, c] - best_other, quantile))


def left_out_classes(mode, model, decoders, rates, share, num_classes) -> list[int]:
    """`restriction` under the `restrict` mode; none for a model without an output bias (the
    left-out classes' bias is set after training)."""
    if mode == "off" or output_bias(model, num_classes) is None:
        return []
    candidates = below_noise(decoders, num_classes) if mode == "dp" else None
    return restriction(rates, share, READ_FLOOR, candidates)


def without(left_out, x, y, teacher, num_classes):
    """The draws of the other classes, the teacher (if any) renormalised over them, and the
    logit bias that takes the left-out classes out of the student's softmax (None if none)."""
    if not left_out:
        return x, y, teacher, None
    keep = ~torch.isin(y, torch.tensor(left_out))
    bias = torch.zeros(num_classes)
    bias[left_out] = -1e4  # exp underflows to 0: out of both softmaxes, with no NaN as -inf gives
    return x[keep], y[keep], None if teacher is None else teacher[keep] + bias, bias
