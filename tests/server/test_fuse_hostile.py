"""`edgefl server fuse` on the tiny federation mixed with hostile uploads: every hostile file is
rejected with its reason, the valid ones are fused, the directory is never modified, and
--strict refuses to fuse at all."""

from __future__ import annotations

import builtins
import io
import json
import os

import numpy as np
import onnx
import pytest
import torch
from fed_fixtures import CLASSIFIERS, DECODERS, build_federation, copy_uploads, snapshot
from onnx import helper
from onnx_edits import clone, edit_weight, make_external, restamp, tiny_graph, with_client
from typer.testing import CliRunner

import edgefl
import edgefl.artifacts.upload
from edgefl.cli import app
from edgefl.client.run import export_model
from edgefl.models.zoo import make_spec
from edgefl.training import init_model

MAX_BYTES = 150_000  # the valid uploads are 40-90 kB
WIDE = 10**7  # a scnn this wide would need ~10^15 parameters: it must never be allocated


def _five_class_upload(path) -> None:
    """A genuine edgefl classifier, but of a 5-class task."""
    spec = make_spec("cnn", (1, 8, 8), 5)
    meta = {
        "kind": "classifier",
        "spec": spec.to_dict(),
        "input_shape": [1, 8, 8],
        "num_classes": 5,
        "class_names": [str(i) for i in range(5)],
        "label_counts": [9] * 5,
        "client_id": "h-five",
        "profile": "smartphone",
        "costs": {},
        "training": {},
        "edgefl_version": edgefl.__version__,
    }
    export_model(init_model(spec, 0), spec, meta, path)


