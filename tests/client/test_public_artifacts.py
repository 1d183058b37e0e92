"""Data artifacts (predictions, prototypes): written as ONNX constants, validated by the same
ingest as model uploads; FedOL's Algorithm 1 on hand-built votes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from fed_fixtures import pred_meta as fixture_pred_meta
from fed_fixtures import proto_meta

import exporters
from edgefl.data.public import load_public, public_fingerprint
from edgefl.errors import FusionError
from edgefl.fusion.fedol import distillation_targets, entropy, fedol_pseudo_labels
from edgefl.server.fuse import FuseJob, run_fuse
from exporters.constant import constant_model

C = 10
N = 40


def pred_meta(client: str, n: int = N, fingerprint: str = "a" * 64) -> dict:
    return fixture_pred_meta(client, n, fingerprint, C)


def probs(n: int = N, seed: int = 0, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).dirichlet(np.ones(C), size=n).astype(dtype)


def forge(path: Path, outputs: dict, meta: dict, *, model=None) -> Path:
    """What a hostile client can do: any arrays, correctly hashed metadata, no export checks."""
    model = model if model is not None else constant_model(outputs)
    meta = meta | {"schema_version": exporters.SCHEMA_VERSION}
    meta["weights_sha256"] = exporters.weights_hash(model)
    exporters.set_metadata(model, meta)
    path.write_bytes(model.SerializeToString())
    return path


# --- FedOL Algorithm 1 --------------------------------------------------------------------------


def test_pseudo_labels_hand_built_votes():
    # rho = 0.5 over N = 4 samples: each model's baseline is its 2nd-lowest entropy.
    a = [[0.9, 0.05, 0.05], [0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.34, 0.33, 0.33]]
    b = [[0.1, 0.8, 0.1], [0.05, 0.9, 0.05], [0.4, 0.3, 0.3], [0.33, 0.34, 0.33]]
    c = [[0.3, 0.3, 0.4], [0.1, 0.1, 0.8], [0.05, 0.05, 0.9], [0.33, 0.33, 0.34]]
    labels, reliable = fedol_pseudo_labels(np.array([a, b, c]), rho=0.5)
    # Lowest two entropies: A on x0 (0.39), x2 (0.80); B on x1 (0.39), x0 (0.64); C on x2, x1.
    assert reliable.tolist() == [
        [True, False, True, False],
        [True, True, False, False],
        [False, True, True, False],
    ]
    # C2 = column means: A (.51, .345, .145), B (.22, .585, .195), C (.195, .195, .61).
    # x0: A votes 0, B votes 1: G = ((.51-.22)/.73, (-.345+.585)/.93, -1) = (.397, .258, -1) -> 0
    # x1: B votes 1, C votes 2: G = (-1, (.585-.195)/.78, (-.195+.61)/.805) = (-1, .5, .516) -> 2
    # x2: A votes 1, C votes 2: G = (-1, (.345-.195)/.54, (-.145+.61)/.755) = (-1, .278, .616) -> 2
    # x3: nobody is confident enough -> no pseudo-label.
    assert labels.tolist() == [0, 2, 2, -1]


def test_pseudo_labels_normalise_per_class():
    # One sample, both models reliable. Unnormalised, class 0 and 1 tie at 0.15; divided
    # elementwise by sum C2: G = (0.15/1.05, 0.15/0.95) -> class 1.
    labels, reliable = fedol_pseudo_labels(np.array([[[0.6, 0.4]], [[0.45, 0.55]]]), rho=0.1)
    assert reliable.all() and labels.tolist() == [1]


def test_pseudo_label_baseline_is_ceil_rho_n():
    p = probs(20, seed=3)[None]
    for rho in (0.1, 0.15, 0.33, 1.0):
        _, reliable = fedol_pseudo_labels(p, rho)
        assert reliable.sum() == math.ceil(rho * 20)  # no ties in random probabilities


def test_distillation_targets_equal_weighted_kl():
    p = probs(5, seed=1)[None].repeat(3, 0) ** np.array([1.0, 2.0, 0.5])[:, None, None]
    p /= p.sum(-1, keepdims=True)
    s = probs(5, seed=2)
    q, const = distillation_targets(p)
    lam = np.exp(-entropy(p)) / np.exp(-entropy(p)).sum(0)
    kl = (p * (np.log(p) - np.log(s)[None])).sum(-1)
    assert np.allclose((lam * kl).sum(0), const - (q * np.log(s)).sum(1), atol=1e-5)


# --- writing and validating -------------------------------------------------------------------


def test_written_artifacts_round_trip(tmp_path):
    rep = exporters.write_constant_artifact(
        tmp_path / "p.onnx", {"predictions": probs(dtype=np.float16)}, pred_meta("c0")
    )
    art = exporters.validate_upload(rep.path)
    assert art.kind == "predictions" and art.input_names == [] and rep.size_bytes < 2_000
    out = exporters.read_constant_outputs(art.model)["predictions"]
    assert out.dtype == np.float16 and np.array_equal(out, probs(dtype=np.float16))
    assert np.array_equal(art.session().run(None, {})[0], out)  # onnxruntime agrees

    means = np.random.default_rng(0).normal(size=(3, 6)).astype(np.float32)
    exporters.write_constant_artifact(tmp_path / "q.onnx", {"prototypes": means}, proto_meta("c1"))
    art = exporters.validate_upload(tmp_path / "q.onnx")
    assert np.array_equal(exporters.read_constant_outputs(art.model)["prototypes"], means)


@pytest.mark.parametrize(
    ("outputs", "meta", "match"),
    [
        ({"predictions": probs(N - 1)}, pred_meta("c"), "metadata implies"),
        ({"predictions": probs() * 1.5}, pred_meta("c"), "must sum to 1"),
        ({"predictions": np.full((N, C), np.nan, np.float32)}, pred_meta("c"), "NaN"),
        ({"predictions": probs()}, pred_meta("c") | {"public_fingerprint": "xyz"}, "64 lowercase"),
        ({"prototypes": np.ones((2, 6), np.float32)}, proto_meta("c"), "metadata implies"),
    ],
)
def test_writer_refuses_what_ingest_would_reject(tmp_path, outputs, meta, match):
    with pytest.raises(exporters.ExportError, match=match):
        exporters.write_constant_artifact(tmp_path / "x.onnx", outputs, meta)
    assert not (tmp_path / "x.onnx").exists()


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    d = tmp_path_factory.mktemp("uploads")
    ok = probs()
    exporters.write_constant_artifact(d / "good.onnx", {"predictions": ok}, pred_meta("good"))
    exporters.write_constant_artifact(
        d / "good16.onnx", {"predictions": ok.astype(np.float16)}, pred_meta("good16")
    )
    means = np.ones((3, 6), np.float32)
    exporters.write_constant_artifact(d / "proto.onnx", {"prototypes": means}, proto_meta("p"))
    forge(d / "short.onnx", {"predictions": probs(N - 5)}, pred_meta("short"))
    forge(
        d / "wide.onnx",
        {"predictions": probs()},
        pred_meta("wide")
        | {"num_classes": 11, "class_names": [str(i) for i in range(11)], "label_counts": [1] * 11},
    )
    nan = ok.copy()
    nan[3, 2] = np.nan
    forge(d / "nan.onnx", {"predictions": nan}, pred_meta("nan"))
    forge(d / "unnormalised.onnx", {"predictions": ok * 0.5}, pred_meta("unnormalised"))
    forge(d / "negative.onnx", {"predictions": ok - 0.05}, pred_meta("negative"))
    forge(d / "renamed.onnx", {"logits": ok}, pred_meta("renamed"))
    forge(d / "protoshape.onnx", {"prototypes": np.ones((2, 6), np.float32)}, proto_meta("ps"))
    forge(d / "protorep.onnx", {"prototypes": means}, proto_meta("pr", rep=7))
    forge(d / "protodup.onnx", {"prototypes": means}, proto_meta("pd", classes=(1, 1, 2)))
    forge(d / "protocount.onnx", {"prototypes": means}, proto_meta("pc") | {"counts": [1, 2]})
    forge(d / "spec.onnx", {"predictions": ok}, pred_meta("spec") | {"spec": {"name": "cnn"}})
    forge(d / "int.onnx", {"predictions": np.ones((N, C), np.int64)}, pred_meta("int"))
    # A node other than Identity: an Add that would compute the "constant".
    added = constant_model({"predictions": ok})
    added.graph.node[0].op_type = "Add"
    forge(d / "computed.onnx", {}, pred_meta("computed"), model=added)
    # Values changed after the hash was stamped.
    forge(d / "tampered.onnx", {"predictions": ok}, pred_meta("tampered"))
    model = exporters.read_artifact(d / "tampered.onnx").model
    init = model.graph.initializer[0]
    init.raw_data = probs(seed=9).tobytes()
    (d / "tampered.onnx").write_bytes(model.SerializeToString())
    # 40 x 10 float32 is 1.6 kB: a 20,000-sample upload is over a 64 kB cap.
    exporters.write_constant_artifact(
        d / "huge.onnx", {"predictions": probs(20_000)}, pred_meta("huge", n=20_000)
    )
    return exporters.ingest_dir(d, max_bytes=64_000)


def test_valid_data_artifacts_accepted(ingested):
    assert sorted(a.client_id for a in ingested.accepted) == ["good", "good16", "p"]


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("short.onnx", "has shape [35, 10]"),
        ("wide.onnx", "metadata implies [40, 11]"),
        ("nan.onnx", "NaN or infinite"),
        ("unnormalised.onnx", "must sum to 1"),
        ("negative.onnx", "probabilities in [0, 1]"),
        ("renamed.onnx", "outputs must be ['predictions']"),
        ("protoshape.onnx", "[len(classes), representation_size]"),
        ("protorep.onnx", "metadata implies [3, 7]"),
        ("protodup.onnx", "more than once"),
        ("protocount.onnx", "'counts' has 2 entries"),
        ("int.onnx", "must be float/float16"),
        ("spec.onnx", "'spec' must be null"),
        ("computed.onnx", "Add"),
        ("tampered.onnx", "weights hash mismatch"),
        ("huge.onnx", "over the 64000-byte limit"),
    ],
)
def test_hostile_data_artifacts_rejected(ingested, name, reason):
    reasons = dict(ingested.rejected)
    assert name in reasons, f"{name} was accepted"
    assert reason in reasons[name]


def test_predictions_for_another_task_lose_the_majority_vote(tmp_path):
    for i in range(2):
        exporters.write_constant_artifact(
            tmp_path / f"c{i}.onnx", {"predictions": probs()}, pred_meta(f"c{i}")
        )
    odd = pred_meta("odd") | {"input_shape": [1, 28, 28]}
    exporters.write_constant_artifact(tmp_path / "odd.onnx", {"predictions": probs()}, odd)
    result = exporters.ingest_dir(tmp_path)
    assert [n for n, _ in result.rejected] == ["odd.onnx"]
    assert "disagrees with the majority" in result.rejected[0][1]


# --- the public set and its fingerprint -----------------------------------------------------------


def test_public_split_is_carved_and_fingerprinted(tmp_path):
    x = load_public("digits:public", public_size=50, seed=0)
    again = load_public("digits:public", public_size=50, seed=0)
    other = load_public("digits:public", public_size=50, seed=1)
    assert x.shape == (50, 1, 8, 8)
    assert public_fingerprint(x) == public_fingerprint(again) != public_fingerprint(other)
    np.savez(tmp_path / "pub.npz", x=(x * 255).round().astype(np.uint8))  # unlabeled
    assert load_public(str(tmp_path / "pub.npz")).shape == (50, 1, 8, 8)


def test_fedol_refuses_predictions_for_another_public_set(tmp_path):
    uploads = tmp_path / "up"
    uploads.mkdir()
    wrong = public_fingerprint(load_public("digits:public", public_size=N, seed=1))
    for i in range(2):
        exporters.write_constant_artifact(
            uploads / f"c{i}.onnx",
            {"predictions": probs(seed=i)},
            pred_meta(f"c{i}", fingerprint=wrong),
        )
    job = FuseJob(
        uploads=str(uploads),
        method="fedol",
        out=str(tmp_path / "g.onnx"),
        options={"public": "digits:public", "public_size": N, "rounds": 1, "epochs": 1},
    )
    with pytest.raises(FusionError, match=r"c0.onnx: predictions are for another public set"):
        run_fuse(job)
    assert not (tmp_path / "g.onnx").exists()
