"""`edgefl deploy` and the plain-graph pass, on real files in real runtimes (issue 31).

Every zoo classifier that fits a smartphone deploys to onnx and ort-mobile, runs in onnxruntime
with the source's outputs, and is accepted by two consumers besides onnxruntime: onnxruntime's
mobile checker (100 % of nodes for NNAPI and CoreML) and onnxsim. A wristband model deploys to
TFLite Micro within the profile's budget. Bad input exits 2 with nothing written.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from fed_fixtures import proto_meta

import exporters
from edgefl.client.run import ClientJob, export_model, model_metadata, run_client
from edgefl.data import load_dataset
from edgefl.deploy import DeployRequest, deploy
from edgefl.deploy.targets import TARGETS
from edgefl.models.cost import costs
from edgefl.models.zoo import ZOO, build_model, input_kind, make_spec
from edgefl.profiles import get_profile
from exporters.plain import fold_batchnorm, plain_graph

DIGITS = (1, 8, 8)
TFLITE_MISSING = TARGETS["tflite-micro"].missing()


def _zoo_classifiers() -> list[str]:
    phone = get_profile("smartphone")
    names = []
    for entry in ZOO:
        if entry.role == "classifier" and input_kind(DIGITS) in entry.inputs:
            spec = make_spec(entry.name, DIGITS, 10)
            if costs(spec).infer_peak_bytes <= phone.ram_budget_bytes:
                names.append(entry.name)
    return names


def _export(spec, path: Path, model=None, dataset: str = "digits") -> Path:
    torch.manual_seed(0)
    meta = model_metadata(
        spec,
        class_names=[str(i) for i in range(10)],
        label_counts=[3] * 10,
        client_id="test",
        profile="smartphone",
        dataset=dataset,
    )
    export_model(model if model is not None else build_model(spec), spec, meta, path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A trained phone cnn (1 epoch), a wristband decoder, and every zoo classifier untrained."""
    root = tmp_path_factory.mktemp("deploy-src")
    job = dict(dataset="digits", out_dir=str(root), num_clients=2, epochs=1, batch_size=64)
    cnn = run_client(
        ClientJob(profile="smartphone", model="cnn", client_index=0, client_id="phone", **job)
    ).path
    dec = run_client(
        ClientJob(profile="wristband", role="generator", client_index=1, client_id="band", **job)
    ).path
    zoo = {n: _export(make_spec(n, DIGITS, 10), root / f"zoo-{n}.onnx") for n in _zoo_classifiers()}
    return {"cnn": cnn, "decoder": dec, "zoo": zoo, "root": root}


def _source_outputs(path: Path, x: np.ndarray) -> np.ndarray:
    return exporters.read_artifact(path).run(x)


# ---- the plain graph -------------------------------------------------------------------------


def test_plain_graph_keeps_weights_and_outputs(files):
    """Constants lifted, shape arithmetic folded (no Shape/Constant left), every weight kept by
    name and bytes, outputs equal to the source; the decoder (another artifact kind) too."""
    for path in [files["cnn"], files["decoder"], *files["zoo"].values()]:
        source = onnx.load(path)
        plain, report = plain_graph(source, batch=1)
        ops = {n.op_type for n in plain.graph.node}
        assert "Constant" not in ops and "Shape" not in ops, (path.name, ops)
        weights = {t.name: t.raw_data for t in source.graph.initializer}
        kept = {t.name: t.raw_data for t in plain.graph.initializer}
        assert all(kept.get(n) == raw for n, raw in weights.items()), path.name
        assert report.nodes_after < report.nodes_before
        dims = [d.dim_value for d in plain.graph.input[0].type.tensor_type.shape.dim]
        assert dims[0] == 1
        s0 = ort.InferenceSession(source.SerializeToString())
        s1 = ort.InferenceSession(plain.SerializeToString())
        rng = np.random.default_rng(0)
        feed = {i.name: rng.random([1, *i.shape[1:]], dtype=np.float32) for i in s0.get_inputs()}
        np.testing.assert_allclose(s1.run(None, feed)[0], s0.run(None, feed)[0], atol=1e-6)


