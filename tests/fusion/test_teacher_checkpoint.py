"""A differentiable teacher pass past CHECKPOINT_GROUP teachers drops each group's activations
and recomputes them in the backward (issue 59 item 3: memory bounded by a group, not by the
number of teachers): the generator's loss and gradients are those of the plain pass, bit for
bit, BatchNorm-statistics term included; a pass without gradients is the plain one."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from edgefl.fusion import generator as gen_mod
from edgefl.fusion.generator import BNStatLoss, make_generator, teacher_forward
from edgefl.models.zoo import build_model, make_spec

SHAPE, C = (1, 12, 12), 4


def _teachers():
    torch.manual_seed(0)  # nas-cnn has BatchNorm (its statistics enter the loss), cnn has none
    specs = [make_spec(n, SHAPE, C) for n in ("nas-cnn", "cnn", "cnn", "nas-cnn", "cnn")]
    out = [build_model(s).eval().requires_grad_(False) for s in specs]
    for t in out:  # non-trivial running statistics, as a trained teacher has
        for m in t.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
    return out


def _step(group: int, monkeypatch):
    """One DENSE-style generator step (CE + BN terms); its loss, BN term and gradients."""
    monkeypatch.setattr(gen_mod, "CHECKPOINT_GROUP", group)
    teachers = _teachers()
    bn = BNStatLoss(teachers)
    gen = make_generator(8, 4, SHAPE, 0, torch.device("cpu"))
    z = torch.randn(6, 8, generator=torch.Generator().manual_seed(2))
    y = torch.arange(6) % C
    logits = teacher_forward(teachers, gen(z), bn)
    l_bn = bn.value("cpu")
    loss = F.cross_entropy(logits.mean(0), y) + l_bn
    loss.backward()
    bn.remove()
    return loss.detach(), l_bn.detach(), [p.grad.clone() for p in gen.parameters()]


@pytest.mark.parametrize("group", [1, 2, 4])
def test_grouped_checkpointing_gives_the_plain_passs_loss_and_gradients(group, monkeypatch):
    plain_loss, plain_bn, plain = _step(100, monkeypatch)  # 5 teachers: one plain pass
    loss, l_bn, grads = _step(group, monkeypatch)
    assert plain_bn > 0  # the BatchNorm teachers' term is in the loss
    assert torch.equal(loss, plain_loss) and torch.equal(l_bn, plain_bn)
    assert all(torch.equal(a, b) for a, b in zip(grads, plain, strict=True))


def test_checkpointing_keeps_fewer_activations_for_the_backward(monkeypatch):
    """What the backward keeps, counted by torch's saved-tensor hooks: a group's pass keeps far
    less than the plain pass, which keeps every teacher's activations."""

    def saved_bytes(group):
        monkeypatch.setattr(gen_mod, "CHECKPOINT_GROUP", group)
        teachers = _teachers()
        x = torch.rand(6, *SHAPE, requires_grad=True)
        total = [0]

        def pack(t):
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            teacher_forward(teachers, x).mean()
        return total[0]

    assert saved_bytes(1) < saved_bytes(100) / 3


def test_a_pass_without_gradients_is_the_plain_one(monkeypatch):
    monkeypatch.setattr(gen_mod, "CHECKPOINT_GROUP", 1)
    teachers = _teachers()
    x = torch.rand(6, *SHAPE)
    with torch.no_grad():
        got = teacher_forward(teachers, x)
    assert not got.requires_grad
    assert torch.equal(got, torch.stack([t(x) for t in teachers]))


def test_a_recomputed_group_keeps_no_batchnorm_terms(monkeypatch):
    """The backward re-runs each group's forward and its BatchNorm hooks with it: those terms
    must not be kept (each would hold the group's whole recomputed graph, undoing the saving),
    nor those of a teacher called outside the pass."""
    monkeypatch.setattr(gen_mod, "CHECKPOINT_GROUP", 1)
    teachers = _teachers()
    bn = BNStatLoss(teachers)
    x = torch.rand(6, *SHAPE, requires_grad=True)
    logits = teacher_forward(teachers, x, bn)
    kept = sum(len(v) for v in bn.terms.values())
    assert kept > 0
    (logits.mean() + bn.value("cpu")).backward()
    teachers[0](x.detach())  # a teacher called elsewhere (a pool's labels, a perturbation)
    assert sum(len(v) for v in bn.terms.values()) == kept
    bn.remove()
