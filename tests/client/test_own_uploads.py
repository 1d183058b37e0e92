"""edgefl's server refuses nothing edgefl's clients make (issue 33): every zoo model that
`client train` can produce, on images and on sensor windows, classifiers and decoders, the NAS
family and int8 uploads, is trained one short epoch through the real client path, accepted by
the server's ingest, and used by a method that consumes it. A graph-size bound that refused
VGG-9's adaptive pooling and CVAE-large's resize went unnoticed because no test did this."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgefl.client.run import ClientJob, run_client
from edgefl.models.zoo import ZOO, spec_label
from edgefl.server.ingest import ingest

pytestmark = pytest.mark.slow

# Real data in the shapes the products use: MNIST digits and HAPT accelerometer windows.
DATASETS = {"image": "mnist", "signal": "hapt"}
# Dynamic int8 uploads (`client train --quantize int8`): one classifier and one decoder of each.
INT8 = {"image": ("cnn", "cvae-mlp"), "signal": ("cnn1d", "cvae-mlp")}


def _cases() -> list[tuple[str, str, bool]]:
    cases = [(e.name, kind, False) for e in ZOO for kind in e.inputs]
    cases += [(name, kind, True) for kind, names in INT8.items() for name in names]
    return cases


def _train(out: Path, name: str, kind: str, int8: bool):
    role = ZOO.get(name).role
    client_id = f"{name}-{kind}" + ("-int8" if int8 else "")
    job = ClientJob(
        profile="smartphone",
        dataset=DATASETS[kind],
        out_dir=str(out),
        subset=48,
        epochs=1,
        batch_size=16,
        model=name,
        role=role,
        force=True,
        client_id=client_id,
        partition="iid",
        num_clients=1,
        quantize="int8" if int8 else None,
    )
    return run_client(job)


@pytest.fixture(scope="module")
def own_uploads(tmp_path_factory) -> dict[str, dict[str, str]]:
    """input kind -> {client id: role}, the uploads under <root>/<kind>."""
    root = tmp_path_factory.mktemp("own")
    made: dict[str, dict[str, str]] = {"image": {}, "signal": {}}
    files = []  # fp32 uploads: (path, spec), for the planner's size
    for name, kind, int8 in _cases():
        result = _train(root / kind, name, kind, int8)
        made[kind][result.client_id] = result.role
        if not int8:
            files.append((result.path, result.spec))
    return {"root": str(root), "files": files, **made}


def test_every_zoo_model_is_covered():
    # A zoo entry added later is trained here without editing this file; this pins that the
    # cases really span both roles and both input kinds.
    cases = _cases()
    assert {ZOO.get(n).role for n, _, _ in cases} == {"classifier", "generator"}
    assert {k for _, k, _ in cases} == {"image", "signal"}
    assert {"vgg9", "cvae-large", "nas-cnn", "cnn1d", "cvae1d"} <= {n for n, _, _ in cases}


@pytest.mark.parametrize("kind", ["image", "signal"])
def test_the_server_accepts_every_upload_a_client_makes(own_uploads, kind):
    found = ingest(Path(own_uploads["root"]) / kind, max_upload_bytes=512 << 20)
    assert found.rejected == []
    assert sorted(u.client_id for u in found.uploads) == sorted(own_uploads[kind])


@pytest.mark.parametrize("kind", ["image", "signal"])
def test_each_upload_is_used_by_a_method_that_consumes_it(own_uploads, kind, cli, tmp_path):
    # ensemble rebuilds its members (an int8 upload is set aside by name); FedDF runs its
    # teachers forward in onnxruntime (int8 included); FedCVAE-ENS reads every decoder.
    out = tmp_path / "global"
    r = cli(
        "server",
        "fuse",
        str(Path(own_uploads["root"]) / kind),
        "--method",
        "ensemble,feddf,fedcvae-ens",
        "--out-dir",
        str(out),
        "--device",
        "cpu",
        "--opt",
        "fedcvae-ens:epochs=1",
        "--opt",
        "fedcvae-ens:synthetic=200",
        "--opt",
        "feddf:epochs=1",
        "--opt",
        f"feddf:public={DATASETS[kind]}:public",
        "--opt",
        "feddf:public_size=200",
        "--json",
        "-q",
    )
    assert r.exit_code == 0, r.output
    reports = json.loads(r.stdout)
    for method in reports.values():
        assert "error" not in method, method["error"]
    made = own_uploads[kind]
    classifiers = {c for c, role in made.items() if role == "classifier"}
    int8 = {c for c in classifiers if c.endswith("-int8")}
    assert set(reports["feddf"]["used"]) == classifiers
    assert set(reports["ensemble"]["used"]) == classifiers - int8
    skipped = {s["file"]: s["reason"] for s in reports["ensemble"]["skipped"]}
    assert {f"{c}.onnx" for c in int8} <= set(skipped)
    assert set(reports["fedcvae-ens"]["used"]) == {c for c, r in made.items() if r == "generator"}


def test_planned_upload_is_the_file(own_uploads):
    """The planner's upload size is the file `client train` writes (issue 34 item 6), within
    2% for every zoo model, and the upload carries none of the exporter's debugging records
    (stack traces with the machine's paths)."""
    import onnx

    from edgefl.models.cost import costs

    assert len(own_uploads["files"]) == sum(len(e.inputs) for e in ZOO)
    for path, spec in own_uploads["files"]:
        actual, planned = path.stat().st_size, costs(spec).upload_bytes
        assert abs(planned / actual - 1) <= 0.02, (spec_label(spec), planned, actual)
        model = onnx.load(path)
        assert [p.key for n in model.graph.node for p in n.metadata_props] == [], spec_label(spec)
