"""Options that act only with another one (or not with it), refused where they were accepted and
changed nothing (fifth sweep, 2026-12-05): exit 2, one message, before any work."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["reproduce", "--budget", "paper"], "--budget applies with a TABLE only"),
        (["reproduce", "--seeds", "0", "--json"], "--seeds applies with a TABLE only"),
        (["server", "fuse", "up", "--method", "fedavg", "--for-epochs", "3"],
         "--for-epochs applies with --for only"),
        (["server", "fuse", "up", "--method", "fedavg", "--for-max-macs", "9"],
         "--for-max-macs applies with --for only"),
        (["server", "fuse", "up", "--method", "fedavg", "--data-dir", "/nonexistent"],
         "--data-dir applies with --eval or a method that reads public data only"),
        (["server", "fuse", "up", "--method", "fedavg", "--for", "wristband", "--data-dir", "d"],
         "--data-dir applies with --eval or a method that reads public data only"),
        (["simulate", "--dataset", "digits", "--for-samples", "5"],
         "--for-samples applies with --for only"),
        (["simulate", "--dataset", "digits", "--paper-classifier", "vgg9"],
         "--paper-classifier applies with --paper-models only"),
        (["simulate", "--dataset", "digits", "--paper-models", "--max-classifier-macs", "5"],
         "--max-classifier-macs caps the budget-true classifiers"),
        (["search", "--profile", "smartphone", "--overwrite"], "--overwrite applies with --save"),
        (["search", "--profile", "smartphone", "--top", "3", "--json"],
         "--top sizes the candidate table, which --json does not print"),
        (["search", "--profile", "smartphone", "--top", "3", "-q"], "which -q does not print"),
        (["simulate", "--dataset", "digits", "--clients", "2", "--mix", "smartphone:2",
          "--generator-epochs", "7"], "--generator-epochs sets how the CVAE clients train"),
        (["simulate", "--dataset", "digits", "--clients", "2", "--mix", "wristband:2",
          "--classifier-batch-size", "8"], "no client of --mix wristband:2 trains a classifier"),
        (["simulate", "--dataset", "digits", "--clients", "2", "--mix", "smartphone:1,wristband:1",
          "--client-model", "smartphone=cnn", "--client-model", "wristband=cvae-small",
          "--paper-models"], "--client-model names every device class of --mix"),
        (["simulate", "--dataset", "digits", "--clients", "2", "--mix", "smartphone:2",
          "--client-model", "smartphone=cnn", "--max-classifier-macs", "9"],
         "--client-model names every classifier class of --mix smartphone:2"),
        (["data", "partition", "-d", "digits", "--scheme", "iid", "--partition", "iid"],
         "--scheme is --partition's old name"),
    ],
)  # fmt: skip
def test_an_option_that_would_be_passed_over_is_refused(cli, tmp_path, args, message):
    args = [str(tmp_path / a) if a == "up" else a for a in args]  # no such folder: never read
    r = cli(*args)
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output


MINE = "mine.npz"  # a user's dataset, read from its own path (never reached: refused first)
USER_DATA = "--data-dir acts on a registered dataset only"


@pytest.mark.parametrize(
    "args",
    [
        ["client", "train", "--profile", "smartphone", "--dataset", MINE],
        ["client", "predict", "--profile", "smartphone", "--dataset", MINE, "--public", MINE],
        ["client", "prototypes", "--profile", "smartphone", "--dataset", MINE],
        ["search", "--profile", "smartphone", "--dataset", MINE],
        ["simulate", "--dataset", MINE],
        ["eval", "m.onnx", "--dataset", MINE],
        ["deploy", "m.onnx", "--profile", "smartphone", "--target", "onnx", "--out", "o",
         "--eval", MINE],
        ["audit", "m.onnx", "--dataset", MINE],
        ["data", "partition", "-d", MINE],
        ["server", "fuse", "up", "--method", "fedavg", "--eval", MINE],
    ],
)  # fmt: skip
def test_data_dir_with_only_a_users_own_dataset_is_refused(cli, tmp_path, args):
    """--data-dir locates a registered dataset's files; given with a user's .npz or folder
    alone, it was passed over (every command that takes it, before any file is read)."""
    args = [str(tmp_path / a) if a in ("up", MINE, "m.onnx", "o") else a for a in args]
    r = cli(*args, "--data-dir", str(tmp_path / "d"))
    assert r.exit_code == 2, r.output
    assert USER_DATA in " ".join(r.output.split()), r.output
    assert "drop --data-dir" in r.output and "Traceback" not in r.output


def test_download_with_a_users_own_dataset_and_deploy_data_dir_alone_are_refused(cli, tmp_path):
    r = cli("data", "partition", "-d", str(tmp_path / MINE), "--download")
    assert r.exit_code == 2 and "--download acts on a registered dataset only" in r.output
    r = cli("deploy", str(tmp_path / "m.onnx"), "--profile", "smartphone", "--target", "onnx",
            "--out", str(tmp_path / "o"), "--data-dir", str(tmp_path))  # fmt: skip
    assert r.exit_code == 2, r.output
    assert "--data-dir applies with --calibrate or --eval only" in " ".join(r.output.split())


def test_the_same_options_with_what_they_act_on_still_run(cli):
    assert cli("reproduce", "--json").exit_code == 0  # listing the tables
    r = cli("data", "partition", "-d", "digits", "-k", "2", "--scheme", "iid", "--json")
    assert r.exit_code == 0 and '"scheme": "iid"' in r.output, r.output  # the old name alone
