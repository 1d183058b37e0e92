"""ingest_dir/validate_upload against hostile uploads: each is refused for the right reason."""

from __future__ import annotations

import builtins
import hashlib
import io
import os
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from onnx_edits import clone, edit_weight, make_external, restamp, tiny_graph, with_client
from torch import nn

import exporters.validate
from exporters import (
    UploadRejected,
    export_onnx,
    ingest_dir,
    validate_upload,
)

MAX_BYTES = 200_000  # the real uploads here are ~20 kB


class TinyCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 4 * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(torch.relu(self.conv(x))), 1))


class TinyDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 64), nn.Sigmoid())

    def forward(self, z: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([z, label], 1)).view(-1, 1, 8, 8)


def meta_for(kind: str, client_id: str, classes: int = 10) -> dict:
    meta = {
        "kind": kind,
        "input_shape": [1, 8, 8],
        "num_classes": classes,
        "class_names": [f"c{i}" for i in range(classes)],
        "edgefl_version": "0.1.0",
        "spec": {"name": f"tiny_{kind}"},
        "client_id": client_id,
        "label_counts": [3] * classes,
        "profile": None,
        "costs": {},
        "training": {"epochs": 1},
    }
    if kind == "decoder":
        meta["latent_dim"] = 2
    return meta


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, onnx.ModelProto]:
    """Three genuine exports; every hostile file below is derived from them."""
    out = tmp_path_factory.mktemp("sources")
    torch.manual_seed(0)
    kw = {"input_names": ["x"], "output_names": ["logits"]}
    export_onnx(
        TinyCNN(),
        (torch.randn(2, 1, 8, 8),),
        out / "cls.onnx",
        metadata=meta_for("classifier", "a"),
        **kw,
    )
    export_onnx(
        TinyCNN(5),
        (torch.randn(2, 1, 8, 8),),
        out / "c5.onnx",
        metadata=meta_for("classifier", "five", 5),
        **kw,
    )
    export_onnx(
        TinyDecoder(),
        (torch.randn(2, 2), torch.eye(10)[:2]),
        out / "dec.onnx",
        input_names=["z", "label"],
        output_names=["image"],
        metadata=meta_for("decoder", "d"),
    )
    return {name: onnx.load(str(out / f"{name}.onnx")) for name in ("cls", "c5", "dec")}


