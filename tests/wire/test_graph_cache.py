"""Exported graphs kept on disk (exporters/graph_cache.py, issue 59 item 4): a later process
exports a module of a kept structure without torch.export (no dynamo import, no trace) and
writes the file a fresh trace writes, byte for byte; a kept file that is damaged or holds the
wrong graph costs a trace, never a wrong upload."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import onnx
import pytest
import torch
from torch import nn

import exporters
from exporters import export as ex
from exporters import graph_cache

# One process's export of a zoo `cnn` through the client's exporter, seeded by argv: whether
# torch's dynamo was imported, the file's bytes checked by the caller.
CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import torch
    from edgefl.client.export import export_model
    from edgefl.models.zoo import build_model, make_spec
    torch.manual_seed(int(sys.argv[1]))
    spec = make_spec("cnn", (1, 8, 8), 10)
    meta = {"kind": "classifier", "input_shape": [1, 8, 8], "num_classes": 10,
            "class_names": [str(i) for i in range(10)], "edgefl_version": "0.1.0",
            "spec": {"name": "t"}, "client_id": "c", "label_counts": [5] * 10,
            "profile": "p", "costs": {"params": 1},
            "training": {"epochs": 1, "final_loss": 0.5}}
    export_model(build_model(spec), spec, meta, Path(sys.argv[2]))
    print(json.dumps({"dynamo": "torch._dynamo" in sys.modules}))
    """
)


def _child(seed: int, out, cache) -> bool:
    env = {**os.environ, "EDGEFL_CACHE_DIR": str(cache)}
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(seed), str(out)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(r.stdout.strip().splitlines()[-1])["dynamo"]


@pytest.mark.slow  # three fresh processes, two of them tracing: ~10 s
def test_a_later_process_skips_the_trace_and_writes_the_same_file(tmp_path):
    cache = tmp_path / "cache"
    assert _child(1, tmp_path / "a.onnx", cache)  # the first process traces ...
    assert len(list((cache / "graphs").glob("*.onnxt"))) == 1  # ... and keeps the graph
    assert not _child(2, tmp_path / "b.onnx", cache)  # the next never imports dynamo
    assert _child(2, tmp_path / "c.onnx", "off")  # the same module traced afresh
    assert (tmp_path / "b.onnx").read_bytes() == (tmp_path / "c.onnx").read_bytes()
    assert (tmp_path / "a.onnx").read_bytes() != (tmp_path / "b.onnx").read_bytes()


class _Leaky(nn.Module):
    def __init__(self, slope: float):
        super().__init__()
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
        self.act = nn.LeakyReLU(slope)

    def forward(self, x):
        return self.act(self.fc(x))


def _export(path, slope: float) -> bytes:
    torch.manual_seed(0)
    module = _Leaky(slope).eval()
    exporters.export_onnx(
        module,
        (torch.zeros(2, 1, 2, 2),),
        path,
        input_names=["input"],
        output_names=["logits"],
        metadata={
            "kind": "classifier",
            "input_shape": [1, 2, 2],
            "num_classes": 3,
            "class_names": ["a", "b", "c"],
            "edgefl_version": "0.1.0",
            "spec": {"name": "test"},
            "client_id": "client-a",
            "label_counts": [5, 5, 5],
            "profile": "test-device",
            "costs": {"params": 1},
            "training": {"epochs": 1, "final_loss": 0.5},
        },
    )
    return path.read_bytes()


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty disk cache and no template kept in this process; counts traces."""
    monkeypatch.setenv("EDGEFL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ex, "_TEMPLATES", type(ex._TEMPLATES)())
    monkeypatch.setattr(ex, "_REFUSED", set())
    calls = []
    real = ex._torch_to_onnx
    monkeypatch.setattr(ex, "_torch_to_onnx", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _only_file(tmp_path):
    (path,) = (tmp_path / "cache" / "graphs").glob("*.onnxt")
    return path


def test_a_damaged_file_costs_a_trace(fresh, tmp_path):
    first = _export(tmp_path / "a.onnx", 0.1)
    _only_file(tmp_path).write_bytes(b"EDGEFL-GRAPH-1\n\xff\xff\xff\x7fnot a graph")
    ex._TEMPLATES.clear()
    assert _export(tmp_path / "b.onnx", 0.1) == first
    assert len(fresh) == 2  # traced again, and kept again
    assert graph_cache.load(_only_file(tmp_path).stem) is not None


def test_the_wrong_graph_under_a_key_is_refused_by_parity_and_deleted(fresh, tmp_path):
    """slope 0.5's graph kept under slope 0.1's key: the parity check refuses it, the module is
    traced, its file is right, and the wrong graph is gone from disk."""
    _export(tmp_path / "half.onnx", 0.5)
    wrong = _only_file(tmp_path)
    ex._TEMPLATES.clear()
    torch.manual_seed(0)
    module = _Leaky(0.1).eval()
    key = ex._structure_key(module, (torch.zeros(2, 1, 2, 2),), ["input"], ["logits"], 18)
    target = wrong.parent / f"{graph_cache.disk_key(key, module)}.onnxt"
    data = wrong.read_bytes().replace(wrong.stem.encode(), target.stem.encode())
    wrong.unlink()
    target.write_bytes(data)
    got = _export(tmp_path / "tenth.onnx", 0.1)
    assert len(fresh) == 2 and key in ex._REFUSED
    assert not target.exists()  # forgotten
    x = torch.randn(5, 1, 2, 2)
    ref = onnx.reference.ReferenceEvaluator(onnx.load_from_string(got))
    torch.testing.assert_close(
        torch.from_numpy(ref.run(None, {"input": x.numpy()})[0]), module(x).detach()
    )


def test_off_keeps_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEFL_CACHE_DIR", "off")
    monkeypatch.setattr(ex, "_TEMPLATES", type(ex._TEMPLATES)())
    _export(tmp_path / "a.onnx", 0.3)
    assert graph_cache.folder() is None and not list(tmp_path.rglob("*.onnxt"))


def test_an_unwritable_cache_is_ignored(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("EDGEFL_CACHE_DIR", str(blocker))  # graphs/ cannot be made under a file
    monkeypatch.setattr(ex, "_TEMPLATES", type(ex._TEMPLATES)())
    assert _export(tmp_path / "a.onnx", 0.2)
