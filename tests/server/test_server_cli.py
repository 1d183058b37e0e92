"""`edgefl server methods|fuse` and `edgefl eval` through the CLI: output, exit codes, and no
traceback for any user error."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import onnx
import pytest
import torch
from fed_fixtures import build_federation
from onnx import helper, numpy_helper
from typer.testing import CliRunner

from edgefl.cli import app
from edgefl.errors import ConfigError
from edgefl.fusion import METHODS
from edgefl.server.plan import check_eval_declared
from exporters import set_metadata
from exporters.schema import METADATA_KEY


def run(*args: str, code: int = 0, env: dict[str, str] | None = None):
    result = CliRunner().invoke(app, [str(a) for a in args], env=env)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.exit_code == code, result.output
    return result


def flat(text: str) -> str:
    # rich wraps long lines (tmp paths are long): compare with whitespace collapsed.
    return " ".join(text.split())


@pytest.fixture(scope="session")
def federation(tmp_path_factory):
    return build_federation(tmp_path_factory.mktemp("fed"))


@pytest.fixture(scope="module")
def fused(federation, tmp_path_factory):
    """`server fuse --eval` with the human-readable output: (result, global model path)."""
    out = tmp_path_factory.mktemp("cli") / "global.onnx"
    r = run(
        "server",
        "fuse",
        federation,
        "--method",
        "fedavg",
        "--out",
        out,
        "--eval",
        "digits",
        "--device",
        "cpu",
    )
    return r, out


# --- server methods --------------------------------------------------------------------------


def test_methods_table_and_json():
    table = run("server", "methods").output
    rows = json.loads(run("server", "methods", "--json").stdout)
    assert [r["name"] for r in rows] == METHODS.names()
    for row in rows:
        assert row["name"] in table
        for key in ("description", "paper"):
            assert isinstance(row[key], str) and row[key], (row["name"], key)
        assert row["consumes"] and all(isinstance(k, str) for k in row["consumes"])
        assert "seed" in row["options"]


# --- server fuse -----------------------------------------------------------------------------


def test_fuse_human_output_with_eval(fused):
    r, out = fused
    text = flat(r.output)
    assert "fedavg (McMahan et al." in text and "on cpu" in text
    assert "used 2 upload(s): client-000, client-001" in text
    assert "skipped client-002.onnx: decoder artifacts are not used by fedavg" in text
    assert "accuracy on digits:test:" in text and "%" in text
    assert f"global model: {out}" in text and str(out.with_suffix(".json")) in text
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["method"] == "fedavg" and 0.4 < report["accuracy"] <= 1.0


def test_fuse_json_with_options_and_eval(federation, tmp_path):
    out, report = tmp_path / "g.onnx", tmp_path / "custom-report.json"
    r = run(
        "server",
        "fuse",
        federation,
        "--method",
        "fedmho-sd",
        "--out",
        out,
        "--json",
        "--eval",
        "digits:test",
        "--device",
        "cpu",
        "--report",
        report,
        "--synthetic",
        "200",
        "--epochs",
        "2",
        "--lam",
        "0.3",
        "--seed",
        "3",
        "--opt",
        "kd-reduction=batchmean",
    )
    rep = json.loads(r.stdout)
    want = dict(synthetic=200, epochs=2, lam=0.3, seed=3, kd_reduction="batchmean")
    assert {k: rep["config"][k] for k in want} == want
    assert rep["used"] == ["client-000", "client-001", "client-002", "client-003"]
    assert rep["eval"]["split"] == "test" and rep["accuracy"] == rep["eval"]["accuracy"]
    assert rep["report_path"] == str(report) and out.is_file()
    assert json.loads(report.read_text()) == {k: v for k, v in rep.items() if k != "report_path"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["custom-report.json", "g.onnx"]


@pytest.mark.parametrize(
    "args, message",
    [
        # click's "Missing option '--method'" named no method to pass
        ([], "server fuse needs --method: fusion method(s) to run on the uploads"),
        ([], "valid fusion methods: coboosting, dense,"),
        (["--method", "fedmh"], "did you mean 'fedmho'?"),
        (["--method", ","], "--method expects distinct names, got no name"),
        (["--method", "fedavg,fedavg"], "got a name twice"),
        (["--method", "fedavg", "--epochs", "3"], "method 'fedavg' has no option(s) --epochs"),
        (["--method", "fedavg", "--opt", "bogus=1"], "has no option(s) --bogus"),
        (["--method", "fedavg", "--opt", "seed"], "--opt expects key=value"),
        # the later of two values won without a word
        (
            ["--method", "fedmho", "--epochs", "1", "--opt", "epochs=2"],
            "option 'epochs' given twice in the method flags and --opt, as '1' and '2'",
        ),
        (["--method", "fedmho", "--lam", "0.1", "--lam", "0.2"], "option 'lam' given twice"),
        (["--method", "fedmho", "--opt", "fedmho:lam=0.1", "--opt", "fedmho:lam=0.2"], "twice"),
        (["--method", "fedmho", "--lam", "2"], "--lam must be in [0, 1]"),
        (["--method", "fedavg", "--out", "global.txt"], "--out must end in .onnx"),
        (["--method", "fedavg", "--jobs", "0"], "--jobs must be an integer >= 1"),
        (["--method", "fedavg", "--device", "tpu"], "--device must be auto, cpu or cuda"),
        # failed after the fusion ("unknown dataset ''"), was read as the default split, was
        # called an unknown dataset
        (["--method", "fedavg", "--eval", ":test"], "--eval ':test' names no dataset"),
        (["--method", "fedavg", "--eval", "digits:"], "names no split after ':'"),
        (["--method", "fedavg", "--eval", "./no.npz"], "--eval './no.npz': no such file"),
        # said before the ingest from what the uploads declare (it was said after the fused
        # model, then after the ingest)
        (
            ["--method", "fedmho-sd", "--eval", "mnist:test"],
            "--eval mnist:test: its samples are 1x28x28 of 10 classes; the uploads' models take "
            "1x8x8 of 10",
        ),
    ],
)
def test_fuse_user_errors(federation, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)  # the default --out would land here
    r = run("server", "fuse", federation, *args, "--json", code=2)
    assert message in flat(r.output)
    assert json.loads(r.stdout)["fix"], r.output  # every refusal says the fix
    assert list(tmp_path.iterdir()) == []
    assert "ingesting" not in r.output, r.output  # each said before the uploads are read


def test_fuse_output_refusals_name_a_fix_that_is_not_the_failing_path(federation, tmp_path):
    """The fix lines repeated the path that failed ("--out d.onnx is a directory; fix: name a
    file, e.g. d.onnx"), and some refusals had none."""
    (tmp_path / "d.onnx").mkdir()
    (tmp_path / "rep").mkdir()
    (tmp_path / "file").write_text("mine")
    g = tmp_path / "g.onnx"
    for args, says in (
        (["--out", tmp_path / "d.onnx"], f"fix: name a file, e.g. {tmp_path}/d.onnx/fedavg.onnx"),
        (["--out", g, "--report", tmp_path / "rep"], f"e.g. {tmp_path}/rep/fedavg.json"),
        (["--method", "fedavg,ensemble", "--out-dir", tmp_path / "file"], "e.g. --out-dir global"),
        (["--out", g, "--out-dir", tmp_path / "o"], "fix: --out FILE.onnx for one method's"),
        (["--opt", "lam"], "fix: e.g. --opt lam=0.3"),
        (["--opt", "=3"], "fix: e.g. --opt lam=0.3"),
        # simulate's spelling (exploratory pass, 2026-12-06: it listed every option instead)
        (
            ["--fuse-opt", "fedmho:lam=0.3"],
            "fix: server fuse takes the same text as --opt: --opt fedmho:lam=0.3",
        ),
    ):
        method = [] if "--method" in args else ["--method", "fedavg"]
        r = run("server", "fuse", federation, *method, *args, code=2)
        assert says in flat(r.output), r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.onnx", "file", "rep"]
    assert (tmp_path / "file").read_text() == "mine"


def test_fuse_refuses_to_write_into_the_upload_dir(federation, tmp_path):
    before = sorted(os.listdir(federation))
    for args, flag_name in (
        (["--out", f"{federation}/global.onnx"], "--out"),
        (["--out", tmp_path / "g.onnx", "--report", f"{federation}/sub/r.json"], "--report"),
    ):
        r = run("server", "fuse", federation, "--method", "fedavg", *args, code=2)
        assert f"{flag_name} " in flat(r.output) and "inside the upload directory" in flat(r.output)
    assert sorted(os.listdir(federation)) == before and list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_fuse_cuda_without_cuda(federation, tmp_path):
    r = run(
        "server",
        "fuse",
        federation,
        "--method",
        "fedavg",
        "--device",
        "cuda",
        "--out",
        tmp_path / "g.onnx",
        code=2,
    )
    assert "--device cuda: no CUDA device is available" in flat(r.output)
    assert "--device auto or cpu" in flat(r.output)
    assert list(tmp_path.iterdir()) == []


def test_fuse_missing_upload_dir(tmp_path):
    r = run(
        "server",
        "fuse",
        tmp_path / "nope",
        "--method",
        "fedavg",
        "--out",
        tmp_path / "g.onnx",
        code=2,
    )
    assert "does not exist or is not a directory" in flat(r.output)
    assert list(tmp_path.iterdir()) == []
    # with --eval too (its check read the folder first: "cannot read nope", 2026-12-06)
    g = tmp_path / "g.onnx"
    r = run("server", "fuse", tmp_path / "nope", "--method", "fedavg", "--out", g, "--eval",
            "digits:test", code=2)  # fmt: skip
    assert "upload directory" in flat(r.output) and "does not exist" in flat(r.output)


# --- eval ------------------------------------------------------------------------------------


def test_eval_global_model_table_json_and_plot(fused, tmp_path):
    _, out = fused
    report = json.loads(out.with_suffix(".json").read_text())
    table = flat(run("eval", out, "--dataset", "digits").output)
    assert "global.onnx on digits:test (360 samples): top-1" in table
    assert f"{100 * report['accuracy']:.2f}%" in table

    png = tmp_path / "confusion.png"
    res = json.loads(run("eval", out, "--dataset", "digits:test", "--json", "--plot", png).stdout)
    assert res["accuracy"] == report["accuracy"] == report["eval"]["accuracy"]
    assert len(res["per_class_accuracy"]) == 10
    confusion = np.array(res["confusion"])
    assert confusion.shape == (10, 10) and confusion.sum() == res["samples"] == 360
    assert np.trace(confusion) / 360 == pytest.approx(res["accuracy"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert res["plot"] == str(png)  # every file written is named
    again = tmp_path / "again.png"
    assert f"confusion matrix: {again}" in flat(
        run("eval", out, "--dataset", "digits", "--plot", again).output
    )


def test_eval_unwritable_plot_fails_before_evaluating(fused, tmp_path, monkeypatch):
    _, out = fused
    (tmp_path / "notes.txt").write_text("keep me")
    import edgefl.evaluate

    def boom(*a, **k):
        raise AssertionError("evaluated before the --plot check")

    monkeypatch.setattr(edgefl.evaluate, "evaluate_artifact", boom)
    for bad in (tmp_path / "notes.txt" / "c.png", tmp_path):
        r = run("eval", out, "--dataset", "digits", "--plot", bad, code=2)
        assert "--plot" in flat(r.output) and "fix:" in r.output
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def _plain_graph(path, in_shape, classes: int, meta: dict | None = None):
    """A tiny linear model that no edgefl client exported (no metadata unless given)."""
    weight = numpy_helper.from_array(np.zeros((64, classes), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["x"], ["f"]), helper.make_node("MatMul", ["f", "w"], ["y"])],
        "plain",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["B", *in_shape])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["B", classes])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    if meta:
        set_metadata(model, meta)
    path.write_bytes(model.SerializeToString())
    return path


def test_eval_is_checked_on_what_the_uploads_declare_and_no_file_can_refuse_it(
    federation, tmp_path
):
    """Before the ingest, --eval is refused only when not one model upload declares a task
    its samples fit: a file declaring another task (hostile or not) cannot refuse the run."""
    mixed = tmp_path / "mixed"
    shutil.copytree(federation, mixed)
    odd = {"kind": "classifier", "num_classes": 10, "input_shape": [1, 28, 28]}
    _plain_graph(mixed / "aaa-odd.onnx", [1, 28, 28], 10, odd)  # listed first
    check_eval_declared(mixed, "digits", recursive=False, max_bytes=1 << 30)
    alone = tmp_path / "alone"
    alone.mkdir()
    _plain_graph(alone / "odd.onnx", [1, 28, 28], 10, odd)
    with pytest.raises(ConfigError, match="the uploads' models take 1x28x28 of 10"):
        check_eval_declared(alone, "digits", recursive=False, max_bytes=1 << 30)
    check_eval_declared(alone, "mnist", recursive=False, max_bytes=1 << 30)
    # A declaration that is no task is passed over, never a traceback (a missing key did).
    broken = tmp_path / "broken"
    broken.mkdir()
    for i, meta in enumerate(
        ({"kind": "classifier"}, {"kind": "decoder", "input_shape": "x", "num_classes": [1]})
    ):
        _plain_graph(broken / f"b{i}.onnx", [1, 8, 8], 10, meta)
    huge = onnx.load(str(_plain_graph(broken / "b2.onnx", [1, 8, 8], 10)))
    entry = huge.metadata_props.add()
    entry.key, entry.value = (
        METADATA_KEY,
        '{"kind": "classifier", "input_shape": [1e999], "num_classes": 10}',
    )
    onnx.save(huge, str(broken / "b2.onnx"))
    check_eval_declared(broken, "digits", recursive=False, max_bytes=1 << 30)
    _plain_graph(broken / "b3.onnx", [1, 28, 28], 10, odd)  # the one task declared decides
    with pytest.raises(ConfigError, match="take 1x28x28 of 10"):
        check_eval_declared(broken, "digits", recursive=False, max_bytes=1 << 30)


def test_eval_errors(federation, tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a model")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")  # parses as an empty graph
    cases = [
        (junk, "is not a readable ONNX model"),
        (empty, "is not an ONNX model (no inputs or outputs)"),
        (tmp_path / "missing.onnx", "not found"),
        (federation / "client-002.onnx", "is a CVAE decoder upload: it generates samples"),
        (_plain_graph(tmp_path / "flat.onnx", [64], 10), "onnxruntime cannot run"),
        (_plain_graph(tmp_path / "wide.onnx", [1, 8, 8], 12), "model output has shape [360, 12]"),
        (
            _plain_graph(
                tmp_path / "five.onnx",
                [1, 8, 8],
                5,
                {"kind": "classifier", "num_classes": 5, "input_shape": [1, 8, 8]},
            ),
            "model predicts 5 classes, dataset digits has 10",
        ),
    ]
    for path, message in cases:
        for extra in ([], ["--json"]):
            r = run("eval", path, "--dataset", "digits", *extra, code=2)
            assert message in flat(r.output), (path.name, r.output)
        assert json.loads(r.stdout)["fix"], (path.name, r.output)  # every one says the fix
    # Two splits named: refused, not one of them taken silently (before the model is read).
    r = run("eval", junk, "--dataset", "digits:train", "--split", "test", code=2)
    said = flat(r.output)
    assert "names split 'train' but --split says 'test'" in said and "fix:" in said, said


def test_fuse_budget_paper_under_the_users_flags(federation, tmp_path):
    out = tmp_path / "g.onnx"
    r = run(
        "server",
        "fuse",
        federation,
        "--method",
        "dense",
        "--budget",
        "paper",
        "--out",
        out,
        "--json",
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--gen-steps",
        "2",
        "--batch-size",
        "8",
        "--ngf",
        "4",
        "--nz",
        "8",
    )
    cfg = json.loads(r.stdout)["config"]
    assert cfg["pool_every_step"] is False  # from the paper budget (DENSE pools one batch)
    assert (cfg["epochs"], cfg["gen_steps"], cfg["ngf"]) == (1, 2, 4)  # the user's flags win
    row = json.loads(run("server", "methods", "dense", "--json").stdout)
    assert row["budgets"]["paper"]["epochs"] == 200 and row["budgets"]["cpu"] == {}
    assert row["budgets"]["code"] == row["budgets"]["paper"]  # no known code divergence
    bad = run("server", "fuse", federation, "--method", "dense", "--budget", "huge", code=2)
    assert "--budget must be one of cpu, paper, code, got 'huge'" in flat(bad.output)
    assert "code: each method as its authors' public code runs it" in flat(bad.output)


def test_fuse_budget_code_is_the_authors_code(federation, tmp_path):
    """FedMHO at --budget code trains the 20 global epochs its authors' code runs on MNIST (the
    paper says 10); a user's flag still wins; `server methods` shows paper and code apart."""
    out = tmp_path / "g.onnx"
    rep = json.loads(
        run(
            "server",
            "fuse",
            federation,
            "--method",
            "fedmho",
            "--budget",
            "code",
            "--out",
            out,
            "--json",
            "--device",
            "cpu",
        ).stdout
    )
    assert rep["config"]["epochs"] == 20 and len(rep["loss_history"]) == 20
    rep = json.loads(
        run(
            "server",
            "fuse",
            federation,
            "--method",
            "fedmho-md",
            "--budget",
            "code",
            "--epochs",
            "2",
            "--out",
            tmp_path / "md.onnx",
            "--json",
            "--device",
            "cpu",
        ).stdout
    )
    assert rep["config"]["epochs"] == 2
    out = run("server", "methods", "fedmho", env={"COLUMNS": "200"}).output
    shown = flat("".join(" " if 0x2500 <= ord(c) <= 0x257F else c for c in out))  # no borders
    assert "cpu paper code" in shown and "--epochs by dataset by dataset 20" in shown
    assert "code vs paper: the code's CNN prototype ends in a Softmax" in shown
    assert "keeps a random 80% of each class" in shown
    plain = flat(run("server", "methods", "fedavg").output)
    assert "--budget cpu, paper, code: all the defaults" in plain


def test_an_option_unset_by_default_is_shown_and_hinted_as_unset(tmp_path):
    """FedMHO's lr is chosen by the input when unset: never shown as a value to type (None)."""
    out = run("server", "methods", "fedmho", env={"COLUMNS": "200"}).output
    assert "--lr by dataset" in flat("".join(" " if 0x2500 <= ord(c) <= 0x257F else c for c in out))
    from edgefl.errors import ConfigError
    from edgefl.fusion import METHODS
    from edgefl.fusion.options import validate

    with pytest.raises(ConfigError, match="--lr must be > 0") as err:
        validate(METHODS.get("fedmho").config_cls(lr=0.0))
    assert "leave --lr out" in err.value.hint and "None" not in err.value.hint


def test_no_usable_upload_lists_every_rejection_in_the_error(tmp_path):
    # Nothing is printed before this failure, so the message itself must say why (issue 19).
    up = tmp_path / "up"
    up.mkdir()
    (up / "a.onnx").write_text("not onnx")
    (up / "[bold]b.onnx").write_bytes(b"x")  # a name that is rich markup: shown as text
    for extra in ((), ("--json",)):
        r = run(
            "server",
            "fuse",
            str(up),
            "--method",
            "fedavg",
            "--out",
            str(tmp_path / "g.onnx"),
            *extra,
            code=2,
        )
        text = flat(r.output)
        assert "2 rejected" in text and "a.onnx: not a valid ONNX file" in text, text
        assert "[bold]b.onnx: not a valid ONNX file" in text, text
        assert "Traceback" not in r.output and not (tmp_path / "g.onnx").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run(
        "server",
        "fuse",
        str(empty),
        "--method",
        "fedavg",
        "--out",
        str(tmp_path / "g.onnx"),
        code=2,
    )
    assert "holds no .onnx files" in flat(r.output)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
@pytest.mark.parametrize(
    "argv",
    [
        ["server", "fuse", "{up}", "--method", "fedavg", "--out", "/proc/g.onnx"],
        [
            "client",
            "train",
            "--profile",
            "wristband",
            "--dataset",
            "digits",
            "--num-clients",
            "2",
            "--client-index",
            "0",
            "--out",
            "/proc/up",
        ],
        [
            "simulate",
            "--dataset",
            "digits",
            "--clients",
            "2",
            "--mix",
            "smartphone:2",
            "--out",
            "/proc/sim",
        ],
    ],
)
def test_outputs_no_file_can_be_made_in_fail_first(argv, tmp_path, monkeypatch):
    # Root may "access" /proc, yet no file can be created there: refused before any work.
    import edgefl.client.run

    def no_work(*a, **k):
        raise AssertionError("training started before the output check")

    monkeypatch.setattr(edgefl.client.run, "_local_data", no_work)
    r = run(*[a.replace("{up}", str(tmp_path)) for a in argv], code=2)
    assert "cannot be written" in flat(r.output), r.output
