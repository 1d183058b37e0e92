"""Datasets found without a flag (issue 56 item 1): --data-dir, else $EDGEFL_DATA_DIR, ./data,
then the folder a system package installs (/usr/share/datasets/<folder>); `edgefl data list`
says where each was found; a missing one is one message naming the package that provides it."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from test_data import write_idx_set

from edgefl.data import datasets, locate
from edgefl.data.datasets import load_dataset
from edgefl.errors import DataError

SYSTEM = locate.SYSTEM_ROOT / "fashion-mnist"


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """An empty working folder, no $EDGEFL_DATA_DIR, and a system root of the test's own."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(locate.ENV, raising=False)
    monkeypatch.setattr(locate, "SYSTEM_ROOT", tmp_path / "system")
    datasets._load_registered.cache_clear()
    yield tmp_path
    datasets._load_registered.cache_clear()


def test_the_search_path_in_its_documented_order(roots, monkeypatch):
    a, b = roots / "a", roots / "b"
    monkeypatch.setenv(locate.ENV, f"{a}{os.pathsep}{b}")
    system = roots / "system" / "fashion-mnist"
    assert locate.search_path("fmnist") == [a, b, locate.Path("data"), system]
    assert locate.search_path("svhn")[-1] == roots / "system" / "svhn"
    assert locate.search_path("fmnist", data_dir=roots / "mine") == [roots / "mine"]


def test_the_system_folder_is_found_with_no_flag(roots):
    raw = write_idx_set(roots / "system" / "fashion-mnist", "", 12, 5, 10, gz=True)
    assert locate.find("fmnist") == roots / "system" / "fashion-mnist"
    train, test = load_dataset("fmnist"), load_dataset("fmnist:test")
    assert train.x.shape == (12, 1, 28, 28) and len(test) == 5
    assert np.array_equal(test.y, raw["test"][1])


def test_the_users_folders_come_before_the_systems(roots, monkeypatch):
    write_idx_set(roots / "system" / "fashion-mnist", "", 12, 5, 10)
    write_idx_set(roots / "data", "", 7, 3, 10)
    assert len(load_dataset("fmnist")) == 7  # ./data
    write_idx_set(roots / "env", "", 9, 3, 10)
    monkeypatch.setenv(locate.ENV, str(roots / "env"))
    datasets._load_registered.cache_clear()
    assert locate.find("fmnist") == roots / "env" and len(load_dataset("fmnist")) == 9
    # A folder the user names is the only one read: its missing files are an error, not a cue
    # to read another folder's.
    (roots / "empty").mkdir()
    with pytest.raises(DataError, match="train-images-idx3-ubyte"):
        load_dataset("fmnist", data_dir=roots / "empty")


def test_a_missing_dataset_is_one_message_naming_its_package(roots, cli):
    with pytest.raises(DataError) as err:
        load_dataset("fmnist")
    assert str(roots / "system" / "fashion-mnist") in err.value.message
    assert "apt-get install -y dataset-fashion-mnist" in err.value.hint
    result = cli("data", "partition", "--dataset", "fmnist", "--num-clients", "3")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "dataset-fashion-mnist" in " ".join(result.output.split())
    with pytest.raises(DataError) as err:
        load_dataset("svhn")
    assert "train_32x32.mat" in err.value.hint and "--data-dir" in err.value.hint


def test_data_list_says_what_was_found_and_where(roots, cli):
    write_idx_set(roots / "system" / "fashion-mnist", "", 12, 5, 10)
    rows = {r["name"]: r for r in json.loads(cli("data", "list", "--json").output)}
    assert rows["fmnist"]["found"] and rows["fmnist"]["path"] == str(
        roots / "system" / "fashion-mnist"
    )
    assert rows["fmnist"]["package"] == "dataset-fashion-mnist"
    assert not rows["svhn"]["found"] and rows["svhn"]["path"] is None
    assert rows["svhn"]["looked_in"][-1] == str(roots / "system" / "svhn")
    assert rows["mnist"]["found"] and rows["mnist"]["builtin"]
    lines = cli("data", "list").output.splitlines()
    svhn = next(line for line in lines if " svhn " in line)
    assert "73,257" in svhn and "no (--data-dir)" in svhn
    assert str(roots / "system" / "fashion-mnist") in " ".join(" ".join(lines).split())


