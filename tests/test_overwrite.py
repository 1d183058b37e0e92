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
    _refused(r, "client-000.onnx already holds client-000's classifier upload (mlp",
             "model mlp -> a --search pso result", "another --out", "--client-id")  # fmt: skip
    assert (out / "client-000.onnx").read_bytes() == before  # nothing lost


def test_rerun_of_the_same_command_replaces_its_own(cli, uploads):
    out, _ = uploads
    r = cli(*TRAIN, "--model", "mlp", "--out", str(out), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["path"] == str(out / "client-000.onnx")


@pytest.mark.parametrize("change, differs", [
    (("--profile", "smartphone", "--model", "mlp", "--epochs", "2"), "epochs 1 -> 2"),
    (("--profile", "smartphone", "--model", "scnn:width=8", "--epochs", "1"), "model mlp -> scnn"),
    (("--profile", "smartphone", "--model", "mlp", "--epochs", "1", "--partition", "iid"),
     "partition dirichlet:0.5 -> iid"),
    (("--profile", "wristband", "--model", "mlp", "--epochs", "1", "--force"),
     "profile smartphone -> wristband"),
    (("--profile", "smartphone", "--model", "mlp", "--epochs", "1", "--quantize", "int8"),
     "quantize none -> int8"),
])  # fmt: skip
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
    _refused(r, "not an edgefl upload")
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
    r = cli("client", "prototypes", "--profile", "smartphone", "--dataset", "digits",
            "--num-clients", "4", "--epochs", "1", "--model", "fedgh-cnn1", "--quiet",
            "--out", str(tmp_path / "protos"), "--keep-model", str(out))  # fmt: skip
    _refused(r, "--keep-model", "model mlp -> fedgh-cnn1")
    assert (out / "client-000.onnx").read_bytes() == before
    assert not (tmp_path / "protos" / "client-000.onnx").exists()
