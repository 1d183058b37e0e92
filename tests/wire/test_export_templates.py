"""A module built like one exported before in the process is exported from that export's graph
with its own weights (exporters/export.py `_TEMPLATES`): the file is byte for byte the one a
fresh trace writes; a module that differs in anything but its weights' values is traced; a
graph the parity check refuses is never used again."""

from __future__ import annotations

import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import exporters
from edgefl.models.zoo import build_model, make_spec, role_of
from exporters import export as ex


@pytest.fixture
def traces(monkeypatch):
    """Counts the exporter's traces; starts and ends with no template kept, none on disk."""
    monkeypatch.setenv("EDGEFL_CACHE_DIR", "off")
    calls = []
    real = ex._torch_to_onnx

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(ex, "_torch_to_onnx", counted)
    monkeypatch.setattr(ex, "_TEMPLATES", type(ex._TEMPLATES)())
    monkeypatch.setattr(ex, "_REFUSED", set())
    return calls


def _zoo_module(name: str, shape, classes: int, seed: int):
    torch.manual_seed(seed)
    spec = make_spec(name, shape, classes)
    model = build_model(spec).eval()
    with torch.no_grad():  # BatchNorm's running statistics differ between the two as well
        for b in model.buffers():
            if b.dtype.is_floating_point:
                b.add_(torch.rand_like(b) * seed)
    if role_of(spec) == "classifier":
        return model, (torch.zeros(2, *shape),), ["input"], ["logits"]
    dec = model.decoder
    label = F.one_hot(torch.tensor([0, 1]), classes).float()
    return dec, (torch.randn(2, dec.latent_dim), label), ["z", "label"], ["image"]


def _export(path, module, inputs, ins, outs) -> bytes:
    exporters.export_onnx(
        module, inputs, path, input_names=ins, output_names=outs, metadata=_meta(module, inputs)
    )
    return path.read_bytes()


def _meta(module, inputs) -> dict:
    """Metadata the schema and the graph's contract accept (tests/wire/test_exporters.py's)."""
    if len(inputs) == 2:  # a decoder: (z, one-hot label) -> image
        classes = inputs[1].shape[1]
        with torch.no_grad():
            shape = list(module(*inputs).shape[1:])
        kind = {"kind": "decoder", "latent_dim": inputs[0].shape[1]}
    else:
        with torch.no_grad():
            classes = module(*inputs).shape[1]
        shape, kind = list(inputs[0].shape[1:]), {"kind": "classifier"}
    return kind | {
        "input_shape": shape,
        "num_classes": classes,
        "class_names": [str(i) for i in range(classes)],
        "edgefl_version": "0.1.0",
        "spec": {"name": "test"},
        "client_id": "client-a",
        "label_counts": [5] * classes,
        "profile": "test-device",
        "costs": {"params": 1},
        "training": {"epochs": 1, "final_loss": 0.5},
    }


@pytest.mark.parametrize(
    "name, shape, classes",
    [
        ("cnn", (1, 8, 8), 10),  # the digits clients
        ("scnn", (1, 28, 28), 10),  # BatchNorm: buffers are weights too
        ("cnn1d", (3, 1, 128), 12),  # HAPT windows
        ("cvae-small", (1, 8, 8), 10),  # a decoder: two inputs
    ],
)
def test_a_second_module_of_one_structure_writes_the_file_a_fresh_trace_writes(
    name, shape, classes, traces, tmp_path, monkeypatch
):
    first = _zoo_module(name, shape, classes, seed=1)
    second = _zoo_module(name, shape, classes, seed=2)
    _export(tmp_path / "a.onnx", *first)
    templated = _export(tmp_path / "b.onnx", *second)
    assert len(traces) == 1  # the second came from the first's graph
    (template,) = ex._TEMPLATES.values()
    assert template.weights and all(
        not template.model.graph.initializer[i].raw_data for i, _ in template.weights
    )  # a template holds no weights
    monkeypatch.setattr(ex, "_TEMPLATES_MAX", 0)
    ex._TEMPLATES.clear()
    assert _export(tmp_path / "c.onnx", *second) == templated
    assert len(traces) == 2


class _Leaky(nn.Module):
    def __init__(self, slope: float, scale=None):
        super().__init__()
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
        self.act = nn.LeakyReLU(slope)
        self.scale = scale

    def forward(self, x):
        y = self.act(self.fc(x))
        return y if self.scale is None else self.scale(y)


def _leaky(slope: float, scale=None):
    torch.manual_seed(0)
    return _Leaky(slope, scale).eval(), (torch.zeros(2, 1, 2, 2),), ["input"], ["logits"]


def test_what_is_not_a_weight_is_part_of_the_structure(traces, tmp_path):
    """Two modules that differ only in an activation's slope: each is traced and each file
    computes its own module's function."""
    x = torch.randn(5, 1, 2, 2)
    for slope in (0.1, 0.5):
        module, inputs, ins, outs = _leaky(slope)
        _export(tmp_path / f"{slope}.onnx", module, inputs, ins, outs)
        got = onnx.reference.ReferenceEvaluator(str(tmp_path / f"{slope}.onnx")).run(
            None, {"input": x.numpy()}
        )[0]
        torch.testing.assert_close(torch.from_numpy(got), module(x).detach())
    assert len(traces) == 2 and len(ex._TEMPLATES) == 2 and not ex._REFUSED  # two keys


def test_a_module_the_key_cannot_describe_is_traced_every_time(traces, tmp_path):
    for i in range(2):
        _export(tmp_path / f"{i}.onnx", *_leaky(0.1, scale=lambda y: y * 2))
    hooked = _leaky(0.1)
    hooked[0].fc.register_forward_hook(lambda m, args, out: out)
    for i in range(2):
        _export(tmp_path / f"h{i}.onnx", *hooked)
    assert len(traces) == 4 and not ex._TEMPLATES


def test_a_graph_the_parity_check_refuses_is_replaced_by_a_trace_and_never_used_again(
    traces, tmp_path
):
    """A template kept under the wrong key (here: slope 0.5's graph for slope 0.1) fails the
    parity check: the module is traced, its file is right, and the key keeps no template."""
    _export(tmp_path / "a.onnx", *_leaky(0.5))
    wrong = ex._TEMPLATES.popitem()[1]
    module, inputs, ins, outs = _leaky(0.1)
    key = ex._structure_key(module, inputs, ins, outs, ex.MIN_OPSET)
    ex._TEMPLATES[key] = wrong
    assert _export(tmp_path / "b.onnx", module, inputs, ins, outs) == _export(
        tmp_path / "c.onnx", module, inputs, ins, outs
    )
    assert len(traces) == 3 and key in ex._REFUSED and key not in ex._TEMPLATES
