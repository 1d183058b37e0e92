"""A run that would write where another run is writing stops at once, naming that run, and
leaves what is there alone (found by an exploratory pass, 2026-12-06: two `client train` runs of
different models to one upload both exited 0, the last writer's model kept; a second `simulate`
on the same --out replaced the first's upload before its settings check stopped it). The other
run is this test process holding the lock, as a live run holds it (edgefl/outputs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgefl.outputs import lock_outputs

pytestmark = pytest.mark.slow  # a trained upload and CLI runs: not in `make test-fast`
TRAIN = ("client", "train", "--profile", "smartphone", "--dataset", "digits", "--num-clients", "4")


@pytest.fixture(scope="module")
def upload(tmp_path_factory) -> Path:
    from typer.testing import CliRunner

    from edgefl.cli import app

    out = tmp_path_factory.mktemp("up")
    r = CliRunner().invoke(app, [*TRAIN, "--model", "mlp", "--epochs", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out / "client-000.onnx"


def _held_off(r, target: Path) -> None:
    """Exit 2 with one message naming the target and the run holding it, and its fix."""
    assert r.exit_code == 2, r.output
    error = json.loads(r.stdout)
    assert error["error"].startswith(f"{target} is being written by another run (pid "), error
    assert "wait for that run to finish" in error["fix"]


def test_client_train_to_an_upload_being_written(cli, upload):
    before = upload.read_bytes()
    with lock_outputs([upload]):
        r = cli(*TRAIN, "--model", "cnn", "--epochs", "1", "--out", str(upload.parent), "--json")
    _held_off(r, upload.resolve())
    assert upload.read_bytes() == before
    assert sorted(p.name for p in upload.parent.iterdir()) == ["client-000.onnx"]  # no lock left


def test_simulate_on_an_out_being_written_trains_no_client(cli, tmp_path):
    out = tmp_path / "sim"
    args = ("simulate", "--dataset", "digits", "--clients", "2", "--methods", "fedavg")
    with lock_outputs([out / "results.json"]):  # the lock is in --out, however it is spelt
        r = cli(*args, "--out", f"{out}/../{out.name}/.", "--json")
    _held_off(r, out.resolve() / "results.json")
    assert not out.exists()  # made for the lock, gone with it


def test_search_save_and_audit_out_and_deploy_out_being_written(cli, upload, tmp_path):
    save, report, band = tmp_path / "spec.json", tmp_path / "audit.json", tmp_path / "band"
    search = ("search", "--profile", "wristband", "--dataset", "digits", "--particles", "2")
    with lock_outputs([save, report, band / "client-000.*"]):
        _held_off(cli(*search, "--generations", "0", "--save", str(save), "--json"), save)
        _held_off(cli("audit", str(upload), "--out", str(report), "--json"), report)
        deploy = ("deploy", str(upload), "--profile", "smartphone", "--target", "onnx")
        _held_off(cli(*deploy, "--out", str(band), "--json"), band.resolve() / "client-000.*")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_output_under_a_file_is_one_message(cli, upload, tmp_path):
    (tmp_path / "f").write_text("a file")
    r = cli("simulate", "--dataset", "digits", "--out", str(tmp_path / "f" / "sim"), "--json")
    assert r.exit_code == 2, r.output
    error = json.loads(r.stdout)
    assert "f" in error["error"] and error["fix"], error
