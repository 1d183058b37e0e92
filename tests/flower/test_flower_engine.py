"""`simulate --engine flower` on Flower's simulation engine (Ray) against the local engine: the
same uploads, weight for weight, and the same accuracies; resumable (issue 17)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")

import onnx  # noqa: E402
from onnx import numpy_helper  # noqa: E402

from edgefl.flower import engine  # noqa: E402
from edgefl.flower.engine import train_clients_flower  # noqa: E402
from edgefl.flower.resources import client_resources, plan_groups  # noqa: E402
from edgefl.simulate.job import SimJob  # noqa: E402
from edgefl.simulate.run import client_jobs, simulate  # noqa: E402

FAST = {"fedmho-sd": {"epochs": 2, "synthetic": 300}, "fedol": {"epochs": 1, "rounds": 2}}


def job(out) -> SimJob:
    # Classifiers, a CVAE and a predictions client (FedOL: predictions sent, model kept).
    return SimJob(
        dataset="digits",
        clients=3,
        mix="smartphone:2,wristband:1",
        partition="dirichlet:1.0",
        out=str(out),
        paper_models=True,
        classifier_epochs=2,
        generator_epochs=2,
        jobs=2,
        public_size=300,
        methods=("fedavg", "fedmho-sd", "fedol"),
        fuse_options=FAST,
    )


def weights(path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.slow
def test_flower_engine_gives_the_local_engines_uploads_and_accuracies(tmp_path, cli, monkeypatch):
    local = simulate(job(tmp_path / "local"))
    # Memory for two of the lighter clients and one of the heavier: each kind gets its own
    # Flower run with its own number at a time, and nothing else changes.
    cjobs = client_jobs(job(tmp_path / "flower"))
    need = {c.profile: client_resources(c, gpu=False).memory_bytes for c in cjobs}
    assert len(set(need.values())) == 2, need
    monkeypatch.setattr(engine, "available_memory", lambda: 2 * min(need.values()))
    # One SuperNode for each run: the light kind's clients then take turns on it.
    monkeypatch.setattr(engine, "worker_nodes", lambda clients, at_once: 1)
    flower = simulate(job(tmp_path / "flower"), trainer=train_clients_flower)
    light = min(need, key=need.get)
    for c in flower["clients"]:
        res = c["host_resources"]
        assert res["memory_bytes"] == need[res["profile"]]
        assert res["at_once"] == (2 if res["profile"] == light else 1), res
    for folder in ("uploads", "uploads-predictions"):
        names = sorted(p.name for p in (tmp_path / "local" / folder).glob("*.onnx"))
        assert names and names == sorted(
            p.name for p in (tmp_path / "flower" / folder).glob("*.onnx")
        )
        for name in names:
            a = weights(tmp_path / "local" / folder / name)
            b = weights(tmp_path / "flower" / folder / name)
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), name
    acc = {r["method"]: r["accuracy"] for r in local["results"]}
    assert acc and all(v is not None for v in acc.values())
    for r in flower["results"]:
        assert abs(r["accuracy"] - acc[r["method"]]) <= 1e-6, (r, acc)
    assert [c["client_id"] for c in flower["clients"]] == [c["client_id"] for c in local["clients"]]
    assert (local["engine"], flower["engine"]) == ("local", "flower")

    # Resumed through the CLI: every upload is reused, no client is trained again.
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "flower").rglob("client-*.onnx")}
    r = cli(
        "simulate",
        "--engine",
        "flower",
        "--dataset",
        "digits",
        "--clients",
        "3",
        "--mix",
        "smartphone:2,wristband:1",
        "--partition",
        "dirichlet:1.0",
        "--paper-models",
        "--classifier-epochs",
        "2",
        "--generator-epochs",
        "2",
        "--jobs",
        "2",
        "--methods",
        "fedavg,fedmho-sd,fedol",
        "--fuse-opt",
        "fedmho-sd:epochs=2",
        "--fuse-opt",
        "fedmho-sd:synthetic=300",
        "--fuse-opt",
        "fedol:epochs=1",
        "--fuse-opt",
        "fedol:rounds=2",
        "--public-size",
        "300",
        "--out",
        str(tmp_path / "flower"),
        "--json",
        "--quiet",
    )
    assert r.exit_code == 0, r.output
    assert all(c["reused"] for c in json.loads(r.stdout)["clients"])
    assert {p: p.stat().st_mtime_ns for p in before} == before


def test_an_unknown_engine_is_one_message_before_any_work(cli, tmp_path):
    r = cli("simulate", "--engine", "spark", "--out", str(tmp_path / "x"))
    assert r.exit_code == 2 and "--engine must be local or flower" in r.output
    assert not (tmp_path / "x").exists()


def test_each_kind_of_client_runs_as_many_at_once_as_memory_and_jobs_allow():
    from edgefl.flower.resources import ClientResources

    def need(profile, mib, gpus=0.0):
        return ClientResources(profile, "m", 1, gpus, mib << 20)

    needs = [need("phone", 3000), need("band", 700), need("phone", 3000), need("band", 700)]
    groups = plan_groups(needs, jobs=4, memory=8000 << 20)
    assert [(g.clients, g.at_once) for g in groups] == [((0, 2), 2), ((1, 3), 4)]
    # Plenty of memory: one run for all, --jobs at a time.
    assert [(g.clients, g.at_once) for g in plan_groups(needs, 2, 1 << 40)] == [((0, 1, 2, 3), 2)]
    # Too little for even one: still one at a time (the user asked for it), never zero.
    assert [g.at_once for g in plan_groups(needs, 2, 1 << 20)] == [1]
    # On a GPU the clients of a run share it in equal parts.
    (g,) = plan_groups([need("jetson", 100, 1.0)] * 3, jobs=3, memory=1 << 40)
    assert (g.at_once, g.num_gpus) == (3, 1 / 3)
