"""An output that would replace an upload or a result another command made is refused without
--overwrite, before any work (issue 34 item 2); a rerun of the same command replaces its own."""

from __future__ import annotations

import json

import pytest

BASE = ("client", "train", "--dataset", "digits", "--num-clients", "4", "--quiet")
TRAIN = (*BASE, "--profile", "smartphone", "--epochs", "1")
SEARCH = ("--search", "pso", "--particles", "2", "--generations", "0")


def _flat(text: str) -> str:
    return " ".join(text.split())


def _refused(r, *words: str) -> str:
    text = _flat(r.output)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and "--overwrite" in text, text
    for w in words:
        assert w in text, (w, text)
    return text


@pytest.fixture
def uploads(cli, tmp_path):
    """An upload made by a plain `client train --model mlp`, and its bytes."""
    out = tmp_path / "uploads"
    r = cli(*TRAIN, "--model", "mlp", "--out", str(out))
    assert r.exit_code == 0, r.output
    return out, (out / "client-000.onnx").read_bytes()


def test_search_refuses_to_replace_a_plain_upload(cli, uploads, monkeypatch):
    out, before = uploads
    import edgefl.search.pso as pso

    def no_search(*a, **k):  # the refusal comes before the search: it must never start
        raise AssertionError("the search ran")

    monkeypatch.setattr(pso, "search_architecture", no_search)
    r = cli(*TRAIN, *SEARCH, "--out", str(out))
    _refused(
        r,
        "client-000.onnx already holds client-000's classifier upload (mlp",
        "model mlp -> a --search pso result",
        "another --out",
        "--client-id",
    )
    assert (out / "client-000.onnx").read_bytes() == before  # nothing lost


