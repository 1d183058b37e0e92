"""Teachers' layer runs kept in oneDNN's layout (edgefl.fusion.onednn, issue 59): the module's
logits bit for bit or the plain layers, never anything else; NaN as torch's pool has it."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from edgefl.fusion import onednn
from edgefl.fusion import teachers as passes
from edgefl.fusion.onednn import OneDNNRun, keep_layout
from edgefl.fusion.teachers import evaluation_form
from edgefl.models.parse import parse_model_arg
from edgefl.models.zoo import build_model

ARCHS = ["cnn", "scnn", "lenet5", "fedgh-cnn1", "scnn:bn=true"]


@pytest.fixture(autouse=True)
def _fresh_verdicts():
    """Each test judges the fast path anew (a process keeps its verdicts)."""
    onednn.VERDICTS.clear()
    yield
    onednn.VERDICTS.clear()


def _verdicts(run: OneDNNRun) -> dict:
    """{input shape: fast path kept} for `run`'s kind."""
    return {k[1]: v for k, v in onednn.VERDICTS.items() if k[0] == run.kind}


def _teacher(arch: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(parse_model_arg(arch, (1, 28, 28), 10)).eval()


def _runs(module: nn.Module) -> list[OneDNNRun]:
    return [m for m in module.modules() if isinstance(m, OneDNNRun)]


@pytest.mark.parametrize("arch", ARCHS)
def test_zoo_teachers_keep_the_layout_and_their_logits(arch):
    model = _teacher(arch)
    form = evaluation_form(model)
    assert _runs(form)  # BatchNorm breaks a run; scnn:bn=true's ReLU, pool and conv make one
    x = torch.rand(70, 1, 28, 28)
    with torch.inference_mode():
        for batch in (1, 16, 33, 70):  # torch's own result at a batch of 1 is another kernel's
            form = evaluation_form(model)
            got = torch.cat([form(x[i : i + batch]) for i in range(0, 70, batch)])
            assert torch.equal(
                got, torch.cat([model(x[i : i + batch]) for i in range(0, 70, batch)])
            )
            if batch > 1:  # the fast path ran, checked itself and stayed
                seen = [v for r in _runs(form) for k, v in _verdicts(r).items() if k[0] == batch]
                assert seen and all(seen)
    assert not _runs(model)  # the upload's own module untouched


def test_runs_cover_consecutive_convertible_layers_only():
    seq = nn.Sequential(
        nn.ReLU(),  # no convolution before the next one: joins the run
        nn.Conv2d(1, 4, 3), nn.MaxPool2d(2), nn.ReLU(),
        nn.BatchNorm2d(4),  # breaks the run
        nn.Conv2d(4, 4, 3),  # alone: left as it is
        nn.Flatten(),
    )  # fmt: skip
    assert keep_layout(seq) == 1
    assert [type(c).__name__ for c in seq] == ["OneDNNRun", "BatchNorm2d", "Conv2d", "Flatten"]
    assert [type(c).__name__ for c in seq[0].layers] == ["ReLU", "Conv2d", "MaxPool2d", "ReLU"]
    assert keep_layout(nn.Sequential(nn.MaxPool2d(2), nn.ReLU())) == 0  # no convolution


def test_nan_and_huge_inputs_take_the_plain_layers():
    model = _teacher("cnn")
    form = evaluation_form(model)
    x = torch.rand(8, 1, 28, 28)
    x[0, 0, 3, 3] = float("nan")  # oneDNN's pool would skip it; torch's propagates it
    x[1] *= 1e36  # past the run's bound: a sum could overflow into an infinity
    with torch.inference_mode():
        a, b = model(x), form(x)
    assert a[0].isnan().all() and torch.equal(a.isnan(), b.isnan())
    assert torch.equal(a.nan_to_num(), b.nan_to_num())
    run = _runs(form)[0]
    assert not _verdicts(run)  # never took the fast path
    assert not run._fast_ok(torch.full((2, 1, 28, 28), float("inf")))


def test_a_run_that_differs_by_one_bit_goes_plain_for_good(monkeypatch):
    model = _teacher("cnn", 1)
    form = evaluation_form(model)
    fast = OneDNNRun._fast
    monkeypatch.setattr(
        OneDNNRun, "_fast", lambda self, x: torch.nextafter(fast(self, x), x.new_tensor(1e9))
    )
    x = torch.rand(40, 1, 28, 28)
    with torch.inference_mode():
        assert torch.equal(form(x), model(x))
        assert _verdicts(_runs(form)[0]) == {(40, 1, 28, 28): False}
        # the plain layers from now on, for every teacher of the kind at that shape
        calls = []
        monkeypatch.setattr(OneDNNRun, "_fast", lambda self, x: calls.append(1))
        other = evaluation_form(_teacher("cnn", 5))
        assert torch.equal(other(x), _teacher("cnn", 5)(x)) and not calls


def test_gradients_and_copies_see_the_plain_layers():
    model = _teacher("cnn", 2)
    form = evaluation_form(model)
    x = torch.rand(12, 1, 28, 28)
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    model(a).square().sum().backward()
    form(b).square().sum().backward()
    assert torch.equal(a.grad, b.grad)
    assert not onednn.VERDICTS  # a gradient to come: the fast path never ran
    twin = copy.deepcopy(form)
    with torch.no_grad():
        assert torch.equal(twin(x), model(x)) and torch.equal(form(x), model(x))
    # the pass's batch is measured through the plain layers: the widest map is still seen
    assert passes.largest_activation(form, x[:1]) == passes.largest_activation(model, x[:1])


def test_the_bound_follows_the_weights():
    conv = nn.Conv2d(2, 3, 3)
    with torch.no_grad():
        conv.weight.fill_(0.5)
        conv.bias.fill_(-2.0)
    run = OneDNNRun([conv, nn.ReLU(), nn.Conv2d(3, 1, 1, bias=False)])
    w2 = float(run.layers[2].weight.abs().max())
    a, b = run.bound
    assert a == pytest.approx(18 * 0.5 * 3 * w2) and b == pytest.approx(2.0 * 3 * w2)
    top = onednn.SAFE_MAGNITUDE / a
    with torch.no_grad():
        assert run._fast_ok(torch.full((1, 2, 4, 4), top / 2))
        assert not run._fast_ok(torch.full((1, 2, 4, 4), top * 2))
