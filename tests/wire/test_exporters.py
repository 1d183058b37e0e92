"""exporters: export round trip, parity, metadata schema, quantization, atomic writes."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import exporters
from exporters import (
    ExportError,
    UploadRejected,
    export_onnx,
    quantize_int8,
    read_artifact,
    validate_metadata,
    validate_upload,
    weights_hash,
    write_model_atomic,
)

NUM_CLASSES = 10


class TinyCNN(nn.Module):
    """1x8x8 -> 10 logits; BatchNorm with non-trivial statistics catches Conv/BN folding."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(0.1),
            nn.Conv2d(4, 8, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.fc = nn.Linear(8, NUM_CLASSES)
        with torch.no_grad():
            bn = self.features[1]
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.features(x), 1))


class TinyDecoder(nn.Module):
    """z[B,2] + one-hot label[B,10] -> image[B,1,8,8]."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2 + NUM_CLASSES, 16 * 2 * 2)
        self.up = nn.Upsample(scale_factor=2)
        self.deconv = nn.ConvTranspose2d(16, 1, 4, stride=2, padding=1)

    def forward(self, z: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc(torch.cat([z, label], 1))).view(-1, 16, 2, 2)
        return torch.sigmoid(self.deconv(self.up(h)))


class ExportDivergent(nn.Module):
    """Computes something else while being exported: a real parity failure."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(torch.flatten(x, 1))
        return out * 2 if torch.compiler.is_exporting() else out


def classifier_meta(client_id: str = "client-a", **extra) -> dict:
    return {
        "kind": "classifier",
        "input_shape": [1, 8, 8],
        "num_classes": NUM_CLASSES,
        "class_names": [str(i) for i in range(NUM_CLASSES)],
        "edgefl_version": "0.1.0",
        "spec": {"name": "tiny_cnn"},
        "client_id": client_id,
        "label_counts": [5] * NUM_CLASSES,
        "profile": "test-device",
        "costs": {"params": 1234},
        "training": {"epochs": 1, "final_loss": 0.5},
        **extra,
    }


def decoder_meta(client_id: str = "client-d") -> dict:
    return {**classifier_meta(client_id), "kind": "decoder", "latent_dim": 2}


def global_meta() -> dict:
    meta = classifier_meta("server")
    for key in ("label_counts", "profile", "costs", "training"):
        del meta[key]
    return {
        **meta,
        "kind": "global",
        "method": "fedavg",
        "config": {"epochs": 3},
        "client_ids": ["client-a", "client-b"],
    }


@pytest.fixture(scope="module")
def cnn() -> TinyCNN:
    torch.manual_seed(0)
    return TinyCNN().eval()


@pytest.fixture(scope="module")
def exported(cnn, tmp_path_factory):
    directory = tmp_path_factory.mktemp("export")
    path = directory / "classifier.onnx"
    report = export_onnx(
        cnn,
        (torch.randn(2, 1, 8, 8),),
        path,
        input_names=["x"],
        output_names=["logits"],
        metadata=classifier_meta(),
    )
    return report, path


def test_round_trip_single_file_metadata_and_weights(cnn, exported):
    report, path = exported
    assert sorted(os.listdir(path.parent)) == ["classifier.onnx"]  # no .data sidecar, no temp
    assert report.size_bytes == path.stat().st_size
    assert report.opset >= 18 and report.ir_version <= 10
    assert report.max_abs_diff <= 1e-4

    art = read_artifact(path)
    model = onnx.load(str(path))
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [report.opset]
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    assert art.input_names == ["x"] and art.output_names == ["logits"]

    expected = classifier_meta()
    expected.update(schema_version=1, weights_sha256=weights_hash(art.model))
    assert art.metadata == expected
    assert validate_metadata(art.metadata) == []

    # Names are the torch state_dict keys with the original (unfolded) values; BatchNorm's
    # num_batches_tracked counter is unused in eval and so is not exported.
    torch_sd = {k: v.numpy() for k, v in cnn.state_dict().items()}
    onnx_sd = art.state_dict()
    assert set(onnx_sd) == {k for k in torch_sd if not k.endswith("num_batches_tracked")}
    for name, value in onnx_sd.items():
        np.testing.assert_array_equal(value, torch_sd[name], err_msg=name)
    rebuilt = TinyCNN()
    missing, unexpected = rebuilt.load_state_dict(
        {k: torch.from_numpy(v) for k, v in onnx_sd.items()}, strict=False
    )
    assert unexpected == [] and all(k.endswith("num_batches_tracked") for k in missing)

    x = torch.randn(7, 1, 8, 8)  # batch size never seen during export
    with torch.no_grad():
        np.testing.assert_allclose(art.run(x.numpy()), cnn(x).numpy(), atol=1e-5)
        np.testing.assert_allclose(art.run(x.numpy()), rebuilt.eval()(x).numpy(), atol=1e-5)
    meta_map = art.session().get_modelmeta().custom_metadata_map
    assert exporters.METADATA_KEY in meta_map