@pytest.mark.skipif(
    importlib.util.find_spec("onnxsim") is None,
    reason='onnxsim not installed (pip install "edgefl[deploy]")',
)
def test_onnxsim_accepts_every_plain_graph(files):
    """A second consumer besides onnxruntime (onnxsim 0.4 failed on the raw exports)."""
    import onnxsim

    for path in [files["cnn"], files["decoder"], *files["zoo"].values()]:
        simplified, ok = onnxsim.simplify(plain_graph(onnx.load(path), batch=1)[0])
        assert ok, path.name
        assert {n.op_type for n in simplified.graph.node} - {"Constant"}


# ---- onnx and ort-mobile for every zoo classifier that fits a phone --------------------------


@pytest.mark.parametrize("target", ["onnx", "ort-mobile"])
def test_every_phone_classifier_deploys(files, tmp_path, target):
    assert len(files["zoo"]) >= 8  # vgg9, cnn, lenet5, fedgh-cnn1..5, scnn, mlp, nas-cnn
    for name, path in files["zoo"].items():
        if target == "onnx" and name == "vgg9":
            continue  # its 264 MiB plain graph is the one ort-mobile converts: checked there
        out = tmp_path / name
        rep = deploy(
            DeployRequest(
                model=str(path),
                profile="smartphone",
                target=target,
                out=str(out),
                eval="digits:test",
                eval_samples=64,
            )
        )
        deployed, *rest = [Path(f["path"]) for f in rep.files]
        assert deployed.parent == out and deployed.stat().st_size == rep.files[0]["bytes"]
        assert deployed.suffix == (".onnx" if target == "onnx" else ".ort")
        if target == "ort-mobile":  # the record of what it was deployed from, beside it
            (sidecar,) = rest
            record = json.loads(sidecar.read_text())
            assert record["deployed"] and record["files"] == {"ort": deployed.name}
            assert (
                record["source"]["weights_sha256"]
                == exporters.read_artifact(path).metadata["weights_sha256"]
            )
        else:
            assert not rest
        # Runs in onnxruntime (from the file) with the source's outputs, one sample at a time.
        x = np.random.default_rng(1).random((4, *DIGITS), dtype=np.float32)
        session = ort.InferenceSession(str(deployed), providers=["CPUExecutionProvider"])
        got = np.concatenate([session.run(None, {"input": x[i : i + 1]})[0] for i in range(4)])
        np.testing.assert_allclose(got, _source_outputs(path, x), atol=1e-5, err_msg=name)
        assert rep.accuracy["argmax_agreement"] == 1.0
        assert rep.runtime_figures["memory_bytes"] > 0
        assert rep.runtime_figures["latency_ms_per_sample"] > 0
        # Every node on the phone's accelerators: vgg9's uneven adaptive pooling is exported as
        # slices (was a GatherND NNAPI lacks), nas-cnn's BatchNorm folded into its convs (CoreML).
        if target == "ort-mobile":
            for ep in ("NNAPI", "CoreML"):
                v = rep.runtime_figures["mobile_usability"][ep]
                assert v["supported_nodes"] == v["nodes"] and v["verdict"] == "YES", (name, ep, v)


