"""An accepted upload never sinks a method (issue 33, item 2): whatever a method reads from a
kept upload is checked at ingest, int8 uploads included, and a method sets aside by name what
it cannot use. Each upload here was accepted by the ingest before these checks and then broke
`server fuse` with an error naming no upload (or refused the whole run)."""

from __future__ import annotations

import json

import onnx
import pytest
from fed_fixtures import build_federation, copy_uploads
from typer.testing import CliRunner

import exporters
from edgefl.cli import app
from edgefl.errors import FusionError
from edgefl.server.fuse import FuseJob, run_fuse
from edgefl.server.ingest import ingest

MAX = exporters.DEFAULT_MAX_UPLOAD_BYTES


@pytest.fixture(scope="session")
def federation(tmp_path_factory):
    return build_federation(tmp_path_factory.mktemp("fed"))


@pytest.fixture(scope="module")
def int8(federation, tmp_path_factory):
    """client-001's classifier, dynamically quantized as `client train --quantize int8` does."""
    path = tmp_path_factory.mktemp("int8") / "client-001.onnx"
    exporters.quantize_int8(federation / "client-001.onnx", path)
    return path


def _with_meta(src, dest, **changes) -> None:
    model = onnx.load(str(src))
    meta = exporters.get_metadata(model)
    for key, value in changes.items():
        if key == "spec_input_shape":
            meta["spec"]["input_shape"] = value
        else:
            meta[key] = value
    exporters.set_metadata(model, meta)  # the weights hash covers weights, not metadata
    onnx.save(model, str(dest))


def _folder(tmp_path, federation, *extra):
    copy_uploads(federation, tmp_path, ["client-000.onnx"])
    for src, name, changes in extra:
        _with_meta(src, tmp_path / name, **changes)
    return tmp_path


@pytest.mark.parametrize("quantized", [True, exporters.QUANTIZED_TAG])
def test_an_int8_upload_with_a_malformed_spec_is_refused_at_ingest(
    tmp_path, federation, int8, quantized
):
    up = _folder(
        tmp_path / "up",
        federation,
        (int8, "bad.onnx", {"spec_input_shape": [1, 28], "quantized": quantized}),
    )
    found = ingest(up, max_upload_bytes=MAX, jobs=1)
    assert [u.name for u in found.uploads] == ["client-000.onnx"]
    [(name, reason)] = found.rejected
    assert name == "bad.onnx" and ("spec" in reason or "quantized" in reason), reason
    report = run_fuse(FuseJob(str(up), "fedavg", out=str(tmp_path / "g.onnx"), device="cpu"))
    assert report["used"] == ["client-000"]


def test_ensemble_sets_an_int8_upload_aside_by_name(tmp_path, federation, int8):
    up = tmp_path / "up"
    copy_uploads(federation, up, ["client-000.onnx"])
    (up / "client-001.onnx").write_bytes(int8.read_bytes())
    out = tmp_path / "g.onnx"
    r = CliRunner().invoke(
        app,
        [
            "server",
            "fuse",
            str(up),
            "--method",
            "ensemble",
            "--out",
            str(out),
            "--device",
            "cpu",
            "--json",
            "--quiet",
        ],
    )
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["used"] == ["client-000"]
    [skipped] = report["skipped"]
    assert skipped["file"] == "client-001.onnx" and "onnxruntime only" in skipped["reason"]
    assert json.loads(out.with_suffix(".json").read_text())["skipped"] == [skipped]


def test_a_run_with_nothing_usable_names_every_upload_and_why(tmp_path, int8):
    up = tmp_path / "up"
    up.mkdir()
    (up / "client-001.onnx").write_bytes(int8.read_bytes())
    (up / "junk.onnx").write_bytes(b"not onnx")
    with pytest.raises(FusionError) as err:
        run_fuse(FuseJob(str(up), "ensemble", out=str(tmp_path / "g.onnx"), device="cpu"))
    lines = err.value.message.splitlines()
    assert any(ln.startswith("  rejected junk.onnx: not a valid ONNX file") for ln in lines)
    assert any(
        ln.startswith("  not used client-001.onnx: ") and "onnxruntime only" in ln for ln in lines
    ), lines


def _reshaped_decoder(src, dest) -> None:
    """A decoder whose final Reshape makes (B*8, 1, 1, 8) of what should be (B, 1, 8, 8), with
    its declared shapes gone and no spec: only onnxruntime could run it, and it returns images
    of the wrong shape (fedcvae-ens then failed inside torch)."""
    model = onnx.load(str(src))
    eights = [n for n in model.graph.node if n.op_type == "Constant" and n.attribute[0].ints == [8]]
    eights[0].attribute[0].ints[:] = [1]
    model.graph.ClearField("value_info")
    onnx.save(model, str(dest))
    _with_meta(dest, dest, spec=None, weights_sha256=exporters.weights_hash(model))


def test_an_upload_run_through_onnxruntime_only_must_keep_its_promised_shape(tmp_path, federation):
    up = tmp_path / "up"
    copy_uploads(federation, up, ["client-002.onnx"])
    _reshaped_decoder(federation / "client-003.onnx", up / "client-003.onnx")
    found = ingest(up, max_upload_bytes=MAX, jobs=1)
    assert [u.name for u in found.uploads] == ["client-002.onnx"]
    [(name, reason)] = found.rejected
    assert name == "client-003.onnx" and "its metadata promises [1, 1, 8, 8]" in reason, reason


def test_value_info_must_agree_with_the_computed_shapes(tmp_path, federation):
    """Declared shapes reach onnxruntime with the bytes: one claiming a 10^13-element tensor is
    refused, not trusted to go unused (the validator sizes the graph by what it computes)."""
    model = onnx.load(str(federation / "client-000.onnx"))
    [conv] = [v for v in model.graph.value_info if v.name == "conv2d"]
    conv.type.tensor_type.shape.dim[2].dim_value = 10**6
    conv.type.tensor_type.shape.dim[3].dim_value = 10**6
    onnx.save(model, str(tmp_path / "big.onnx"))
    with pytest.raises(exporters.UploadRejected, match="value_info declares shape"):
        exporters.validate_upload(tmp_path / "big.onnx")
    exporters.validate_upload(federation / "client-000.onnx")  # its true declarations pass


@pytest.mark.parametrize(
    "changes, problem",
    [
        ({"kind": "global", "label_counts": "lots"}, "'label_counts' must be"),
        ({"input_shape": [64]}, "[channels, height, width] for a classifier"),
        ({"quantized": "yes"}, "'quantized' must be"),
    ],
)
def test_metadata_that_methods_read_is_checked_for_every_kind(federation, changes, problem):
    meta = exporters.get_metadata(onnx.load(str(federation / "client-000.onnx"))) | changes
    assert any(problem in p for p in exporters.validate_metadata(meta)), problem