def test_decoder_export_and_validate(tmp_path):
    torch.manual_seed(1)
    decoder = TinyDecoder()
    label = torch.nn.functional.one_hot(torch.tensor([1, 3]), NUM_CLASSES).float()

    def sample(batch: int) -> tuple[torch.Tensor, ...]:
        labels = torch.randint(0, NUM_CLASSES, (batch,))
        return torch.randn(batch, 2), nn.functional.one_hot(labels, NUM_CLASSES).float()

    path = tmp_path / "decoder.onnx"
    report = export_onnx(
        decoder,
        (torch.randn(2, 2), label),
        path,
        input_names=["z", "label"],
        output_names=["image"],
        metadata=decoder_meta(),
        sample_inputs=sample,
    )
    assert report.max_abs_diff <= 1e-4
    art = validate_upload(path)
    assert art.kind == "decoder"
    assert art.run(*[t.numpy() for t in sample(3)]).shape == (3, 1, 8, 8)


def test_parity_failure_raises_and_writes_nothing(tmp_path):
    path = tmp_path / "bad.onnx"
    with pytest.raises(ExportError, match=r"max difference .* > atol"):
        export_onnx(
            ExportDivergent(),
            (torch.randn(2, 1, 8, 8),),
            path,
            input_names=["x"],
            output_names=["logits"],
            metadata=classifier_meta(),
        )
    assert os.listdir(tmp_path) == []


def test_export_refuses_bad_metadata_or_contract_before_writing(cnn, tmp_path):
    path = tmp_path / "m.onnx"
    kwargs = {"input_names": ["x"], "output_names": ["logits"]}
    example = (torch.randn(2, 1, 8, 8),)
    with pytest.raises(ExportError, match="invalid metadata: .*'client_id'"):
        export_onnx(cnn, example, path, metadata=classifier_meta(client_id=""), **kwargs)
    wrong_shape = classifier_meta(input_shape=[1, 28, 28])
    with pytest.raises(ExportError, match="graph does not match its metadata"):
        export_onnx(cnn, example, path, metadata=wrong_shape, **kwargs)
    with pytest.raises(ExportError, match="opset 17"):
        export_onnx(cnn, example, path, metadata=classifier_meta(), opset=17, **kwargs)
    assert os.listdir(tmp_path) == []


def test_export_keeps_stdout_and_stderr_clean(cnn, tmp_path, capfd):
    report = export_onnx(
        cnn,
        (torch.randn(2, 1, 8, 8),),
        tmp_path / "quiet.onnx",
        input_names=["x"],
        output_names=["logits"],
        metadata=classifier_meta(),
    )
    quantize_int8(report.path, tmp_path / "quiet_int8.onnx")
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert cnn.training is False  # mode restored to what it was


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("input_shape", [1, 65536, 65536]),
        ("num_classes", 10**9),
        ("latent_dim", 10**8),
        ("label_counts", [10**13] + [1] * 9),
    ],
)
def test_every_count_and_dimension_in_metadata_is_bounded(key, value):
    # The server sizes memory and work by these numbers before it runs anything: a client's word
    # for them is capped (issue 18: "every number in metadata is bounded before use").
    meta = decoder_meta() | {"weights_sha256": "a" * 64, "schema_version": 1, key: value}
    problems = validate_metadata(meta)
    assert problems and all(f"'{key}'" in p for p in problems), problems


def test_validate_metadata_lists_every_problem():
    assert validate_metadata(classifier_meta(weights_sha256="0" * 64, schema_version=1)) == []
    assert (
        validate_metadata(decoder_meta() | {"weights_sha256": "a" * 64, "schema_version": 1}) == []
    )
    assert (
        validate_metadata(global_meta() | {"weights_sha256": "b" * 64, "schema_version": 1}) == []
    )
    assert validate_metadata([1, 2]) == ["metadata must be a JSON object, got list"]

    bad = {
        "schema_version": 2,
        "kind": "decoder",
        "input_shape": [1, 0, 8],
        "num_classes": True,
        "class_names": ["a", 3],
        "edgefl_version": 1,
        "weights_sha256": "XYZ",
        "spec": {"no_name": 1},
        "client_id": "",
        "label_counts": [1, -1],
        "profile": 3,
        "costs": [],
        "training": {"final_loss": float("nan")},
        "latent_dim": 0,
        "future_field": {"anything": "goes"},
    }
    problems = validate_metadata(bad)
    text = "\n".join(problems)
    for key in (
        "schema_version",
        "input_shape",
        "num_classes",
        "class_names",
        "edgefl_version",
        "weights_sha256",
        "spec",
        "client_id",
        "label_counts",
        "profile",
        "costs",
        "training.final_loss",
        "latent_dim",
    ):
        assert f"'{key}'" in text, key
    assert "future_field" not in text  # unknown keys are allowed (forward compatible)
    assert len(problems) == 13

    missing = validate_metadata({"kind": "global"})
    assert any("'method'" in p for p in missing) and any("'client_ids'" in p for p in missing)
    short = classifier_meta(label_counts=[1, 2])
    assert any("'label_counts' has 2 entries" in p for p in validate_metadata(short))