def test_batchnorm_folds_into_its_conv_with_the_same_outputs(tmp_path):
    """The deployment form folds BatchNorm (trained statistics, not the identity) into the conv;
    the plain pass alone keeps every weight."""
    torch.manual_seed(0)
    spec = make_spec("nas-cnn", (1, 28, 28), 10)
    model = build_model(spec).eval()
    for bn in [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]:
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.data.uniform_(0.5, 1.5)
        bn.bias.data.uniform_(-0.5, 0.5)
    _export(spec, tmp_path / "m.onnx", model, dataset="mnist")
    plain, _ = plain_graph(onnx.load(tmp_path / "m.onnx"), batch=1)
    folded = onnx.ModelProto()
    folded.CopyFrom(plain)
    assert fold_batchnorm(folded) == 2
    onnx.checker.check_model(folded, full_check=True)
    assert "BatchNormalization" not in {n.op_type for n in folded.graph.node}
    x = np.random.default_rng(0).random((1, 1, 28, 28), dtype=np.float32)
    want = model(torch.from_numpy(x)).detach().numpy()
    got = ort.InferenceSession(folded.SerializeToString()).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_a_deployed_file_among_the_uploads_is_rejected_as_what_it_is(files, tmp_path):
    """It was rejected for five missing keys: it is deploy's output, not an upload."""
    from edgefl.server.ingest import ingest

    up = tmp_path / "up"
    up.mkdir()
    (up / "phone.onnx").write_bytes(files["cnn"].read_bytes())
    deploy(DeployRequest(model=str(files["cnn"]), profile="smartphone", target="onnx", out=str(up)))
    found = ingest(up, max_upload_bytes=exporters.DEFAULT_MAX_UPLOAD_BYTES)
    assert [u.name for u in found.uploads] == ["phone.onnx"]
    ((name, why),) = found.rejected
    assert name == "phone.smartphone.onnx" and "a model `edgefl deploy` wrote" in why, why
    assert "missing required key" not in why


def test_a_file_made_for_the_profile_keeps_its_name(files, tmp_path):
    # `server fuse --for smartphone` writes fedmho.smartphone.onnx: deploying it for the same
    # profile gives fedmho.smartphone.onnx, not fedmho.smartphone.smartphone.onnx; another
    # file gets the profile's name once.
    src = tmp_path / "fedmho.smartphone.onnx"
    src.write_bytes(files["cnn"].read_bytes())
    for model, want in ((src, "fedmho.smartphone.onnx"), (files["cnn"], "phone.smartphone.onnx")):
        out = tmp_path / f"out-{model.stem}"
        rep = deploy(
            DeployRequest(model=str(model), profile="smartphone", target="onnx", out=str(out))
        )
        assert [Path(f["path"]).name for f in rep.files] == [want]
        assert sorted(os.listdir(out)) == [want]


def test_deployed_file_describes_itself(files, tmp_path):
    """Metadata: preprocessing, outputs, shipped costs (int8 as int8), profile; doc_string and
    model_version set; never the client's label_counts."""
    rep = deploy(
        DeployRequest(
            model=str(files["cnn"]),
            profile="smartphone",
            target="onnx",
            out=str(tmp_path),
            quantize="int8",
            calibrate="digits:train",
            eval="digits:test",
            eval_samples=200,
        )
    )
    model = onnx.load(rep.files[0]["path"])
    meta = exporters.get_metadata(model)
    assert "label_counts" not in json.dumps(meta)
    assert meta["preprocessing"]["scale"] == pytest.approx(1 / 16)
    assert meta["preprocessing"]["layout"] == "NCHW"
    assert "logits" in meta["outputs"]
    assert meta["profile"]["name"] == "smartphone"
    assert meta["costs"]["weight_bytes_by_dtype"].get("int8", 0) > 0
    assert meta["costs"]["weight_bytes_by_dtype"].get("float32", 0) < meta["costs"]["weight_bytes"]
    assert model.doc_string and model.model_version > 0
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in model.graph.node}
    # Static int8 keeps the argmax on most samples of a trained model.
    assert rep.accuracy["argmax_agreement"] >= 0.9
    assert rep.accuracy["samples"] == 200


def test_a_bare_eval_dataset_scores_the_test_split_and_says_so(files, tmp_path):
    """`--eval digits` scored 1,000 training images under the name "digits" (`eval` reads the
    test split): now the test split, named with its split in the report."""
    rep = deploy(
        DeployRequest(
            model=str(files["cnn"]), profile="smartphone", target="onnx", out=str(tmp_path),
            eval="digits", eval_samples=1000,
        )
    )  # fmt: skip
    assert rep.eval_ref == "digits:test"
    assert rep.accuracy["samples"] == len(load_dataset("digits", "test").y) == 360