def build_hostile(federation, root) -> dict[str, str]:
    """The valid federation plus hostile files; returns hostile file -> reason fragment."""
    copy_uploads(federation, root)
    cls = onnx.load(str(federation / f"{CLASSIFIERS[0]}.onnx"))
    files: dict[str, onnx.ModelProto | bytes] = {}
    expect: dict[str, str] = {}

    def add(name, content, reason):
        files[name], expect[name] = content, reason

    ext = with_client(cls, "h-ext")
    make_external(ext.graph.initializer[0], "../../etc/passwd")
    add("ext.onnx", ext, "external data at '../../etc/passwd'")
    good = with_client(cls, "h-trunc").SerializeToString()
    add("truncated.onnx", good[: len(good) // 2], "not a valid ONNX file")
    add("random.onnx", np.random.default_rng(3).bytes(4000), "not a valid ONNX file")
    add("nan.onnx", restamp(edit_weight(clone(cls), float("nan")), client_id="h-nan"), "NaN")
    absurd = with_client(cls, "h-absurd")
    absurd.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 10**9
    add("absurd.onnx", absurd, "absurd declared dimension")
    nometa = clone(cls)
    del nometa.metadata_props[:]
    add("nometa.onnx", nometa, "no 'edgefl' metadata")
    badjson = with_client(cls, "h-json")
    next(p for p in badjson.metadata_props if p.key == "edgefl").value = '{"kind": "classif'
    add("badjson.onnx", badjson, "not valid JSON")
    einsum = helper.make_node("Einsum", ["x", "x"], ["y"], equation="bi,bi->bi")
    add("einsum.onnx", tiny_graph(einsum), "'Einsum' is not in the allowed operator list")
    big = with_client(cls, "h-big")
    big.metadata_props.add(key="padding", value="x" * MAX_BYTES)  # a real model, too large
    add("big.onnx", big, f"over the {MAX_BYTES}-byte limit")

    # edgefl-specific: the metadata spec lies about the weights (the hash is right: only the
    # metadata changed, and the weights hash covers the weights).
    lie = make_spec("scnn", (1, 8, 8), 10, width=64)
    add(
        "spec_lie.onnx",
        restamp(clone(cls), client_id="h-lie", spec=lie.to_dict()),
        "weights do not match spec scnn(width=64)",
    )
    wide = make_spec("scnn", (1, 8, 8), 10, width=WIDE)
    add(
        "wide.onnx",
        restamp(clone(cls), client_id="h-wide", spec=wide.to_dict()),
        f"weights do not match spec scnn(width={WIDE})",
    )
    # 20,000 layer widths: tens of seconds of module building if it were not refused first.
    huge = {
        "name": "mlp",
        "input_shape": [1, 8, 8],
        "num_classes": 10,
        "params": {"hidden": [4] * 20_000},
    }
    add(
        "huge_spec.onnx",
        restamp(clone(cls), client_id="h-huge", spec=huge),
        "spec in metadata is implausibly large",
    )

    # Same shapes and class count, another task: its names would have labelled the global
    # model had they been first.
    names = ["T-shirt", *(str(i) for i in range(1, 10))]
    add(
        "renamed.onnx",
        restamp(clone(cls), client_id="h-names", class_names=names),
        "class 0 is named 'T-shirt', the majority's '0'",
    )

    for name, content in files.items():
        data = content if isinstance(content, bytes) else content.SerializeToString()
        (root / name).write_bytes(data)
    _five_class_upload(root / "classes5.onnx")
    expect["classes5.onnx"] = "class count 5 disagrees with the majority"
    return expect


@pytest.fixture(scope="session")
def federation(tmp_path_factory):
    return build_federation(tmp_path_factory.mktemp("fed"))


@pytest.fixture(scope="module")
def hostile(federation, tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    expect = build_hostile(federation, root)
    sizes = [os.path.getsize(root / f"{c}.onnx") for c in CLASSIFIERS + DECODERS]
    assert max(sizes) < MAX_BYTES < os.path.getsize(root / "big.onnx")
    return root, expect


def _guarded(real, attempts):
    def guarded(file, *args, **kwargs):
        if isinstance(file, str | bytes | os.PathLike) and "etc/passwd" in os.fsdecode(file):
            attempts.append(os.fsdecode(file))
            raise AssertionError(f"tried to open {file}")
        return real(file, *args, **kwargs)

    return guarded


def fuse(root, out, *extra):
    args = [
        "server",
        "fuse",
        str(root),
        "--method",
        "fedmho-md",
        "--out",
        str(out),
        "--json",
        "--device",
        "cpu",
        "--max-upload-bytes",
        str(MAX_BYTES),
        "--synthetic",
        "300",
        "--epochs",
        "2",
        *extra,
    ]
    return CliRunner().invoke(app, args)


def test_hostile_uploads_rejected_valid_ones_fused(hostile, tmp_path, monkeypatch):
    root, expect = hostile
    before = snapshot(root)
    attempts: list[str] = []
    built: list[tuple[int | None, str]] = []
    real_build = edgefl.artifacts.upload.build_model

    def spy_build(spec):
        built.append((spec.params.get("width"), torch.get_default_device().type))
        return real_build(spec)

    monkeypatch.setattr(edgefl.artifacts.upload, "build_model", spy_build)
    for module in (builtins, io):
        monkeypatch.setattr(module, "open", _guarded(module.open, attempts))
    monkeypatch.setattr(os, "open", _guarded(os.open, attempts))
    r = fuse(root, tmp_path / "global.onnx")
    monkeypatch.undo()

    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    report = json.loads(r.stdout)
    reasons = {x["file"]: x["reason"] for x in report["rejected"]}
    assert sorted(reasons) == sorted(expect)
    for name, fragment in expect.items():
        assert fragment in reasons[name], (name, reasons[name])
    assert report["used"] == [*CLASSIFIERS, *DECODERS]
    assert report["skipped"] == []
    assert attempts == []
    # The absurdly wide spec was only ever built on the meta device (no memory allocated).
    assert (WIDE, "meta") in built and all(d == "meta" for w, d in built if w == WIDE)
    assert snapshot(root) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global.json", "global.onnx"]
    assert json.loads((tmp_path / "global.json").read_text())["rejected"] == report["rejected"]


def test_strict_refuses_and_writes_nothing(hostile, tmp_path):
    root, expect = hostile
    before = snapshot(root)
    r = fuse(root, tmp_path / "out" / "global.onnx", "--strict")
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    text = " ".join(r.output.split())
    assert f"--strict: {len(expect)} upload(s) rejected" in text
    assert "spec_lie.onnx: weights do not match spec" in text
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []
    assert snapshot(root) == before
