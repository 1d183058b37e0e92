"""A teacher pass holds the logits of at most TEACHER_GROUP teachers at once (issue 36: bounded
memory at 2,000 classifiers) and gives the stacked pass's result: bit for bit up to one group,
to float rounding past it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from edgefl.errors import FusionError
from edgefl.fusion import fedmho_cw
from edgefl.fusion import teachers as passes

K, N, C = 10, 50, 4


@pytest.fixture
def teachers():
    torch.manual_seed(0)
    out = []
    for _ in range(K):
        counts = torch.randint(0, 30, (C,)).numpy()
        out.append(
            SimpleNamespace(module=nn.Linear(6, C), meta={"num_classes": C}, label_counts=counts)
        )
    return out


@pytest.fixture
def x():
    return torch.randn(N, 6, generator=torch.Generator().manual_seed(1))


def _stacked(teachers, x):
    return torch.stack([passes.teacher_logits(t, x, torch.device("cpu")) for t in teachers])


def test_the_mean_is_the_stacked_mean(teachers, x, monkeypatch):
    cpu = torch.device("cpu")
    assert torch.equal(passes.mean_teacher_logits(teachers, x, cpu), _stacked(teachers, x).mean(0))
    monkeypatch.setattr(passes, "TEACHER_GROUP", 3)
    seen = []
    total = passes.grouped_teacher_sum(
        teachers, x, cpu, lambda logits, group: seen.append(len(group)) or logits
    )
    assert seen == [3, 3, 3, 1]  # never more than a group's logits at once
    torch.testing.assert_close(total / K, _stacked(teachers, x).mean(0), rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["mean", "class-weighted", "label-weighted", "both"])
def test_fedmho_cw_teachers_in_groups(teachers, x, kind, monkeypatch):
    cpu = torch.device("cpu")
    y = torch.randint(0, C, (N,), generator=torch.Generator().manual_seed(2))
    logits, shares = _stacked(teachers, x), fedmho_cw.class_shares(teachers)
    old = {
        "mean": logits.mean(0),
        "class-weighted": fedmho_cw.weighted_mixture(logits, shares),
        "label-weighted": fedmho_cw.weighted_mixture(
            logits, torch.ones_like(shares), shares.t()[y]
        ),
        "both": fedmho_cw.weighted_mixture(logits, shares, shares.t()[y]),
    }[kind]
    assert torch.equal(fedmho_cw._teacher(kind, teachers, x, y, cpu), old)  # one group
    monkeypatch.setattr(passes, "TEACHER_GROUP", 4)
    torch.testing.assert_close(
        fedmho_cw._teacher(kind, teachers, x, y, cpu), old, rtol=0, atol=1e-5
    )


def test_no_teacher_is_a_refusal(x):
    with pytest.raises(FusionError, match="at least one classifier"):
        passes.grouped_teacher_sum([], x, torch.device("cpu"))
