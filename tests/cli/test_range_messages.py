"""Every range check outside the option tables says which way to move (issue 55, item 5): a
value just below a range is told to raise it, one just above to lower it, and never the other
way. Each refusal is reached through the command or function a user meets, with nothing
trained and no dataset bigger than sklearn's digits read; and a fusion refused for want of
uploads names those the robust screen set aside."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import exporters
from edgefl.artifacts import Upload
from edgefl.bounds import LOWER, RAISE
from edgefl.cli import app
from edgefl.client.run import ClientJob, client_shard
from edgefl.data import load_dataset
from edgefl.data.datasets import ArrayDataset
from edgefl.data.public import load_public
from edgefl.errors import ConfigError, FusionError
from edgefl.fusion import METHODS
from edgefl.models.spec import ModelSpec
from edgefl.server import fuse as fuse_mod
from edgefl.server.ingest import ingest, resident_limit
from edgefl.server.selection import Used


def _says(text: str, move: str) -> None:
    """`text` ends its first line in `move` and nowhere advises the other way."""
    first = text.strip().splitlines()[0]
    assert first.endswith(move), text
    assert (LOWER if move == RAISE else RAISE) not in text, text


def _cli(args: list[str], start: str, move: str) -> None:
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output, r.output
    text = r.output[r.output.index("error: ") + len("error: ") :]
    assert text.startswith(start), text
    _says(text, move)


def _refused(make, start: str, move: str) -> None:
    with pytest.raises(ConfigError) as err:
        make()
    assert err.value.message.startswith(start), err.value.message
    _says(str(err.value), move)


# --- through the commands --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (["simulate", "--clients", "0"], "--clients must be an integer >= 1, got 0"),
        (["simulate", "--jobs", "0"], "--jobs must be an integer >= 1, got 0"),
        (
            ["simulate", "--classifier-batch-size", "0"],
            "--classifier-batch-size must be an integer >= 1",
        ),
        (
            ["simulate", "--generator-batch-size", "-1"],
            "--generator-batch-size must be an integer >= 1",
        ),
        (["simulate", "--classifier-lr", "0"], "--classifier-lr must be in (0, 1000000]"),
        (["simulate", "--generator-lr", "-0.1"], "--generator-lr must be in (0, 1000000]"),
        (["simulate", "--classifier-epochs", "0"], "--classifier-epochs must be > 0"),
        (["simulate", "--generator-epochs", "0"], "--generator-epochs must be > 0"),
        (["reproduce", "fedmho-table3", "--jobs", "0"], "--jobs must be an integer >= 1, got 0"),
        (
            ["reproduce", "fedmho-table3", "--seeds", "0,-1"],
            "--seeds must be an integer in 0..9223372036854775807",
        ),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else None,
)
def test_simulate_and_reproduce_numbers_below_range_are_told_to_raise(tmp_path, args, start):
    _cli([*args, "--out", str(tmp_path / "out")], start, RAISE)
    assert not (tmp_path / "out" / "uploads").exists()


@pytest.mark.parametrize(
    ("flags", "start"),
    [
        (["--jobs", "0"], "--jobs must be an integer >= 1, got 0"),
        (["--resident-mib", "-1"], "--resident-mib must be >= 0, got -1"),
        (
            ["--for", "wristband", "--for-epochs", "0"],
            "--for-epochs must be an integer >= 1, got 0",
        ),
        (
            ["--for", "wristband", "--for-samples", "0"],
            "--for-samples must be an integer >= 1, got 0",
        ),
        (
            ["--for", "wristband", "--for-max-macs", "0"],
            "--for-max-macs must be an integer >= 1, got 0",
        ),
        # every upload was read, then rejected as over a limit of 0 bytes
        (["--max-upload-bytes", "0"], "--max-upload-bytes must be >= 1, got 0"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else None,
)
def test_server_fuse_numbers_below_range_are_told_to_raise(tmp_path, flags, start):
    (tmp_path / "up").mkdir()
    args = ["server", "fuse", str(tmp_path / "up"), "--method", "fedavg"]
    _cli([*args, *flags, "--out", str(tmp_path / "g.onnx")], start, RAISE)
    assert not (tmp_path / "g.onnx").exists()


@pytest.mark.parametrize(
    "flags, start",
    [
        (["--method", "fedavg", "--seed", str(2**64)], "--seed must be an integer in [0, "),
        (["--method", "fedmho-md", "--synthetic", str(10**14)], "--synthetic must be an integer"),
        (["--method", "fedcvae-ens", "--opt", "synthetic=2000000"], "--synthetic must be an"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else None,
)
def test_server_fuse_numbers_past_range_are_told_to_lower(tmp_path, flags, start):
    """A seed past 64 bits overflowed inside torch, and a synthetic count of 10^14 failed in
    numpy's allocator, both after every upload was read: bounds now, before the ingest."""
    (tmp_path / "up").mkdir()  # empty: the refusal comes before the folder is read
    _cli(["server", "fuse", str(tmp_path / "up"), *flags, "--out", str(tmp_path / "g.onnx")],
         start, LOWER)  # fmt: skip