@pytest.mark.skipif(not SYSTEM.is_dir(), reason="dataset-fashion-mnist is not installed")
def test_the_real_fashion_mnist_from_the_system_package():
    """What `make setup` installs (Debian's dataset-fashion-mnist): the Zalando files whole."""
    datasets._load_registered.cache_clear()
    train, test = load_dataset("fmnist"), load_dataset("fmnist:test")
    assert train.x.shape == (60_000, 1, 28, 28) and test.x.shape == (10_000, 1, 28, 28)
    assert np.bincount(train.y).tolist() == [6_000] * 10
    assert np.bincount(test.y).tolist() == [1_000] * 10
    assert 0.25 < float(train.x.mean()) < 0.35  # grey clothes, not digits' mostly black


def test_a_dataset_without_its_files_is_said_before_any_work(roots, cli):
    """A --data-dir holding the training files only failed at the evaluation, after every
    client trained (simulate) or the fusion ran (server fuse --eval): said first now."""
    partial = roots / "partial"
    write_idx_set(partial, "", 12, 5, 10)
    for f in partial.glob("t10k-*"):
        f.unlink()
    r = cli(
        "simulate",
        *("--dataset", "fmnist", "--data-dir", str(partial), "--clients", "4"),
        *("--mix", "smartphone:2,wristband:2", "--out", str(roots / "run")),
    )
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    said = " ".join(r.output.split())
    assert "lacks its files" in said and "t10k-images-idx3-ubyte" in said, said
    assert "client 0" not in said and not (roots / "run" / "uploads").exists()
    # only what is missing: with the test labels back, only the test images are named
    write_idx_set(partial, "", 12, 5, 10)
    (partial / "t10k-images-idx3-ubyte").unlink()
    r = cli("client", "train", "--profile", "smartphone", "--dataset", "fmnist", "--data-dir",
            str(partial), "--num-clients", "2", "--out", str(roots / "one"))  # fmt: skip
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "t10k-images-idx3-ubyte" in said, said
    assert "t10k-labels" not in said and "train-images" not in said, said
    said = " ".join(cli("data", "list", "--data-dir", str(partial)).output.split())
    assert "no: --data-dir lacks t10k-images-idx3-ubyte" in said, said
    write_idx_set(partial, "", 12, 5, 10)
    for f in partial.glob("t10k-*"):
        f.unlink()
    uploads = roots / "uploads"
    uploads.mkdir()
    for flags in (["--data-dir", str(partial)], []):  # no flag: the search path, empty here
        r = cli(
            "server", "fuse", str(uploads), "--method", "fedavg",
            *("--eval", "fmnist:test", "--out", str(roots / "g.onnx"), *flags),
        )  # fmt: skip
        assert r.exit_code == 2 and "Traceback" not in r.output, r.output
        said = " ".join(r.output.split())
        assert "fmnist" in said and "ingest" not in said and "accepted" not in said, said
        assert "dataset-fashion-mnist" in said  # the package that provides the files


def test_a_corrupt_test_split_is_said_before_any_work(roots, cli):
    """A truncated test-images file (the files all there) was read only at the evaluation:
    simulate trained every client and fused every method first, server fuse ran its epochs
    (exploratory pass, 2026-12-06)."""
    broken = roots / "broken"
    write_idx_set(broken, "", 12, 5, 10)
    images = broken / "t10k-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:100])
    datasets._load_registered.cache_clear()
    r = cli(
        "simulate",
        *("--dataset", "fmnist", "--data-dir", str(broken), "--clients", "4"),
        *("--mix", "smartphone:2,wristband:2", "--out", str(roots / "run")),
    )
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "t10k-images-idx3-ubyte" in said and "client 0" not in said, said
    assert not (roots / "run").exists()
    uploads = roots / "uploads"
    uploads.mkdir()
    r = cli("server", "fuse", str(uploads), "--method", "fedavg", "--eval", "fmnist:test",
            "--data-dir", str(broken), "--out", str(roots / "g.onnx"))  # fmt: skip
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "t10k-images-idx3-ubyte" in said, said
    assert "ingest" not in said and "accepted" not in said, said