def build_uploads(src: dict[str, onnx.ModelProto], root: Path) -> dict[str, str]:
    """Write the upload directory; returns file name -> expected reason fragment ('' = accept)."""
    cls = src["cls"]
    files: dict[str, onnx.ModelProto | bytes] = {}
    expect: dict[str, str] = {}

    def add(name: str, content, reason: str) -> None:
        files[name], expect[name] = content, reason

    add("a.onnx", with_client(cls, "client-a"), "")
    add("b.onnx", with_client(cls, "client-b"), "")
    add("d.onnx", with_client(src["dec"], "client-d"), "")
    add("a_copy.onnx", with_client(cls, "client-a"), "duplicate client id 'client-a'")
    add("classes5.onnx", with_client(src["c5"], "client-5"), "class count 5 disagrees")

    ext = with_client(cls, "client-ext")
    make_external(ext.graph.initializer[0], "../../etc/passwd")
    add("ext.onnx", ext, "external data at '../../etc/passwd'")
    ext_const = with_client(cls, "client-ext2")
    const = next(n for n in ext_const.graph.node if n.op_type == "Constant")
    del const.attribute[:]
    const.attribute.append(helper.make_attribute("value", numpy_helper.from_array(np.ones(2))))
    make_external(const.attribute[0].t, "/etc/shadow")
    add("ext_const.onnx", ext_const, "attribute 'value' claims external data at '/etc/shadow'")

    good = with_client(cls, "client-t").SerializeToString()
    add("truncated.onnx", good[: len(good) // 2], "not a valid ONNX file")
    add("random.onnx", np.random.default_rng(7).bytes(5000), "not a valid ONNX file")
    add("empty.onnx", b"", "not a valid ONNX file")
    add("big.onnx", b"\0" * (MAX_BYTES + 1), f"over the {MAX_BYTES}-byte limit")

    add("nan.onnx", restamp(edit_weight(clone(cls), float("nan")), client_id="nan"), "NaN")
    add("hash.onnx", edit_weight(with_client(cls, "client-h"), 0.123), "weights hash mismatch")

    absurd = with_client(cls, "client-absurd")
    absurd.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 10**9
    add("absurd.onnx", absurd, "absurd declared dimension")

    nometa = clone(cls)
    del nometa.metadata_props[:]
    add("nometa.onnx", nometa, "no 'edgefl' metadata")
    badjson = with_client(cls, "client-j")
    next(p for p in badjson.metadata_props if p.key == "edgefl").value = '{"kind": "classif'
    add("badjson.onnx", badjson, "not valid JSON")
    add(
        "types.onnx",
        restamp(clone(cls), num_classes="10", label_counts="many"),
        "'num_classes' must be an int",
    )
    add(
        "shape.onnx",
        restamp(clone(cls), input_shape=[1, 28, 28], client_id="client-s"),
        "graph does not match its metadata",
    )

    old = with_client(cls, "client-old")
    old.opset_import[0].version = 17
    add("old_opset.onnx", old, "opset 17 outside")
    new_ir = with_client(cls, "client-ir")
    new_ir.ir_version = 11
    add("ir.onnx", new_ir, "IR version 11")

    add(
        "einsum.onnx",
        tiny_graph(helper.make_node("Einsum", ["x", "x"], ["y"], equation="bi,bi->bi")),
        "'Einsum' is not in the allowed",
    )
    evil = helper.make_node("Backdoor", ["x"], ["y"], domain="com.evil")
    add(
        "custom.onnx", tiny_graph(evil, [helper.make_opsetid("com.evil", 1)]), "non-standard domain"
    )
    branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "branch",
        [],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["B", 4])],
    )
    cond = helper.make_node("If", ["x"], ["y"], then_branch=branch, else_branch=branch)
    add("if.onnx", tiny_graph(cond), "'If' is not in the allowed")

    for name, content in files.items():
        data = content if isinstance(content, bytes) else content.SerializeToString()
        (root / name).write_bytes(data)
    os.symlink(root / "a.onnx", root / "link.onnx")
    expect["link.onnx"] = "symlink"
    (root / "dir.onnx").mkdir()
    expect["dir.onnx"] = "not a regular file"
    (root / "notes.txt").write_text("not a model")
    (root / ".hidden.onnx").write_bytes(b"junk")
    return expect


def snapshot(root: Path) -> dict[str, tuple]:
    state = {}
    for name in sorted(os.listdir(root)):
        info = os.lstat(root / name)
        if stat.S_ISLNK(info.st_mode):
            content = os.readlink(root / name)
        elif stat.S_ISREG(info.st_mode):
            content = hashlib.sha256((root / name).read_bytes()).hexdigest()
        else:
            content = "dir"
        state[name] = (info.st_mode, info.st_size, info.st_mtime_ns, content)
    return state


@pytest.fixture(scope="module")
def ingested(sources, tmp_path_factory):
    root = tmp_path_factory.mktemp("uploads")
    expect = build_uploads(sources, root)
    before = snapshot(root)

    # Any attempt to open a path an external-data entry names fails loudly (and is recorded).
    forbidden = ("etc/passwd", "etc/shadow")
    attempts: list[str] = []

    def guard(real):
        def guarded(file, *args, **kwargs):
            if isinstance(file, (str, bytes, os.PathLike)) and any(
                f in os.fsdecode(file) for f in forbidden
            ):
                attempts.append(os.fsdecode(file))
                raise AssertionError(f"tried to open {file}")
            return real(file, *args, **kwargs)

        return guarded

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(builtins, "open", guard(builtins.open))
        mp.setattr(io, "open", guard(io.open))
        mp.setattr(os, "open", guard(os.open))
        result = ingest_dir(root, max_bytes=MAX_BYTES)
    return result, expect, before, snapshot(root), attempts