def test_quantize_int8_preserves_metadata_and_validates(exported, tmp_path):
    _, path = exported
    before = path.read_bytes()
    dst = tmp_path / "classifier_int8.onnx"
    result = quantize_int8(path, dst)
    assert path.read_bytes() == before
    assert result["size_after"] == dst.stat().st_size

    # The weights shrink; on this tiny model the quantize/dequantize nodes can outweigh that in
    # the file (the exporter no longer pads every node with ~1 KB of stack trace).
    def weight_bytes(file):
        return sum(len(t.raw_data) for t in onnx.load(file).graph.initializer)

    assert weight_bytes(dst) < weight_bytes(path)
    assert result["max_abs_diff"] < 0.1
    art = validate_upload(dst)
    original = read_artifact(path).metadata
    assert art.metadata["quantized"] == "int8-dynamic"
    assert art.metadata["weights_sha256"] == weights_hash(art.model) != original["weights_sha256"]
    unchanged = {k: v for k, v in art.metadata.items() if k not in ("quantized", "weights_sha256")}
    assert unchanged == {k: v for k, v in original.items() if k != "weights_sha256"}
    ops = {n.op_type for n in art.model.graph.node}
    assert {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"} <= ops
    assert sorted(os.listdir(tmp_path)) == ["classifier_int8.onnx"]


def test_weights_hash_tracks_values(exported):
    model = onnx.load(str(exported[1]))
    original = weights_hash(model)
    assert weights_hash(onnx.load(str(exported[1]))) == original
    weight = model.graph.initializer[0]
    array = onnx.numpy_helper.to_array(weight).copy()
    array.flat[0] += 1.0
    weight.CopyFrom(onnx.numpy_helper.from_array(array, weight.name))
    assert weights_hash(model) != original


def test_atomic_write_leaves_no_temp_files(exported, tmp_path, monkeypatch):
    model = onnx.load(str(exported[1]))
    target = tmp_path / "out.onnx"
    write_model_atomic(model, target)
    exporters.atomic_write_text(tmp_path / "report.json", "{}")
    assert sorted(os.listdir(tmp_path)) == ["out.onnx", "report.json"]
    good = target.read_bytes()

    def crash(*_args, **_kwargs):
        raise OSError("disk vanished")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk vanished"):
        write_model_atomic(onnx.ModelProto(), target)
    assert target.read_bytes() == good  # the old file survives intact
    assert sorted(os.listdir(tmp_path)) == ["out.onnx", "report.json"]


def test_read_artifact_requires_metadata(exported, tmp_path):
    model = onnx.load(str(exported[1]))
    del model.metadata_props[:]
    path = tmp_path / "plain.onnx"
    write_model_atomic(model, path)
    with pytest.raises(ValueError, match="no 'edgefl' metadata"):
        read_artifact(path)
    assert read_artifact(path, require_metadata=False).metadata == {}
    with pytest.raises(UploadRejected):
        validate_upload(path)
    assert validate_upload(path, require_metadata=False).metadata == {}


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_new_files_get_the_users_umask(tmp_path, mask):
    # mkstemp makes 0600 files; a written model, report or picture is a plain file (issue 19).
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from edgefl.plots import save_figure

    old = os.umask(mask)
    try:
        exporters.atomic.atomic_write_text(tmp_path / "r.json", "{}")
        fig = plt.figure()
        save_figure(fig, tmp_path / "p.png")
        plt.close(fig)
    finally:
        os.umask(old)
    for name in ("r.json", "p.png"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~mask, name
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.png", "r.json"]  # no temp left


def test_parity_is_relative_for_large_outputs():
    # float32 rounding grows with the value: 1.2e-4 apart at 500 is agreement (a global model's
    # logits on random inputs reached that and failed an absolute 1e-4, 2026-11-23), at 0.5 not.
    from exporters import max_relative_diff

    assert max_relative_diff(np.array([500.0, -800.0]), np.array([500.00012, -800.0001])) < 1e-6
    assert max_relative_diff(np.array([0.5]), np.array([0.50012])) > 1e-4
    assert max_relative_diff(np.array([np.nan]), np.array([1.0])) == float("inf")
    assert max_relative_diff(np.zeros((2, 3)), np.zeros((3, 2))) == float("inf")


def test_parity_scales_a_small_output_by_its_samples_largest():
    # A logit near 0 beside 30-unit ones is the difference of large sums: its rounding is the
    # sample's scale, not its own (a DP-trained classifier's upload was refused at 5.9e-4).
    from exporters import max_relative_diff

    big = np.array([[30.0, -25.0, 0.001]])
    assert max_relative_diff(big, big + [[0.0, 0.0, 6e-4]]) < 1e-4
    small = np.array([[30.0, -25.0, 0.001], [0.5, -0.2, 0.001]])
    # the same error in a sample of small values is a disagreement, whatever the others hold
    assert max_relative_diff(small, small + [[0.0, 0.0, 0.0], [0.0, 0.0, 6e-4]]) > 1e-4
