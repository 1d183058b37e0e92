"""Poisoned clients and the output-space screen against them (issue 18): each attack yields a
valid upload whose content is poisoned as its name says; the run records who attacked and the
uploads do not; `--robust screen` leaves out exactly the attackers and says why."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest

import exporters
from edgefl.client.attacks import ATTACKS, SCALE, SWAP, assign, derangement, parse_attacks
from edgefl.client.job import ClientJob, SimSettings
from edgefl.client.run import run_client
from edgefl.data import load_dataset
from edgefl.errors import ConfigError, UnknownNameError


def test_attack_kinds_parse_and_go_to_the_first_clients_they_apply_to():
    assert parse_attacks("flip:2, noise:1,flip:1") == {"flip": 3, "noise": 1}
    with pytest.raises(UnknownNameError):
        parse_attacks("flipp:2")
    for bad in ("flip", "flip:0", "flip:x"):
        with pytest.raises(ConfigError, match="KIND:COUNT"):
            parse_attacks(bad)
    roles = ["classifier", "classifier", "generator", "generator", "classifier"]
    assert assign({"noise": 1, "flip": 2, "scale": 1}, roles) == [
        "flip",
        "flip",
        "noise",
        None,
        "scale",
    ]
    with pytest.raises(ConfigError, match="needs 3 clients"):
        assign({"invert": 3}, ["classifier", "classifier", "generator"])
    # A kind that fits both roles can be aimed at one.
    assert parse_attacks("flip@cvae:1") == {"flip@cvae": 1}
    assert assign({"flip@cvae": 1, "flip": 1}, roles) == ["flip", None, "flip", None, None]
    with pytest.raises(ConfigError, match="can be aimed at classifier"):
        parse_attacks("scale@cvae:1")


def test_label_attacks_move_labels_as_named():
    for seed in range(5):
        perm = derangement(10, seed)
        assert sorted(perm) == list(range(10)) and not np.any(perm == np.arange(10))
    y = np.array([0, 1, 2, 1, 0, 5])
    swapped = ATTACKS.get("swap").labels(y, 10, 0)
    assert swapped.tolist() == [SWAP[1], SWAP[0], 2, SWAP[0], SWAP[1], 5]


def _job(tmp_path, **kw) -> ClientJob:
    base = ClientJob(
        profile="smartphone",
        dataset="digits",
        out_dir=str(tmp_path),
        num_clients=4,
        partition="iid",
        model="cnn",
        epochs=30,
        optimizer="adam",
        force=True,
    )
    return replace(base, **kw)


def test_attacked_uploads_are_valid_and_poisoned_as_named(tmp_path):
    test = load_dataset("digits", "test")
    honest = run_client(_job(tmp_path / "honest"))
    logits = exporters.read_artifact(honest.path).run(test.x[:64])
    for kind, expect in (("scale", SCALE * logits), ("invert", -logits)):
        r = run_client(_job(tmp_path / kind, sim=SimSettings(attack=kind)))
        art = exporters.validate_upload(r.path)  # a valid upload, checked as the server does
        assert "attack" not in json.dumps(exporters.get_metadata(art.model))  # no mark of it
        assert np.allclose(exporters.read_artifact(r.path).run(test.x[:64]), expect, atol=1e-3)
    flipped = run_client(_job(tmp_path / "flip", sim=SimSettings(attack="flip")))
    # Its label counts follow its poisoned labels: a permutation of the honest counts.
    assert flipped.label_counts != honest.label_counts
    assert sorted(flipped.label_counts) == sorted(honest.label_counts)

    def acc(path):
        out = exporters.read_artifact(path).run(test.x)
        return float((out.argmax(1) == test.y).mean())

    assert acc(honest.path) > 0.7 and acc(flipped.path) < 0.3
    rand = run_client(_job(tmp_path / "random", sim=SimSettings(attack="random")))
    assert acc(rand.path) < 0.3
    # The run says what an attacker's upload does on the true labels; its header claims what
    # its training measured (on its own, poisoned labels), as a compromised device's would.
    for r in (flipped, rand):
        assert r.upload_val_accuracy < 0.3 < 0.7 < r.summary.val_accuracy
        assert r.as_dict()["upload_val_accuracy"] == r.upload_val_accuracy
    assert honest.upload_val_accuracy is None and "upload_val_accuracy" not in honest.as_dict()
    with pytest.raises(ConfigError, match="does not apply to a classifier"):
        run_client(_job(tmp_path / "bad", sim=SimSettings(attack="noise")))


def test_the_run_names_its_attackers_and_the_screen_leaves_them_out(cli, tmp_path):
    out = tmp_path / "sim"
    args = [
        "simulate",
        "--dataset",
        "digits",
        "--clients",
        "9",
        "--mix",
        "smartphone:6,wristband:3",
        "--partition",
        "iid",
        "--classifier-epochs",
        "30",
        "--classifier-optimizer",
        "adam",
        "--generator-epochs",
        "30",
        "--generator-optimizer",
        "adam",
        "--methods",
        "ensemble,fedmho",
        "--fuse-opt",
        "fedmho:epochs=1",
        "--fuse-opt",
        "fedmho:synthetic=300",
        "--fuse-opt",
        "all:robust=screen",
        "--out",
        str(out),
        "--json",
        "--quiet",
    ]
    r = cli(*args, "--attack", "random:1,invert:1,flip:1,scale:1,noise:1")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    attack = {c["client_id"]: c["attack"] for c in report["clients"]}
    named = {
        "client-000": "random",
        "client-001": "invert",
        "client-002": "flip",
        "client-003": "scale",
        "client-006": "noise",
    }
    assert attack == named | {f"client-{i:03d}": None for i in (4, 5, 7, 8)}
    assert json.loads((out / "attackers.json").read_text()) == named
    real = {c["client_id"]: c.get("upload_val_accuracy") for c in report["clients"]}
    assert all(real[c] is not None for c in named if c != "client-006")  # classifiers
    assert real["client-000"] < 0.3 and real["client-004"] is None  # random weights; honest
    assert "| client-000 (random attacker) |" in (out / "results.md").read_text()
    assert " (claims " in (out / "results.md").read_text()
    # Resumed, the reused uploads are reported alike (the header alone would say the claim).
    again = cli(*args, "--attack", "random:1,invert:1,flip:1,scale:1,noise:1")
    assert again.exit_code == 0, again.output
    reused = json.loads(again.stdout)["clients"]
    assert all(c["reused"] for c in reused)
    assert {c["client_id"]: c.get("upload_val_accuracy") for c in reused} == real
    for method, want in (("ensemble", {"client-000"}), ("fedmho", {"client-000", "client-006"})):
        rep = json.loads((out / "global" / f"{method}.json").read_text())
        assert {s["client_id"] for s in rep["screened"]} == want, rep["screened"]
        assert not want & set(rep["used"])
        notes = rep["robust_notes"]
        # The inverted and the flipped clients are used repaired, the scaled one tempered:
        # what each knows is sound, only how its outputs say it is not.
        assert {"client-001", "client-002", "client-003"} <= set(rep["used"])
        assert any(n.startswith("client-001: outputs repaired (logits negated)") for n in notes)
        assert any(n.startswith("client-002: outputs repaired (classes relabelled") for n in notes)
        assert any(n.startswith("client-003: logits divided by") for n in notes)
        assert not any(n.startswith(("client-000", "client-004", "client-005")) for n in notes)
    # The same uploads without the screen: everyone is used.
    r = cli(
        "server",
        "fuse",
        str(out / "uploads"),
        "--method",
        "ensemble",
        "--out",
        str(tmp_path / "plain.onnx"),
        "--json",
    )
    assert r.exit_code == 0, r.output
    plain = json.loads(r.stdout)
    assert plain["screened"] == [] and plain["robust_notes"] == [] and len(plain["used"]) == 6
    # Without decoders, a method's public set is the probe (FedDF's).
    only = tmp_path / "classifiers"
    only.mkdir()
    for i in range(6):
        shutil.copyfile(out / "uploads" / f"client-{i:03d}.onnx", only / f"client-{i:03d}.onnx")
    r = cli(
        "server",
        "fuse",
        str(only),
        "--method",
        "feddf",
        "--robust",
        "screen",
        "--epochs",
        "1",
        "--public",
        "digits:public",
        "--public-size",
        "300",
        "--out",
        str(tmp_path / "df.onnx"),
        "--json",
    )
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert {s["client_id"] for s in rep["screened"]} == {"client-000"}
    assert {n.split(":")[0] for n in rep["robust_notes"]} == {
        "client-001",
        "client-002",
        "client-003",
    }
    # A rerun in the same folder must ask for the same attackers (uploads carry no mark).
    r = cli(*args, "--attack", "invert:2")
    assert r.exit_code == 2 and "other attackers" in r.output


@pytest.mark.parametrize("name", ATTACKS.names())
def test_attack_contract(name):
    """Every registered attack: a role it applies to, one thing it poisons, and that thing
    poisoned in a valid form (labels in range, pixels in [0, 1], weights still finite)."""
    import torch

    from edgefl.models.parse import parse_model_arg
    from edgefl.models.zoo import build_model

    a = ATTACKS.get(name)
    assert a.description and a.roles and set(a.roles) <= {"classifier", "generator"}
    assert sum(f is not None for f in (a.labels, a.images, a.weights)) == 1
    rng = np.random.default_rng(0)
    if a.labels:
        y = rng.integers(0, 10, 200)
        out = a.labels(y, 10, 0)
        assert out.shape == y.shape and out.min() >= 0 and out.max() < 10 and (out != y).any()
    if a.images:
        x = np.full((5, 1, 8, 8), 0.5, dtype=np.float32)
        out = a.images(x, 0)
        assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1 and (out != x).any()
    if a.weights:
        model = build_model(parse_model_arg("cnn", (1, 8, 8), 10))
        before = [p.detach().clone() for p in model.parameters()]
        a.weights(model, 0)
        after = list(model.parameters())
        assert any(not torch.equal(b, p) for b, p in zip(before, after, strict=True))
        assert all(torch.isfinite(p).all() for p in after)
