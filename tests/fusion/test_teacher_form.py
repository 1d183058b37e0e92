"""A teacher's evaluation form (edgefl.fusion.teachers, issue 59): the same logits and the same
input gradients as the module, bit for bit, ties included; the upload's module never changed."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from edgefl.fusion import teachers as passes
from edgefl.fusion.teachers import WindowMax, evaluation_form, teacher_logits
from edgefl.models.parse import parse_model_arg
from edgefl.models.zoo import build_model


@pytest.mark.parametrize("window", [(2, 2), (1, 2), (3, 3), (2, 1)])
@pytest.mark.parametrize("ties", [False, True])
def test_window_max_is_max_pool(window, ties):
    gen = torch.Generator().manual_seed(0)
    # odd sizes: the pool's floor mode drops the last row and column
    x = torch.randn(3, 4, 9, 11, generator=gen)
    if ties:  # few distinct values: most windows hold their maximum more than once
        x = torch.randint(0, 3, x.shape, generator=gen).float()
    a = x.clone().requires_grad_(True)
    b = x.clone().requires_grad_(True)
    pa = F.max_pool2d(a, window)
    pb = WindowMax(*window)(b)
    assert torch.equal(pa, pb)
    with torch.no_grad():  # a teacher pass: the strided slices, not torch's pool
        assert torch.equal(pa, WindowMax(*window)(x))
    g = torch.randn(pa.shape, generator=gen)
    (pa * g).sum().backward()
    (pb * g).sum().backward()
    assert torch.equal(a.grad, b.grad)  # the gradient reaches the same (first) maximum


def test_nan_propagates_and_takes_the_gradient_as_in_max_pool():
    x = torch.randn(2, 3, 6, 6)
    x[0, 0, 1, 1] = x[0, 0, 0, 0] = x[1, 2, 4, 5] = float("nan")  # two NaNs in one window
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    pa, pb = F.max_pool2d(a, 2), WindowMax(2, 2)(b)
    for p in (pb, WindowMax(2, 2)(x)):  # with a gradient to come, and without
        assert torch.equal(pa.isnan(), p.isnan())
        assert torch.equal(pa.nan_to_num(), p.nan_to_num())
    pa.sum().backward()
    pb.sum().backward()
    assert torch.equal(a.grad, b.grad)


def test_only_exact_pools_are_replaced():
    m = nn.Sequential(
        nn.MaxPool2d(2),
        nn.MaxPool2d(3, stride=2),  # overlapping windows
        nn.MaxPool2d(2, padding=1),
        nn.MaxPool2d(2, ceil_mode=True),
        nn.AvgPool2d(2),
    )
    fast = evaluation_form(m)
    assert [type(c).__name__ for c in fast] == [
        "WindowMax",
        "MaxPool2d",
        "MaxPool2d",
        "MaxPool2d",
        "AvgPool2d",
    ]
    assert isinstance(m[0], nn.MaxPool2d)  # the original untouched
    plain = nn.Linear(3, 2)
    assert evaluation_form(plain) is plain  # nothing to replace: no copy


@pytest.mark.parametrize(
    "arch,shape", [("cnn", (1, 28, 28)), ("scnn", (1, 28, 28)), ("cnn1d", (9, 1, 128))]
)
def test_zoo_teachers_same_logits(arch, shape):
    torch.manual_seed(0)
    model = build_model(parse_model_arg(arch, shape, 6)).eval()
    fast = evaluation_form(model)
    assert any(isinstance(m, WindowMax) for m in fast.modules()) or not any(
        isinstance(m, nn.MaxPool2d) for m in model.modules()
    )
    x = torch.rand(40, *shape)
    with torch.no_grad():
        assert torch.equal(model(x), fast(x))
    # the export path sees the upload's own module: its pools are still MaxPool2d
    assert not any(isinstance(m, WindowMax) for m in model.modules())


class _Up:
    def __init__(self, module):
        self.module = module
        self.meta = {"num_classes": 6}


def test_teacher_logits_use_the_form_without_changing_the_upload():
    torch.manual_seed(1)
    model = build_model(parse_model_arg("cnn", (1, 28, 28), 6)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.rand(30, 1, 28, 28)
    got = teacher_logits(_Up(model), x, torch.device("cpu"), batch=7)
    with torch.no_grad():
        assert torch.equal(got, torch.cat([model(x[i : i + 7]) for i in range(0, 30, 7)]))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert sum(isinstance(m, nn.MaxPool2d) for m in model.modules()) == 2


def test_the_pass_batch_follows_the_largest_activation():
    cpu = torch.device("cpu")
    x = torch.rand(600, 1, 28, 28)
    narrow = build_model(parse_model_arg("scnn:width=4", (1, 28, 28), 6)).eval()
    wide = build_model(parse_model_arg("scnn:width=64", (1, 28, 28), 6)).eval()
    # the widest map of each: its first convolution's output, 4 bytes a value
    assert passes.largest_activation(wide, x[:1]) == 64 * 28 * 28 * 4
    lo, hi = passes.BATCH_RANGE
    small, big = passes.evaluation_batch(wide, x, cpu), passes.evaluation_batch(narrow, x, cpu)
    assert lo <= small < big <= hi
    assert small == max(lo, passes.ACTIVATION_BYTES // (64 * 28 * 28 * 4))
    # nothing to split, or an accelerator: one size, the module never run to measure it
    assert passes.evaluation_batch(None, x[:lo], cpu) == hi
    assert passes.evaluation_batch(None, x, torch.device("cuda")) == hi


@pytest.mark.parametrize("arch", ["scnn:width=64", "cnn"])
def test_the_pass_batch_does_not_change_the_logits(arch):
    torch.manual_seed(2)
    model = build_model(parse_model_arg(arch, (1, 28, 28), 6)).eval()
    x = torch.rand(300, 1, 28, 28)
    cpu = torch.device("cpu")
    chosen = teacher_logits(_Up(model), x, cpu)
    assert passes.evaluation_batch(evaluation_form(model), x, cpu) < len(x)  # split
    # float rounding only: bit for bit on an AMD EPYC, 1.3e-7 apart on an AVX-512 Xeon, where
    # oneDNN picks another kernel for another batch size
    whole = teacher_logits(_Up(model), x, cpu, batch=len(x))
    torch.testing.assert_close(chosen, whole, rtol=1e-5, atol=1e-6)


class _Artifact:
    """An upload without a rebuilt module (another tool's graph): its logits come from run()."""

    def __init__(self, module):
        self._module = module

    def run(self, x):
        with torch.no_grad():
            return self._module(torch.from_numpy(x)).numpy()


def _mixed_teachers():
    torch.manual_seed(3)
    archs = ["cnn", "scnn:bn=true", "cnn", "scnn:width=4", "scnn:bn=true", "cnn"]
    models = [build_model(parse_model_arg(a, (1, 28, 28), 6)).eval() for a in archs]
    for m in models:  # running statistics that are not the identity
        for bn in (b for b in m.modules() if isinstance(b, nn.BatchNorm2d)):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    ups = [_Up(m) for m in models]
    other = _Up(None)
    other.artifact = _Artifact(build_model(parse_model_arg("cnn", (1, 28, 28), 6)).eval())
    return [*ups, other], models


@pytest.mark.parametrize("stack_bytes", [passes.STACK_BYTES, 40_000])
def test_stacked_teachers_give_the_one_by_one_logits(monkeypatch, stack_bytes):
    """The accelerator's pass, forced on the CPU: teachers of one architecture (BatchNorm ones
    too) stacked, the one alone of its kind and the module-less upload run as they are; the same
    logits up to float rounding, however the samples are split; the uploads' modules untouched."""
    monkeypatch.setattr(passes, "STACK_BYTES", stack_bytes)  # 40 kB: a few samples a call
    ups, models = _mixed_teachers()
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in models]
    x = torch.rand(45, 1, 28, 28)
    cpu = torch.device("cpu")
    one_by_one = passes.group_logits(ups, x, cpu, stack=False)
    stacked = passes.group_logits(ups, x, cpu, stack=True)
    assert stacked.shape == one_by_one.shape == (7, 45, 6)
    assert (stacked - one_by_one).abs().max() < 1e-5
    for m, b in zip(models, before, strict=True):
        assert all(torch.equal(b[k], v) for k, v in m.state_dict().items())
        assert not any(isinstance(p, WindowMax) for p in m.modules())


def test_the_cpu_pass_is_not_stacked():
    """On a CPU the mean is the one-by-one pass's, bit for bit (the recorded results')."""
    ups, _ = _mixed_teachers()
    x = torch.rand(20, 1, 28, 28)
    cpu = torch.device("cpu")
    assert torch.equal(
        passes.mean_teacher_logits(ups, x, cpu), passes.mean_teacher_logits(ups, x, cpu, False)
    )