# --- through the functions behind them -------------------------------------------------------


def test_ingest_jobs_and_resident_limit_below_range_are_told_to_raise(tmp_path):
    _refused(lambda: ingest(tmp_path, max_upload_bytes=2**20, jobs=0), "--jobs must be", RAISE)
    _refused(lambda: resident_limit(-1), "--resident-mib must be >= 0, got -1", RAISE)
    _refused(lambda: resident_limit(-1, "resident-mib"), "resident-mib must be >= 0", RAISE)
    assert resident_limit(0) == 0


def test_model_spec_with_one_class_is_told_to_raise():
    _refused(lambda: ModelSpec("cnn", (1, 8, 8), 1), "num_classes must be >= 2, got 1", RAISE)
    assert ModelSpec("cnn", (1, 8, 8), 2).num_classes == 2


def _tiny(n: int = 10) -> ArrayDataset:
    rng = np.random.default_rng(0)
    return ArrayDataset(rng.random((n, 1, 4, 4)), np.arange(n) % 2, ("a", "b"), "tiny")


@pytest.mark.parametrize("subset", [0, -2])
def test_client_subset_below_one_is_refused_by_the_job(subset):
    _refused(
        lambda: ClientJob(profile="wristband", dataset="tiny", num_clients=1, subset=subset),
        f"--subset must be an integer >= 1, got {subset}",
        RAISE,
    )


def test_client_subset_past_the_data_says_lower_it():
    job = ClientJob(profile="wristband", dataset="tiny", num_clients=1, subset=11)
    _refused(
        lambda: client_shard(job, _tiny()), "--subset must be an integer in 1..10, got 11", LOWER
    )


def test_client_subset_inside_the_data_is_taken():
    job = ClientJob(profile="wristband", dataset="tiny", partition="iid", num_clients=1, subset=10)
    assert len(client_shard(job, _tiny())) == 10


@pytest.mark.parametrize("move", [RAISE, LOWER])
def test_public_subset_outside_the_data_says_which_way(move):
    n = len(load_dataset("digits", "train"))
    subset = 0 if move == RAISE else n + 1
    _refused(
        lambda: load_public("digits:public", public_size=10, subset=subset),
        f"--subset must be an integer in 1..{n}, got {subset}",
        move,
    )


def test_carved_public_set_of_no_samples_is_told_to_raise():
    with pytest.raises(ConfigError) as err:
        load_public("digits:public", public_size=0)
    assert "--public-size must be >= 1, got 0: raise it" in err.value.message
    _says(str(err.value), RAISE)


# --- a fusion short of uploads names those the robust screen set aside -----------------------


def _upload(name: str, kind: str) -> Upload:
    meta = {"kind": kind, "client_id": name, "input_shape": [1, 8, 8], "num_classes": 10}
    art = exporters.Artifact(
        path=f"{name}.onnx",
        size_bytes=0,
        model=None,
        input_names=[],
        output_names=[],
        metadata=meta,
    )
    return Upload(art, torch.nn.Identity())


def test_too_few_uploads_names_those_the_screen_set_aside(monkeypatch):
    # The screen's verdict is stubbed (`uses`: two classifiers screened out, a decoder kept):
    # a real one needs trained uploads. FedAvg's own `require` refuses, as it would.
    decoder = _upload("client-002", "decoder")
    screened = [
        {
            "file": f"client-00{i}.onnx",
            "client_id": f"client-00{i}",
            "kind": "classifier",
            "reason": "agrees with no one",
        }
        for i in (0, 1)
    ]
    used = Used([decoder], [], screened)
    # fuse._fuse_planned looks `uses` up in its own module
    monkeypatch.setattr(fuse_mod, "uses", lambda p, run: used)
    p = SimpleNamespace(method=METHODS.get("fedavg"), config=SimpleNamespace(seed=0))
    found = SimpleNamespace(rejected=[], folders=[], uploads=[decoder])
    run = SimpleNamespace(
        found=found, device=torch.device("cpu"), log=lambda m: None, progress=None
    )
    with pytest.raises(FusionError) as err:
        fuse_mod._fuse_planned(p, run)
    lines = err.value.message.splitlines()
    assert lines[0] == "fedavg needs at least 1 classifier upload(s), got 0", lines
    for i in (0, 1):
        assert (
            f"  set aside by --robust screen client-00{i}.onnx (classifier): agrees with no one"
            in lines
        ), lines
