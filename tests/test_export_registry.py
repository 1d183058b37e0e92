"""Exports share one torchlib operator registry per process (exporters/export.py), and each
export still gets tables of its own: a registration during one export cannot reach the next."""

from __future__ import annotations

import torch

from exporters.export import MIN_OPSET, _reuse_torchlib_registry, _torch_to_onnx


def _export() -> bytes:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 2, 3), torch.nn.Flatten(), torch.nn.Linear(32, 3)
    )
    proto = _torch_to_onnx(model, (torch.zeros(1, 1, 6, 6),), ["x"], ["logits"], MIN_OPSET)
    return proto.SerializeToString()


def test_each_export_gets_its_own_tables_over_shared_entries():
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    _reuse_torchlib_registry()
    a, b = ONNXRegistry.from_torchlib(), ONNXRegistry.from_torchlib()
    assert (
        a is not b and a.functions is not b.functions and a.functions.keys() == b.functions.keys()
    )
    key = next(k for k, v in a.functions.items() if v)
    assert a.functions[key] is not b.functions[key]
    assert a.functions[key][0] is b.functions[key][0]  # the parsed entries, built once
    a.functions[key].append("registered during one export")
    assert "registered during one export" not in b.functions[key]
    assert "registered during one export" not in ONNXRegistry.from_torchlib().functions[key]


def test_exports_in_one_process_are_identical():
    assert _export() == _export()