def test_rerun_of_the_same_command_replaces_its_own(cli, uploads):
    out, _ = uploads
    r = cli(*TRAIN, "--model", "mlp", "--out", str(out), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["path"] == str(out / "client-000.onnx")


@pytest.mark.parametrize(
    "change, differs",
    [
        (("--profile", "smartphone", "--model", "mlp", "--epochs", "2"), "epochs 1 -> 2"),
        (
            ("--profile", "smartphone", "--model", "scnn:width=8", "--epochs", "1"),
            "model mlp -> scnn",
        ),
        (
            ("--profile", "smartphone", "--model", "mlp", "--epochs", "1", "--partition", "iid"),
            "partition dirichlet:0.5 -> iid",
        ),
        (
            ("--profile", "wristband", "--model", "mlp", "--epochs", "1", "--force"),
            "profile smartphone -> wristband",
        ),
        (
            ("--profile", "smartphone", "--model", "mlp", "--epochs", "1", "--quantize", "int8"),
            "quantize none -> int8",
        ),
        (
            ("--profile", "smartphone", "--model", "mlp", "--epochs", "1", "--seed", "1"),
            "seed 0 -> 1",
        ),
        (
            ("--profile", "smartphone", "--model", "mlp", "--epochs", "1", "--fed-seed", "2"),
            "fed_seed 0 -> 2",
        ),
        (
            ("--profile", "smartphone", "--model", "mlp", "--epochs", "1", "--augment", "affine"),
            "augment none -> affine",
        ),
    ],
)
def test_other_settings_are_another_command(cli, uploads, change, differs):
    out, before = uploads
    r = cli(*BASE, *change, "--out", str(out))
    _refused(r, differs)
    assert (out / "client-000.onnx").read_bytes() == before


def test_overwrite_replaces_and_another_client_id_keeps(cli, uploads):
    out, before = uploads
    r = cli(*TRAIN, "--model", "scnn:width=8", "--out", str(out), "--client-id", "phone")
    assert r.exit_code == 0, r.output
    assert (out / "client-000.onnx").read_bytes() == before and (out / "phone.onnx").is_file()
    r = cli(*TRAIN, "--model", "scnn:width=8", "--out", str(out), "--overwrite")
    assert r.exit_code == 0, r.output
    assert (out / "client-000.onnx").read_bytes() != before


def test_a_file_edgefl_did_not_write_is_refused(cli, tmp_path):
    (tmp_path / "client-000.onnx").write_bytes(b"my own notes")
    r = cli(*TRAIN, "--model", "mlp", "--out", str(tmp_path))
    _refused(r, "a file edgefl did not write")
    assert (tmp_path / "client-000.onnx").read_bytes() == b"my own notes"


def test_search_rerun_is_its_own_and_other_swarm_is_not(cli, tmp_path):
    out = tmp_path / "uploads"
    r = cli(*TRAIN, *SEARCH, "--out", str(out))
    assert r.exit_code == 0, r.output
    r = cli(*TRAIN, *SEARCH, "--out", str(out))
    assert r.exit_code == 0, r.output
    r = cli(*TRAIN, "--search", "pso", "--particles", "3", "--generations", "0", "--out", str(out))
    _refused(r, "particles 2", "particles 3")
    r = cli(*TRAIN, "--model", "mlp", "--out", str(out))
    _refused(r, "model nas-cnn")


def test_prototypes_kept_model_is_checked_too(cli, uploads, tmp_path):
    out, before = uploads  # a model upload where prototypes would keep the device's model
    r = cli(
        "client",
        "prototypes",
        "--profile",
        "smartphone",
        "--dataset",
        "digits",
        "--num-clients",
        "4",
        "--epochs",
        "1",
        "--model",
        "fedgh-cnn1",
        "--quiet",
        "--out",
        str(tmp_path / "protos"),
        "--keep-model",
        str(out),
    )
    _refused(r, "--keep-model", "model mlp -> fedgh-cnn1")
    assert (out / "client-000.onnx").read_bytes() == before
    assert not (tmp_path / "protos" / "client-000.onnx").exists()


# --- the other writers a user points at existing results -------------------------------------


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """Two classifier uploads (digits) and a fedavg global model fused from them."""
    from edgefl.client.run import ClientJob, run_client
    from edgefl.server.fuse import FuseJob, run_fuse

    root = tmp_path_factory.mktemp("fed")
    for i in (0, 1):
        run_client(
            ClientJob(
                profile="smartphone",
                dataset="digits",
                out_dir=str(root / "up"),
                num_clients=4,
                client_index=i,
                epochs=1,
                model="mlp",
            )
        )
    run_fuse(FuseJob(uploads=str(root / "up"), method="fedavg", out=str(root / "fedavg.onnx")))
    return root


def _copy(src, dst):
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(src.read_bytes())
    return dst.read_bytes()


def test_fuse_replaces_its_own_result_only(cli, federation, tmp_path):
    up = str(federation / "up")
    out = tmp_path / "global.onnx"
    fuse = ("server", "fuse", up, "--out", str(out), "--quiet")
    assert cli(*fuse, "--method", "fedavg").exit_code == 0
    r = cli(*fuse, "--method", "fedavg")  # the same fuse again: its own result, replaced
    assert r.exit_code == 0, r.output
    before = out.read_bytes()
    _refused(cli(*fuse, "--method", "ensemble"), "fedavg global model", "another --out")
    assert out.read_bytes() == before and "fedavg" in (tmp_path / "global.json").read_text()
    assert cli(*fuse, "--method", "ensemble", "--overwrite").exit_code == 0
    assert out.read_bytes() != before


def test_fuse_never_replaces_an_upload_or_a_foreign_file(cli, federation, tmp_path):
    before = _copy(federation / "up" / "client-000.onnx", tmp_path / "g" / "fedavg.onnx")
    r = cli(
        "server",
        "fuse",
        str(federation / "up"),
        "--method",
        "fedavg",
        "--out-dir",
        str(tmp_path / "g"),
        "--quiet",
    )
    _refused(r, "client-000's classifier upload", "--out-dir")
    assert (tmp_path / "g" / "fedavg.onnx").read_bytes() == before
    (tmp_path / "notes.json").write_text("[1, 2]")
    r = cli(
        "server",
        "fuse",
        str(federation / "up"),
        "--method",
        "fedavg",
        "--out",
        str(tmp_path / "x.onnx"),
        "--report",
        str(tmp_path / "notes.json"),
        "--quiet",
    )
    _refused(r, "notes.json already holds a file edgefl did not write", "--report")


def test_apply_header_keeps_what_is_not_its_own(cli, federation, tmp_path):
    before = _copy(federation / "fedavg.onnx", tmp_path / "personal.onnx")
    r = cli(
        "client",
        "apply-header",
        str(federation / "up" / "client-000.onnx"),
        str(federation / "fedavg.onnx"),
        "--out",
        str(tmp_path / "personal.onnx"),
    )
    _refused(r, "fedavg global model")
    assert (tmp_path / "personal.onnx").read_bytes() == before


def test_search_save_keeps_a_file_that_is_not_a_saved_spec(cli, tmp_path, monkeypatch):
    import edgefl.client.run as run

    monkeypatch.setattr(run, "search_architecture", lambda *a, **k: pytest.fail("searched"))
    (tmp_path / "best.json").write_text('{"my": "settings"}')
    r = cli(
        "search",
        "--profile",
        "wristband",
        "--dataset",
        "digits",
        "--save",
        str(tmp_path / "best.json"),
    )
    _refused(r, "best.json already holds", "another --save")
    assert (tmp_path / "best.json").read_text() == '{"my": "settings"}'


def test_search_save_rerun_replaces_its_spec(cli, tmp_path):
    args = (
        "search",
        "--profile",
        "wristband",
        "--dataset",
        "digits",
        "--num-clients",
        "4",
        "--particles",
        "2",
        "--generations",
        "0",
        "--quiet",
        "--save",
        str(tmp_path / "s.json"),
    )
    assert cli(*args).exit_code == 0
    r = cli(*args)
    assert r.exit_code == 0, r.output
    # another device's search at the same path: its spec is kept unless --overwrite
    saved = (tmp_path / "s.json").read_text()
    other = [a if a != "wristband" else "smartphone" for a in args]
    r = cli(*other)
    _refused(r, "s.json already holds", "searched for profile wristband, dataset digits")
    assert (tmp_path / "s.json").read_text() == saved
    # another partition seed is another shard: kept too (the record did not name the seed)
    r = cli(*args, "--partition-seed", "1")
    _refused(r, "s.json already holds", "searched for profile wristband, dataset digits")
    # a spec saved before the record named the seed is still its rerun's own
    old = json.loads(saved)
    del old["searched"]["partition_seed"]
    (tmp_path / "s.json").write_text(json.dumps(old))
    assert cli(*args).exit_code == 0
    saved = (tmp_path / "s.json").read_text()
    assert json.loads(saved)["searched"]["partition_seed"] == 0
    assert cli(*other, "--overwrite").exit_code == 0
    spec = json.loads((tmp_path / "s.json").read_text())
    assert spec["searched"]["profile"] == "smartphone"
    # the record does not stop the spec being trained
    r = cli("client", "train", "--profile", "smartphone", "--dataset", "digits", "--num-clients",
            "4", "--epochs", "1", "--spec", str(tmp_path / "s.json"), "--out",
            str(tmp_path / "up"), "--quiet")  # fmt: skip
    assert r.exit_code == 0, r.output


def test_deploy_replaces_its_own_deploy_only(cli, federation, tmp_path):
    out = tmp_path / "band"
    deploy = ("deploy", "--profile", "smartphone", "--target", "onnx", "--out", str(out), "--quiet")
    assert cli(*deploy, str(federation / "fedavg.onnx")).exit_code == 0
    r = cli(*deploy, str(federation / "fedavg.onnx"))  # the same deploy again
    assert r.exit_code == 0, r.output
    before = (out / "fedavg.smartphone.onnx").read_bytes()
    other = _copy(federation / "up" / "client-001.onnx", tmp_path / "other" / "fedavg.onnx")
    assert other
    r = cli(*deploy, str(tmp_path / "other" / "fedavg.onnx"))  # same name, another model
    _refused(r, "fedavg.smartphone.onnx already holds", "deployed for onnx")
    assert (out / "fedavg.smartphone.onnx").read_bytes() == before
    assert cli(*deploy, str(tmp_path / "other" / "fedavg.onnx"), "--overwrite").exit_code == 0


def test_an_ort_mobile_deploy_reruns_and_refuses_another_model(cli, federation, tmp_path):
    """An .ort file records nothing itself: the sidecar beside it says what it came from."""
    out = tmp_path / "phone"
    deploy = ("deploy", "--profile", "smartphone", "--target", "ort-mobile", "--out", str(out))
    assert cli(*deploy, str(federation / "fedavg.onnx"), "--quiet").exit_code == 0
    r = cli(*deploy, str(federation / "fedavg.onnx"), "--quiet")  # the same deploy again
    assert r.exit_code == 0, r.output
    before = (out / "fedavg.smartphone.ort").read_bytes()
    assert _copy(federation / "up" / "client-001.onnx", tmp_path / "other" / "fedavg.onnx")
    r = cli(*deploy, str(tmp_path / "other" / "fedavg.onnx"), "--quiet")
    _refused(r, "already holds", "deployed for ort-mobile")
    assert (out / "fedavg.smartphone.ort").read_bytes() == before