def test_valid_uploads_accepted(ingested):
    result, expect, *_ = ingested
    accepted = sorted(Path(a.path).name for a in result.accepted)
    assert accepted == sorted(n for n, reason in expect.items() if not reason)
    for artifact in result.accepted:
        assert artifact.metadata["num_classes"] == 10
    assert {a.kind for a in result.accepted} == {"classifier", "decoder"}


def test_every_hostile_upload_rejected_with_its_reason(ingested):
    result, expect, *_ = ingested
    reasons = dict(result.rejected)
    assert len(reasons) == len(result.rejected)  # one verdict per file
    hostile = {n: r for n, r in expect.items() if r}
    assert sorted(reasons) == sorted(hostile)
    for name, fragment in hostile.items():
        assert fragment in reasons[name], f"{name}: {reasons[name]!r}"
        assert "\n" not in reasons[name]


def test_types_reason_lists_every_problem(ingested):
    reasons = dict(ingested[0].rejected)
    assert "'label_counts'" in reasons["types.onnx"]
    assert "'class_names'" not in reasons["types.onnx"]  # skipped when num_classes is unusable


def test_notes_and_skipped_files(ingested):
    result = ingested[0]
    assert any("notes.txt" in note for note in result.notes)
    assert all(".hidden" not in note for note in result.notes)
    assert ".hidden.onnx" not in dict(result.rejected)


def test_external_paths_never_opened_and_directory_unchanged(ingested):
    _, _, before, after, attempts = ingested
    assert attempts == []
    assert after == before


def test_accepted_artifacts_run(ingested):
    for artifact in ingested[0].accepted:
        if artifact.kind == "decoder":
            out = artifact.run(np.zeros((3, 2)), np.eye(10)[:3])
            assert out.shape == (3, 1, 8, 8)
        else:
            assert artifact.run(np.zeros((3, 1, 8, 8))).shape == (3, 10)


def test_size_checked_before_parsing(tmp_path, sources, monkeypatch):
    path = tmp_path / "ok.onnx"
    path.write_bytes(with_client(sources["cls"], "client-z").SerializeToString())
    assert validate_upload(path).client_id == "client-z"

    def no_parse(_data):
        raise AssertionError("parsed an oversized file")

    monkeypatch.setattr(exporters.validate, "_parse", no_parse)
    with pytest.raises(UploadRejected, match="over the 100-byte limit"):
        validate_upload(path, max_bytes=100)


def test_a_hard_link_is_as_foreign_as_a_symlink(tmp_path, sources):
    # A valid model outside the upload directory, reached through a hard link inside it: the
    # server must not read a file another path owns (issue 18: the one that read outside).
    outside = tmp_path / "private" / "model.onnx"
    outside.parent.mkdir()
    outside.write_bytes(with_client(sources["cls"], "client-h").SerializeToString())
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    os.link(outside, uploads / "h.onnx")
    with pytest.raises(UploadRejected, match="2 hard links"):
        validate_upload(uploads / "h.onnx")
    result = ingest_dir(uploads, max_bytes=MAX_BYTES)
    assert result.accepted == [] and "hard links" in dict(result.rejected)["h.onnx"]
    os.unlink(outside)  # once it is the upload's own file, it is accepted
    assert validate_upload(uploads / "h.onnx").client_id == "client-h"


def test_allowlist_is_closed_but_widenable(tmp_path):
    path = tmp_path / "einsum.onnx"
    node = helper.make_node("Einsum", ["x", "x"], ["y"], equation="bi,bi->bi")
    path.write_bytes(tiny_graph(node).SerializeToString())
    with pytest.raises(UploadRejected, match="Einsum"):
        validate_upload(path, require_metadata=False)
    widened = exporters.validate.DEFAULT_ALLOWED_OPS | {"Einsum"}
    art = validate_upload(path, require_metadata=False, allowed_ops=widened)
    np.testing.assert_allclose(art.run(np.full((2, 4), 3.0)), np.full((2, 4), 9.0))