# ---- tflite-micro ----------------------------------------------------------------------------


@pytest.mark.skipif(
    bool(TFLITE_MISSING),
    reason=f"tflite-micro target needs {TFLITE_MISSING} "
    '(pip install "edgefl[deploy]"; `make test` installs it)',
)
def test_tflite_micro_on_the_wristband(files, cli, tmp_path):
    out = tmp_path / "band"
    r = cli(
        "deploy",
        str(files["cnn"]),
        "--profile",
        "wristband",
        "--target",
        "tflite-micro",
        "--out",
        str(out),
        "--calibrate",
        "digits:train",
        "--eval",
        "digits:test",
        "--eval-samples",
        "100",
        "--json",
        "-q",
    )
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    names = sorted(Path(f["path"]).name for f in rep["files"])
    assert names == sorted(os.listdir(out)) and len(names) == 4
    band = get_profile("wristband")
    fig = rep["runtime_figures"]
    assert 0 < fig["memory_bytes"] <= band.ram_budget_bytes
    assert 0 < fig["flash_bytes"] <= band.storage_bytes
    tflite = out / "phone.wristband.tflite"
    assert fig["flash_bytes"] == tflite.stat().st_size
    # The arena is the minimum: TFLite Micro runs in it, and refuses 64 bytes less.
    from edgefl.deploy.measure import tflm_fits

    assert tflm_fits(tflite, fig["memory_bytes"])
    assert not tflm_fits(tflite, fig["memory_bytes"] - 64)
    # The C array holds exactly the flatbuffer's bytes.
    source = (out / "phone_wristband.cc").read_text()
    body = source[source.index("{") + 1 : source.index("};")]
    assert bytes(int(v, 16) for v in body.replace("\n", "").split(",")) == tflite.read_bytes()
    side = json.loads((out / "phone.wristband.json").read_text())
    assert side["preprocessing"]["layout"].startswith("NHWC")
    assert side["quantization"]["input"]["dtype"] == "int8"
    assert side["costs"]["arena_bytes"] == fig["memory_bytes"]
    # The cost model's runtime-aware estimate is within 25% of the arena TFLite Micro measured,
    # and the allocator's split adds up to it (less up to one 16-byte alignment of the arena).
    estimate = side["costs"]["estimated_tflm_arena_bytes"]
    assert abs(estimate / fig["memory_bytes"] - 1) <= 0.25, (estimate, fig["memory_bytes"])
    split = fig["arena_split"]
    assert 0 <= fig["memory_bytes"] - (split["activations"] + split["persistent"]) <= 16
    assert "label_counts" not in json.dumps(side)
    assert rep["accuracy"]["argmax_agreement"] >= 0.8


# ---- bad input: one message with the fix, exit 2, nothing written ---------------------------


def _header(path: Path) -> Path:
    meta = {
        "kind": "global",
        "spec": None,
        "input_shape": [16],
        "num_classes": 10,
        "class_names": [str(i) for i in range(10)],
        "client_id": "server",
        "method": "fedgh",
        "config": {},
        "client_ids": [],
        "edgefl_version": "0",
    }
    exporters.export_onnx(
        torch.nn.Linear(16, 10),
        (torch.zeros(2, 16),),
        path,
        input_names=["representation"],
        output_names=["logits"],
        metadata=meta,
    )
    return path


def _predictions(src: Path, path: Path) -> Path:
    model = onnx.load(src)
    exporters.set_metadata(model, exporters.get_metadata(model) | {"kind": "predictions"})
    onnx.save(model, path)
    return path


