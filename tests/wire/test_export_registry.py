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


def test_torchlib_is_listed_as_onnxscript_lists_it():
    """The registry is built from `torchlib_functions` (no source parsing): the same functions,
    names, domains and order as onnxscript's own listing, and onnxscript's is back after."""
    from onnxscript._framework_apis import torch_2_5
    from torch.onnx._internal._lazy_import import onnxscript_apis

    from exporters.export import torchlib_functions

    def rows(metas):
        return [(m.qualified_name, id(m.function), m.domain, m.name, m.is_complex) for m in metas]

    ours, theirs = rows(torchlib_functions()), rows(torch_2_5.get_torchlib_ops())
    assert len(ours) > 500 and ours == theirs
    _reuse_torchlib_registry()
    _export()
    assert onnxscript_apis.get_torchlib_ops is torch_2_5.get_torchlib_ops