def test_the_packages_folder_name_is_found_under_every_root(roots, monkeypatch):
    """A copy of /usr/share/datasets/fashion-mnist under ./data, or EDGEFL_DATA_DIR naming a
    folder of packages' datasets, was not found: only fmnist/ was looked for under them."""
    write_idx_set(roots / "data" / "fashion-mnist", "", 7, 3, 10)
    assert len(load_dataset("fmnist")) == 7
    write_idx_set(roots / "shared" / "fashion-mnist", "", 9, 3, 10)
    monkeypatch.setenv(locate.ENV, str(roots / "shared"))
    datasets._load_registered.cache_clear()
    assert locate.find("fmnist") == roots / "shared" and len(load_dataset("fmnist")) == 9


def test_data_list_says_when_a_named_folder_is_not_one(roots, cli, monkeypatch):
    """$EDGEFL_DATA_DIR with a typo was passed over without a word: the datasets read as
    merely not found."""
    monkeypatch.setenv(locate.ENV, str(roots / "typo"))
    r = cli("data", "list")
    said = " ".join(r.output.split())
    assert r.exit_code == 0, said
    assert f"$EDGEFL_DATA_DIR names {roots / 'typo'}, which is not a folder" in said, said
    r = cli("data", "list", "--data-dir", str(roots / "nowhere"))
    assert "--data-dir names" in " ".join(r.output.split())


def test_data_list_says_what_a_named_folder_gives_the_built_in_datasets(roots, cli):
    """A built-in dataset given --data-dir reads that folder or is refused (it fell back to the
    built-in copy without a word): `data list` said "built in" either way."""
    mine = roots / "mine"
    write_idx_set(mine, "", 7, 3, 10)  # MNIST-named IDX files (not a full split: no check)
    rows = {r["name"]: r for r in json.loads(
        cli("data", "list", "--data-dir", str(mine), "--json").output)}  # fmt: skip
    assert rows["mnist"]["found"] and rows["mnist"]["path"] == str(mine)
    assert not rows["digits"]["found"] and not rows["hapt"]["found"]
    lines = cli("data", "list", "--data-dir", str(mine)).output.splitlines()
    digits = next(line for line in lines if " digits " in line)
    assert "no (built in: drop --data-dir)" in digits, lines
    assert len(load_dataset("mnist", data_dir=mine)) == 7  # what the list says is what loads
    with pytest.raises(DataError, match="reads no files"):
        load_dataset("digits", data_dir=mine)
    rows = {r["name"]: r for r in json.loads(cli("data", "list", "--json").output)}
    assert rows["mnist"]["found"] and rows["digits"]["found"]  # no flag: built in


def test_a_data_dir_that_is_no_folder_is_said_as_such(tmp_path, cli):
    """A file (or a typo) as --data-dir was "lacks its files ... install dataset-fashion-mnist",
    with the package already installed (exploratory pass, 2026-12-06)."""
    (tmp_path / "afile").write_text("x")
    for given, says in (
        (tmp_path / "afile", "is a file, not a folder"),
        (tmp_path / "no", "does not exist"),
    ):
        r = cli("client", "train", "--profile", "smartphone", "--dataset", "fmnist",
                "--data-dir", str(given), "--out", str(tmp_path / "up"))  # fmt: skip
        said = " ".join(r.output.split())
        assert r.exit_code == 2 and f"--data-dir {given} {says}" in said, said
        assert "apt-get" not in said and not (tmp_path / "up").exists()


def test_a_public_set_of_a_dataset_from_files_passes_the_checks(roots):
    """The check that reads a registered dataset's files now asked load_dataset for the split
    "public" (which it carves from train): every public-set method on Fashion was refused
    (review, 2026-12-06)."""
    from types import SimpleNamespace

    from edgefl.server.plan import check_inputs

    write_idx_set(roots / "fm", "", 12, 5, 10)
    public = SimpleNamespace(
        config=SimpleNamespace(public_args=lambda: {"ref": "fmnist:public"}),
        method=SimpleNamespace(public_data=True, name="fedol"),
    )
    check_inputs([public], "fmnist:test", str(roots / "fm"))