def test_eval_and_infer_name_what_is_not_a_classifier_as_deploy_does(files, cli, tmp_path):
    """`eval` on a decoder had no fix line; on data it said "expected 0 inputs, got 1"; on a
    FedGH header `eval` and `infer` spoke of the dataset and of images of shape (16,)."""
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((2, 1, 8, 8), np.float32))
    protos = tmp_path / "q.onnx"  # a prototypes upload as a client writes it
    means = np.zeros((3, 6), np.float32)
    exporters.write_constant_artifact(protos, {"prototypes": means}, proto_meta("c1"))
    cases = {
        str(files["decoder"]): ("is a CVAE decoder upload", "evaluate a classifier"),
        str(protos): ("is a prototypes artifact (data, not a model)", "instead"),
        str(_header(tmp_path / "h.onnx")): ("a FedGH header", "apply-header"),
    }
    for path, (says, fix) in cases.items():
        r = cli("eval", path, "--dataset", "digits")
        said = " ".join(r.output.split())
        assert r.exit_code == 2 and says in said and fix in said, said
        if "decoder" in says:
            continue  # `infer` runs a decoder on labels
        r = cli("infer", path, "--input", str(x))
        said = " ".join(r.output.split())
        assert r.exit_code == 2 and says in said and fix in said, said


def test_bad_inputs_exit_2_with_nothing_written(files, cli, tmp_path):
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, x=np.zeros((20, 1, 12, 12), np.float32), y=np.arange(20) % 10)
    cnn = str(files["cnn"])
    vgg = str(files["zoo"]["vgg9"])
    cases = {
        "decoder": ([str(files["decoder"]), "--target", "onnx"], "decoder"),
        "predictions": (
            [str(_predictions(files["cnn"], tmp_path / "p.onnx")), "--target", "onnx"],
            "predictions",
        ),
        "header": ([str(_header(tmp_path / "h.onnx")), "--target", "onnx"], "header"),
        "target": ([cnn, "--target", "tflite"], "unknown target"),
        "calibration": (
            [cnn, "--target", "onnx", "--quantize", "int8", "--calibrate", str(wrong)],
            "classes",
        ),
        "no calibration": ([cnn, "--target", "onnx", "--quantize", "int8"], "calibration"),
        # nothing is evaluated: the count was passed over without a word
        "eval samples alone": (
            [cnn, "--target", "onnx", "--eval-samples", "5"],
            "--eval-samples applies with --eval DATASET[:SPLIT] only",
        ),
        # fp32 is not calibrated: the flag would be dropped without a word
        "fp32 calibrated": (
            [cnn, "--target", "ort-mobile", "--calibrate", "digits:train"],
            "ships fp32, which is not calibrated",
        ),
        "fit": ([vgg, "--target", "onnx", "--profile", "wristband"], "wristband"),
        "ort on a band": ([cnn, "--target", "ort-mobile", "--profile", "wristband"], "MiB"),
    }
    for case, (args, said) in cases.items():
        out = tmp_path / f"out-{case.replace(' ', '-')}"
        if "--profile" not in args:
            args = [*args, "--profile", "smartphone"]
        before = sorted(os.listdir(tmp_path))
        r = cli("deploy", *args, "--out", str(out), "--json")
        assert r.exit_code == 2, (case, r.output)
        err = json.loads(r.stdout)
        assert said in err["error"] and err["fix"], (case, err)
        assert not out.exists(), case
        assert sorted(os.listdir(tmp_path)) == before, case  # no staging folder left either


def test_the_fix_names_the_models_own_data(files, cli, tmp_path):
    """The calibration example is the model's dataset (a HAPT model was told mnist:train); one
    without a dataset gets the registered ones of its shape; another registered dataset of the
    same shape (Fashion's model on digits) is refused before anything is loaded or written."""
    cnn = make_spec("cnn", (1, 28, 28), 10)
    named = {
        "digits": (str(files["cnn"]), None, "--calibrate digits:train"),
        "none": (str(_export(cnn, tmp_path / "old.onnx", dataset=None)), None, "mnist:train or"),
        "other": (
            str(_export(cnn, tmp_path / "fashion.onnx", dataset="fmnist")),
            "mnist:train",
            "trained on fmnist, not mnist",
        ),
    }
    for case, (model, calibrate, said) in named.items():
        more = ["--calibrate", calibrate] if calibrate else []
        out = tmp_path / f"out-{case}"
        r = cli(
            "deploy",
            model,
            "--target",
            "tflite-micro",
            "--profile",
            "smartphone",
            *more,
            "--out",
            str(out),
            "--json",
        )
        assert r.exit_code == 2, (case, r.output)
        err = json.loads(r.stdout)
        assert said in err["error"] + err["fix"], (case, err)
        assert not out.exists(), case
    assert "--calibrate fmnist:train" in err["fix"]


