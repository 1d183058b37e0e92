"""FedDF, FedOL and FedGH end to end on `digits` (a 300-sample public split carved out of the
train data before partitioning), through the real client path, `run_fuse` and the CLI."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import exporters
from edgefl.artifacts import rebuild
from edgefl.client.run import ClientJob, run_client
from edgefl.data.public import load_public, public_fingerprint
from edgefl.errors import ConfigError
from edgefl.server.fuse import FuseJob, run_fuse

PUBLIC = {"public": "digits:public", "public_size": 300}
BASE = dict(
    dataset="digits",
    partition="dirichlet:1.0",
    num_clients=3,
    batch_size=32,
    profile="smartphone",
    lr=0.05,
    public_size=300,
)
# Small representation so three heterogeneous FedGH-CNNs train in a second on 8x8 digits.
FEDGH = "fedgh-cnn{}:fc1=64,representation=32"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def fed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("public")
    for i in range(3):
        run_client(
            ClientJob(
                out_dir=str(root / "pred"),
                client_index=i,
                model="cnn",
                epochs=8,
                kind="predictions",
                public="digits:public",
                fp16=i == 0,
                **BASE,
            )
        )
    for i in range(2):
        run_client(
            ClientJob(out_dir=str(root / "cls"), client_index=i, model="cnn", epochs=8, **BASE)
        )
    for i in (1, 2):  # client 0 comes from the CLI test below (it keeps its model for the header)
        run_client(
            ClientJob(
                out_dir=str(root / "proto"),
                client_index=i,
                model=FEDGH.format(2 * i + 1),
                epochs=8,
                kind="prototypes",
                **BASE,
            )
        )
    return root


def fuse(uploads: Path, method: str, out: Path, **options):
    job = FuseJob(
        uploads=str(uploads), method=method, out=str(out), options=options, eval="digits:test"
    )
    return run_fuse(job)


def test_predictions_upload_carries_no_weights(fed):
    art = exporters.validate_upload(fed / "pred" / "client-001.onnx")
    meta = art.metadata
    assert meta["kind"] == "predictions" and meta["spec"] is None and meta["model"] == "cnn"
    assert [t.name for t in art.model.graph.initializer] == ["predictions.data"]
    x = load_public("digits:public", public_size=300, seed=0)
    assert meta["public_fingerprint"] == public_fingerprint(x) and meta["public_size"] == 300
    p = exporters.read_constant_outputs(art.model)["predictions"]
    assert p.shape == (300, 10) and np.allclose(p.sum(1), 1, atol=1e-5)
    half = exporters.read_artifact(fed / "pred" / "client-000.onnx")
    assert half.metadata["dtype"] == "float16" and half.size_bytes < 0.6 * art.size_bytes


def test_fedol(fed, tmp_path):
    uploads = Path(shutil.copytree(fed / "pred", tmp_path / "up"))
    # One client answered on another public set: rejected by fedol, named in the report.
    stray = exporters.read_artifact(uploads / "client-002.onnx")
    meta = {
        k: v for k, v in stray.metadata.items() if k not in ("schema_version", "weights_sha256")
    }
    probs = exporters.read_constant_outputs(stray.model)["predictions"]
    exporters.write_constant_artifact(
        uploads / "stray.onnx",
        {"predictions": probs},
        meta | {"client_id": "stray", "public_fingerprint": "0" * 64},
    )
    rep = fuse(uploads, "fedol", tmp_path / "g.onnx", rounds=3, epochs=4, **PUBLIC)
    assert rep["sources"] == ["client-000", "client-001", "client-002"]
    assert [r["file"] for r in rep["rejected_predictions"]] == ["stray.onnx"]
    assert "another public set" in rep["rejected_predictions"][0]["reason"]
    rounds = rep["rounds"]
    # The server model joins the voters from round 2; rho grows by 0.05 per round.
    assert [r["sources"] for r in rounds] == [3, 4, 4]
    assert [r["rho"] for r in rounds] == [0.1, 0.15, 0.2]
    assert rounds[0]["reliable_per_source"] == [30, 30, 30]  # ceil(0.1 * 300) each
    assert rounds[0]["labelled"] < rounds[-1]["labelled"]
    assert rep["student"] == "scnn(width=32)" and rep["accuracy"] > 0.6


def test_feddf(fed, tmp_path):
    rep = fuse(fed / "cls", "feddf", tmp_path / "g.onnx", epochs=30, **PUBLIC)
    assert rep["teachers"] == ["client-000", "client-001"] and rep["public_samples"] == 300
    assert rep["loss_history"][-1] < rep["loss_history"][0]
    assert rep["accuracy"] > 0.6


def test_feddf_needs_a_public_set(fed, tmp_path):
    with pytest.raises(ConfigError, match="public=NAME:public"):
        fuse(fed / "cls", "feddf", tmp_path / "g.onnx")


def test_fedgh_and_apply_header_through_the_cli(fed, tmp_path, cli):
    # Client 0 through the CLI: prototypes uploaded, its own model kept on the device.
    up, local = fed / "proto", tmp_path / "local"
    r = cli(
        "client",
        "prototypes",
        "--profile",
        "smartphone",
        "--dataset",
        "digits",
        "--model",
        FEDGH.format(1),
        "--out",
        str(up),
        "--keep-model",
        str(local),
        "--partition",
        "dirichlet:1.0",
        "--num-clients",
        "3",
        "--public-size",
        "300",
        "--epochs",
        "8",
        "--batch-size",
        "32",
        "--lr",
        "0.05",
    )
    assert r.exit_code == 0, r.output
    assert "no weights leave the device" in r.output
    assert sorted(p.name for p in up.iterdir()) == [f"client-00{i}.onnx" for i in range(3)]

    # HtFLlib's SGD lr 0.01 x 100 epochs moves slowly on 29 class means; a larger step shows the
    # header fits them (three extractors, so not every class mean is linearly separable).
    rep = fuse(up, "fedgh", tmp_path / "header.onnx", lr=0.1, epochs=200)
    assert rep["prototypes"] == sum(len(c["classes"]) for c in rep["clients"])
    assert rep["representation_size"] == 32 and "skipped" in rep["eval"]
    # The header is trained (the official code never steps it): it moved from its seeded init
    # and fits the uploaded class means.
    header = exporters.read_artifact(tmp_path / "header.onnx")
    assert header.input_names == ["representation"] and header.metadata["input_shape"] == [32]
    torch.manual_seed(0)
    init = torch.nn.Linear(32, 10).weight.detach().numpy()
    assert not np.allclose(header.state_dict()["weight"], init)
    assert rep["loss_history"][-1] < 0.8 * rep["loss_history"][0]
    assert rep["prototype_accuracy"] >= 0.8

    out = tmp_path / "personalized.onnx"
    r = cli(
        "client",
        "apply-header",
        str(local / "client-000.onnx"),
        str(tmp_path / "header.onnx"),
        "--out",
        str(out),
    )
    assert r.exit_code == 0, r.output
    personalized = exporters.validate_upload(out)
    assert personalized.metadata["personalized_from"]["method"] == "fedgh"
    # Splice parity: personalized(x) == header(features(x)).
    x = load_public("digits:public", public_size=300, seed=0)[:64]
    own, _ = rebuild(exporters.read_artifact(local / "client-000.onnx"))
    with torch.no_grad():
        rep_x = own.features(torch.from_numpy(x)).numpy()
    assert np.allclose(personalized.run(x), header.run(rep_x), atol=1e-4)
    assert not np.allclose(personalized.run(x), own(torch.from_numpy(x)).detach().numpy())

    # Bad inputs: one clean message, exit 2.
    r = cli(
        "client",
        "apply-header",
        str(local / "client-000.onnx"),
        str(up / "client-001.onnx"),
        "--out",
        str(tmp_path / "p2.onnx"),
    )
    assert r.exit_code == 2 and "not a global header" in r.output
    assert "Traceback" not in r.output and "fix: pass the global header" in r.output
    # the two swapped: the header is not this device's classifier; each refusal has a fix line
    r = cli("client", "apply-header", str(tmp_path / "header.onnx"), str(tmp_path / "header.onnx"))
    assert r.exit_code == 2 and "not a classifier" in r.output
    assert "fix: pass the model this device kept" in r.output
    r = cli(
        "client",
        "prototypes",
        "--profile",
        "smartphone",
        "--dataset",
        "digits",
        "--model",
        FEDGH.format(1),
        "--out",
        str(up),
        "--keep-model",
        str(up),
    )
    assert r.exit_code == 2 and "must not be the upload directory" in r.output
    assert "Traceback" not in r.output


def test_predict_cli(tmp_path, cli):
    r = cli(
        "client",
        "predict",
        "--profile",
        "smartphone",
        "--dataset",
        "digits",
        "--public",
        "digits:public",
        "--public-size",
        "300",
        "--model",
        "cnn",
        "--num-clients",
        "3",
        "--epochs",
        "1",
        "--fp16",
        "--out",
        str(tmp_path),
        "--json",
    )
    assert r.exit_code == 0, r.output
    art = exporters.validate_upload(tmp_path / "client-000.onnx")
    assert art.kind == "predictions" and art.metadata["dtype"] == "float16"
    r = cli(
        "client",
        "predict",
        "--profile",
        "smartphone",
        "--dataset",
        "digits",
        "--public",
        "mnist:public",
        "--public-size",
        "300",
        "--out",
        str(tmp_path),
    )
    assert r.exit_code == 2 and "carved from another dataset" in r.output
    assert "Traceback" not in r.output
    # an .npz public set is used whole: a --public-size would carve training samples for nothing
    np.savez(tmp_path / "pub.npz", x=np.zeros((20, 8, 8), np.float32))
    args = ("client", "predict", "--profile", "smartphone", "--dataset", "digits")
    r = cli(*args, "--public", str(tmp_path / "pub.npz"), "--public-size", "300")
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "is used whole" in said and "fix:" in said, said
