"""A wristband's own task end to end (issue 20): the hapt dataset's users as clients, 1-D models
that the planner fits to each device, the whole path from `client train` to `simulate`, and a
window classified on the device with onnxruntime only. The reader itself: test_hapt_data.py."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from reported import onnx_accuracy

from edgefl.client.run import ClientJob, client_shard
from edgefl.data import carve_public, load_dataset, partition
from edgefl.data.hapt import TEST_USERS, find_hapt_pickle
from edgefl.data.public import load_public
from edgefl.data.registry import dataset_info
from edgefl.errors import ConfigError
from edgefl.models.cost import costs
from edgefl.models.plan import plan
from edgefl.models.zoo import make_spec
from edgefl.profiles import get_profile

pytestmark = pytest.mark.skipif(
    find_hapt_pickle() is None,
    reason="the HAPT data package is not installed (make setup installs it)",
)
ROOT = Path(__file__).resolve().parents[2]


def test_user_partition_gives_each_client_exactly_its_users_windows():
    ds = load_dataset("hapt")
    users = sorted(set(ds.groups.tolist()))
    assert len(users) == 21 and not set(users) & set(TEST_USERS)
    parts = partition(ds.y, len(users), "user", 0, num_classes=6, groups=ds.groups)
    for u, idx in zip(users, parts, strict=True):
        assert np.array_equal(idx, np.flatnonzero(ds.groups == u))
    # Any subset of users, in the order named; the count must match and every user exist.
    parts = partition(ds.y, 2, "user:5,1", 0, num_classes=6, groups=ds.groups)
    assert set(ds.groups[parts[0]]) == {5} and set(ds.groups[parts[1]]) == {1}
    with pytest.raises(ConfigError, match="makes 2 clients"):
        partition(ds.y, 3, "user:5,1", 0, num_classes=6, groups=ds.groups)
    with pytest.raises(ConfigError, match=r"user\(s\) \[2\]"):  # a test user is not in train
        partition(ds.y, 2, "user:1,2", 0, num_classes=6, groups=ds.groups)
    with pytest.raises(ConfigError, match="whose each sample is"):
        partition(load_dataset("digits").y, 2, "user", 0)
    # A client's shard carries its user ids along.
    assert set(ds.subset(parts[0]).groups) == {5}


def test_fewer_clients_than_users_draw_whole_users_seeded_and_named(cli, tmp_path):
    ds = load_dataset("hapt")
    users = sorted(set(ds.groups.tolist()))
    parts = partition(ds.y, 5, "user", 3, num_classes=6, groups=ds.groups)
    drawn = [sorted(set(ds.groups[p].tolist())) for p in parts]
    assert all(len(d) == 1 for d in drawn)  # each client: one whole user
    drawn = [d[0] for d in drawn]
    assert drawn == sorted(drawn) and set(drawn) <= set(users) and len(set(drawn)) == 5
    for u, idx in zip(drawn, parts, strict=True):
        assert np.array_equal(idx, np.flatnonzero(ds.groups == u))
    again = partition(ds.y, 5, "user", 3, num_classes=6, groups=ds.groups)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))  # seeded
    other = partition(ds.y, 5, "user", 4, num_classes=6, groups=ds.groups)
    assert [set(ds.groups[p].tolist()) for p in other] != [{u} for u in drawn]
    with pytest.raises(ConfigError, match="makes 21 clients"):  # more clients than users
        partition(ds.y, 22, "user", 0, num_classes=6, groups=ds.groups)
    # The output names whom each client holds.
    r = cli(
        "data",
        "partition",
        "--dataset",
        "hapt",
        "--partition",
        "user",
        "-k",
        "5",
        "--seed",
        "3",
        "--json",
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["users"] == drawn
    job = ClientJob(
        profile="wristband",
        dataset="hapt",
        partition="user",
        num_clients=5,
        client_index=2,
        partition_seed=3,
    )
    assert set(ds.groups[client_shard(job, ds)].tolist()) == {drawn[2]}


def test_the_public_set_is_held_out_users_the_same_on_both_sides():
    ds = load_dataset("hapt")
    _, pub = carve_public(len(ds), 800, 0, ds.groups)
    public_users = set(ds.groups[pub].tolist())
    assert 2 <= len(public_users) <= 3  # 300-500 windows a user: whole users, at least 800
    assert np.array_equal(load_public("hapt:public", public_size=800, seed=0), ds.x[pub])
    left = sorted(set(ds.groups.tolist()) - public_users)
    job = ClientJob("smartphone", "hapt", partition="user", num_clients=len(left), public_size=800)
    for k, user in enumerate(left):  # every other user is one client, with all its windows
        idx = client_shard(replace(job, client_index=k), ds)
        assert np.array_equal(idx, np.flatnonzero(ds.groups == user))
    # Users the clients are named as never become public, on the clients' side or the server's.
    named = ",".join(map(str, sorted(public_users)))
    x = load_public("hapt:public", public_size=800, seed=0, partition=f"user:{named}")
    _, pub2 = carve_public(len(ds), 800, 0, ds.groups, f"user:{named}")
    assert np.array_equal(x, ds.x[pub2]) and not public_users & set(ds.groups[pub2].tolist())
    named_job = replace(job, partition=f"user:{named}", num_clients=len(public_users))
    assert set(ds.groups[client_shard(named_job, ds)].tolist()) == {min(public_users)}


def test_the_planner_fits_each_device_with_a_1d_model_and_says_why():
    info = dataset_info("hapt")
    band = plan(get_profile("wristband"), info, samples=400)
    assert band.role == "generator" and "cnn1d" in band.role_reason and band.fit.fits
    assert band.spec.name in ("cvae-mlp", "cvae1d")
    phone = plan(get_profile("smartphone"), info, samples=400)
    assert phone.role == "classifier" and phone.spec.name == "cnn1d" and phone.fit.fits
    # Exact cost accounting holds for the (1, k) convolutions: a hand count of cnn1d.
    spec = make_spec("cnn1d", (3, 1, 128), 6, width=4, depth=2, kernel=5)
    conv = (3 * 4 * 5 + 4) + (4 * 8 * 5 + 8)
    head = 8 * 32 * 6 + 6  # 8 channels x 128/4 samples
    assert costs(spec).params == conv + head
    assert costs(spec).macs == 128 * 4 * 3 * 5 + 64 * 8 * 4 * 5 + 8 * 32 * 6


def test_an_image_model_on_sensor_windows_is_one_message_before_any_work(cli, tmp_path):
    r = cli(
        "client",
        "train",
        "--profile",
        "smartphone",
        "--dataset",
        "hapt",
        "--model",
        "cnn",
        "--partition",
        "user",
        "--num-clients",
        "21",
        "--out",
        str(tmp_path / "up"),
    )
    assert r.exit_code == 2 and "models for signals: cnn1d" in r.output
    assert not (tmp_path / "up").exists()
    r = cli(
        "client",
        "train",
        "--profile",
        "smartphone",
        "--dataset",
        "hapt",
        "--augment",
        "affine",
        "--partition",
        "user",
        "--num-clients",
        "21",
        "--out",
        str(tmp_path / "up"),
    )
    assert r.exit_code == 2 and "for images" in r.output and "Traceback" not in r.output


@pytest.mark.slow
def test_users_as_clients_end_to_end_and_a_window_on_the_device(cli, tmp_path):
    out = tmp_path / "sim"
    r = cli(
        "simulate",
        "--dataset",
        "hapt",
        "--partition",
        "user:1,3,5,6",
        "--clients",
        "4",
        "--mix",
        "wristband:2,smartphone:2",
        "--classifier-epochs",
        "2",
        "--generator-epochs",
        "2",
        "--jobs",
        "2",
        "--methods",
        "fedavg,ensemble,fedmho-sd,fedcvae-ens,feddf",
        "--public-size",
        "300",
        "--fuse-opt",
        "feddf:epochs=2",
        "--fuse-opt",
        "fedmho-sd:epochs=2",
        "--fuse-opt",
        "fedmho-sd:synthetic=300",
        "--fuse-opt",
        "fedcvae-ens:epochs=2",
        "--fuse-opt",
        "fedcvae-ens:synthetic=300",
        "--out",
        str(out),
        "--json",
        "--quiet",
    )
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    models = {c["client_id"]: c["model"] for c in report["clients"]}
    assert models["client-000"].startswith(("cvae-mlp", "cvae1d"))
    assert models["client-002"].startswith("cnn1d")
    acc = {x["method"]: x["accuracy"] for x in report["results"]}
    assert set(acc) == {"fedavg", "ensemble", "fedmho-sd", "fedcvae-ens", "feddf"}
    for method, a in acc.items():  # the number reported is the exported file's, on test users
        assert abs(a - onnx_accuracy(out / "global" / f"{method}.onnx", "hapt:test")) < 2e-3, method
    assert (out / "samples_client-000.png").stat().st_size > 0  # generated windows, drawn
    # FedDF distilled on windows of users none of the four clients is.
    feddf = json.loads((out / "global" / "feddf.json").read_text())["config"]
    assert feddf["public_partition"] == "user:1,3,5,6" and feddf["public_size"] == 300
    # The server and eval commands on their own, over the same uploads.
    r = cli(
        "server",
        "fuse",
        str(out / "uploads"),
        "--method",
        "ensemble",
        "--out",
        str(tmp_path / "g.onnx"),
        "--eval",
        "hapt:test",
        "--json",
    )
    assert r.exit_code == 0, r.output
    assert abs(json.loads(r.stdout)["accuracy"] - acc["ensemble"]) <= 1e-6
    r = cli("eval", str(tmp_path / "g.onnx"), "--dataset", "hapt:test", "--json")
    assert r.exit_code == 0 and abs(json.loads(r.stdout)["accuracy"] - acc["ensemble"]) <= 1e-6
    # The device: one window in sensor units (g), classified with onnxruntime only.
    test = load_dataset("hapt:test")
    window = test.x[0, :, 0, :].T * 4.0 - 2.0  # back from [0, 1] to g
    csv = tmp_path / "window.csv"
    np.savetxt(csv, window, delimiter=",", header="ax,ay,az", comments="")
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples/har_window.py"),
            str(out / "global" / "fedavg.onnx"),
            str(csv),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 6 and lines[0].split()[0] in ("walking", "sitting", "standing", "lying")
    import exporters

    logits = exporters.read_artifact(out / "global" / "fedavg.onnx").run(test.x[:1])
    top = test.class_names[int(np.argmax(logits))]
    assert lines[0].startswith(top), (lines, top)


def test_rotation_turns_each_window_as_a_device_turns():
    import torch

    from edgefl.models.augment import jitter, resolve, rotate_windows

    gen = torch.Generator().manual_seed(0)
    # 6 channels: the accelerometer and the gyroscope under one rotation (and no gain).
    x = torch.rand(5, 6, 1, 128) * 0.2 + 0.4
    y = rotate_windows(x, gen, degrees=30.0, gain=0.0, shift=False)  # time: test_align.py
    acc = lambda t: t[:, :3, 0] * 4 - 2  # noqa: E731 (back to g)
    gyro = lambda t: t[:, 3:, 0] * 8 - 4  # noqa: E731 (back to rad/s)
    assert torch.allclose(acc(y).norm(dim=1), acc(x).norm(dim=1), atol=1e-5)  # lengths kept
    assert not torch.allclose(acc(y), acc(x), atol=1e-3)
    # The rotation that maps the accelerometer also maps the gyroscope, window by window.
    for i in range(5):
        rot = torch.linalg.lstsq(acc(x)[i].T, acc(y)[i].T).solution.T
        assert torch.allclose(rot @ gyro(x)[i], gyro(y)[i], atol=1e-4)
    # Seeded: the same draw twice; "none" leaves a batch alone; each kind its own jitter.
    a = jitter(x, "auto", torch.Generator().manual_seed(3))
    assert torch.equal(a, jitter(x, "rotate", torch.Generator().manual_seed(3)))
    assert jitter(x, "none", gen) is x
    assert resolve("auto", (1, 28, 28)) == "affine" and resolve("auto", (3, 1, 128)) == "rotate"
    with pytest.raises(ConfigError, match="for images"):
        resolve("affine", (3, 1, 128))
