"""Uploads of other datasets in one folder, and --eval of other data of the same shape (found by
an exploratory pass, 2026-12-06): one MNIST and one Fashion upload were "settled by majority"
1 to 1 (half the federation dropped, by file order); a Fashion federation fused with --eval
mnist:test scored 5 % and blamed the method."""

from __future__ import annotations

import json
from types import SimpleNamespace

import onnx
import pytest
from fed_fixtures import build_federation
from onnx_edits import restamp

from edgefl.errors import ConfigError, FusionError
from edgefl.server.ingest import ingest
from edgefl.server.plan import check_eval_declared, check_eval_fits

FASHION = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot"]  # fmt: skip
MNIST_TASK = {"kind": "classifier", "input_shape": [1, 28, 28], "num_classes": 10}


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    return build_federation(tmp_path_factory.mktemp("fed"))


def _copy(src, dst, **changes) -> None:
    model = onnx.load(str(src))
    if changes:
        restamp(model, **changes)
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst))


def test_a_tie_between_datasets_fuses_nothing_and_names_both(federation, tmp_path):
    up = tmp_path / "up"
    _copy(federation / "client-000.onnx", up / "a.onnx")
    _copy(federation / "client-001.onnx", up / "b.onnx", dataset="fashion-8", class_names=FASHION)
    with pytest.raises(FusionError) as refused:
        ingest(up, max_upload_bytes=10**8)
    said = str(refused.value)
    assert said.startswith("the uploads are of 2 tasks in equal numbers"), said
    assert "classes named 0, 1, 2, ...: a.onnx" in said
    assert "classes named T-shirt/top, Trouser, Pullover, ...: b.onnx" in said
    assert "folder of their own" in refused.value.hint


def test_the_minority_dataset_is_rejected_naming_both_datasets(federation, tmp_path):
    up = tmp_path / "up"
    _copy(federation / "client-000.onnx", up / "a.onnx")
    _copy(federation / "client-002.onnx", up / "c.onnx")  # a decoder of the same task
    _copy(federation / "client-001.onnx", up / "b.onnx", dataset="fashion-8", class_names=FASHION)
    found = ingest(up, max_upload_bytes=10**8)
    reasons = dict(found.rejected)
    assert set(reasons) == {"b.onnx"}
    assert reasons["b.onnx"].startswith(
        "trained on 'fashion-8', the majority on 'digits': class 0 is named 'T-shirt/top'"
    ), reasons


def test_server_fuse_says_the_tie_with_the_fix(federation, tmp_path, cli):
    up = tmp_path / "up"
    _copy(federation / "client-000.onnx", up / "a.onnx")
    _copy(federation / "client-001.onnx", up / "b.onnx", class_names=FASHION)
    r = cli("server", "fuse", str(up), "--method", "fedavg", "--out", str(tmp_path / "g.onnx"),
            "--json")  # fmt: skip
    assert r.exit_code == 2, r.output
    error = json.loads(r.stdout)
    assert "2 tasks in equal numbers" in error["error"] and error["fix"], error
    assert not (tmp_path / "g.onnx").exists()


def test_eval_of_another_registered_dataset_of_the_same_shape_is_refused(tmp_path):
    fashion = {**MNIST_TASK, "dataset": "fmnist"}
    upload = SimpleNamespace(kind="classifier", meta=fashion)
    with pytest.raises(ConfigError) as refused:
        check_eval_fits([upload], "mnist:test")
    assert "trained on fmnist, not mnist" in str(refused.value)
    assert "--eval fmnist:test" in refused.value.hint
    check_eval_fits([upload], "fmnist:test")  # its own data
    check_eval_fits([SimpleNamespace(kind="classifier", meta=MNIST_TASK)], "mnist:test")
    # A dataset that is not registered (a file's, or a name edgefl does not know) is not judged.
    other = SimpleNamespace(kind="classifier", meta={**MNIST_TASK, "dataset": "my-scans"})
    check_eval_fits([other], "mnist:test")


def test_eval_declared_is_refused_before_the_ingest_only_when_no_upload_fits(federation, tmp_path):
    """From the uploads' own (unchecked) declarations: one upload naming the --eval dataset is
    enough to go on, so a file that declares another can never refuse the run."""
    up = tmp_path / "up"
    _copy(federation / "client-000.onnx", up / "a.onnx", dataset="fmnist", input_shape=[1, 28, 28])
    listing = {"recursive": False, "max_bytes": 10**8}
    with pytest.raises(ConfigError, match="trained on fmnist, not mnist"):
        check_eval_declared(up, "mnist:test", **listing)
    _copy(federation / "client-001.onnx", up / "b.onnx", dataset="mnist", input_shape=[1, 28, 28])
    check_eval_declared(up, "mnist:test", **listing)


def test_the_most_common_dataset_decides_not_the_first_upload():
    """One accepted upload naming another dataset (first in order) refused --eval of the
    federation's own data, and chose another (review, 2026-12-06)."""
    odd = SimpleNamespace(kind="classifier", meta={**MNIST_TASK, "dataset": "fmnist"})
    honest = [SimpleNamespace(kind="classifier", meta={**MNIST_TASK, "dataset": "mnist"})] * 2
    check_eval_fits([odd, *honest], "mnist:test")
    with pytest.raises(ConfigError, match="trained on mnist, not fmnist"):
        check_eval_fits([odd, *honest], "fmnist:test")


def test_copies_of_one_clients_upload_cannot_force_a_tie(federation, tmp_path):
    up = tmp_path / "up"
    _copy(federation / "client-000.onnx", up / "a.onnx")
    _copy(federation / "client-002.onnx", up / "c.onnx")
    for name in ("f1.onnx", "f2.onnx"):  # one client (one id), twice
        _copy(federation / "client-001.onnx", up / name, class_names=FASHION)
    found = ingest(up, max_upload_bytes=10**8)
    assert sorted(dict(found.rejected)) == ["f1.onnx", "f2.onnx"]