def test_eval_names_the_models_own_data_too(cli, tmp_path):
    """`edgefl eval` scores what it is asked to, but says when the model names another
    registered dataset of the same shape, and a wrong shape's fix names the model's."""
    fashion = str(_export(make_spec("cnn", (1, 28, 28), 10), tmp_path / "f.onnx", dataset="fmnist"))
    r = cli("eval", fashion, "--dataset", "mnist", "--json")
    assert r.exit_code == 0, r.output
    assert "trained on fmnist, scored here on mnist" in " ".join(r.stderr.split())
    assert json.loads(r.stdout)["dataset"] == "mnist"
    same = cli("eval", fashion, "--dataset", "fmnist", "--json")
    assert same.exit_code == 0 and "warning" not in same.stderr, same.output
    r = cli("eval", fashion, "--dataset", "digits", "--json")
    assert r.exit_code == 2 and "(fmnist, as the model's metadata says)" in r.stdout, r.output


@pytest.mark.parametrize(
    ("fp32", "int8", "says"),
    [(0.80, 0.75, "5.00 points lost"), (0.561, 0.575, "1.40 points gained"), (0.5, 0.5, "same")],
)
def test_report_says_whether_points_were_lost_or_gained(fp32, int8, says):
    from edgefl.deploy.measure import Agreement
    from edgefl.deploy.report import DeployReport

    accuracy = Agreement(1000, int8, fp32, 0.97, 0.1).as_dict()
    report = DeployReport(
        "m.onnx",
        "tflite-micro",
        "tflm",
        {"name": "wristband"},
        "int8",
        [],
        {"latency_ms_per_sample": 0.1},
        {},
        accuracy,
        "hapt:test",
        None,
    )
    (line,) = [x for x in report.lines() if "deployed vs" in x]
    assert f"({says});" in line and "-" not in line.split("(")[1]


@pytest.mark.skipif(bool(TFLITE_MISSING), reason=f"needs {TFLITE_MISSING}")
def test_an_op_tflite_micro_lacks_is_said_not_an_arena(files, cli, tmp_path, monkeypatch):
    """The ensemble by probabilities (a log of a mean of softmax outputs) converts to int8
    TFLite but TFLite Micro's interpreter runs it at no arena: deploy says so with the
    interpreter's own error and the ways out, exit 2, not that it needs a bigger arena. The
    probe at the large arena runs the interpreter once, for the answer and its words."""
    from edgefl.deploy import measure, targets

    runs = []
    real_child = measure.child

    def counted(*args, **kw):
        runs.append(args)
        return real_child(*args, **kw)

    monkeypatch.setattr(measure, "child", counted)
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    (uploads / "phone.onnx").write_bytes(Path(files["cnn"]).read_bytes())
    fused = tmp_path / "ens.onnx"
    r = cli(
        "server", "fuse", str(uploads), "--method", "ensemble", "--opt",
        "combine=probabilities", "--out", str(fused), "-q",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    out = tmp_path / "band"
    r = cli(
        "deploy", str(fused), "--profile", "wristband", "--target", "tflite-micro",
        "--out", str(out), "--calibrate", "digits:train", "--json", "-q",
    )  # fmt: skip
    assert r.exit_code == 2, r.output
    err = json.loads(r.stdout)
    assert "with any arena" in err["error"] and "ort-mobile" in err["fix"], err
    assert "LOG_SOFTMAX" in err["error"] and "CONV_2D" in err["error"]  # the file's ops
    assert "more than" not in err["error"], err
    assert not out.exists()
    probes = [a for a in runs if a[0] == "tflm" and a[2] == str(targets.TFLM_PROBE_ARENA)]
    assert len(probes) == 1, probes
