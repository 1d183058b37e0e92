"""FedGH's prototypes and FedOL's predictions under --dp (issue 57, item 1): the budget split
over training, prototypes and label counts; the prototypes' bounded contribution (clipped
representations: one sample moves the released sums and C x counts by C sqrt(2) at most); the
Gaussian release's noise spending exactly its share; and through the CLI an upload whose record
the server recomputes to the --dp asked, set aside when its prototypes' part is missing or
understated.

Tiny throughout: digits (8x8), FedGH-CNNs with a 32-d representation, a few epochs.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import exporters
from edgefl.client.privacy import (
    LABEL_SHARE,
    PROTO_CLIP,
    PROTO_SHARE,
    Budget,
    LabelRelease,
    release_prototypes,
    spent,
    split_budget,
)
from edgefl.client.weightless import class_sums
from edgefl.errors import ConfigError
from edgefl.models.zoo import build_model, make_spec
from edgefl.privacy import epsilon

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MODEL = "fedgh-cnn1:fc1=64,representation=32"
COMMON = (
    "--profile", "smartphone", "--dataset", "digits", "--partition", "dirichlet:1.0",
    "--num-clients", "3", "--model", MODEL, "--epochs", "4", "--batch-size", "32", "--quiet",
)  # fmt: skip


def test_the_budget_splits_over_training_prototypes_and_counts():
    alone = split_budget("8,delta=1e-4", "exact", 500, "prototypes")
    assert alone.training.epsilon == pytest.approx(8 * (1 - PROTO_SHARE))
    assert alone.prototypes == pytest.approx((8 * PROTO_SHARE, 5e-5))
    assert alone.training.delta == pytest.approx(5e-5) and alone.labels is None
    three = split_budget("8,delta=3e-4,batch=64", "noised", 500, "prototypes")
    eps = three.training.epsilon + three.labels[0] + three.prototypes[0]
    deltas = three.training.delta + three.labels[1] + three.prototypes[1]
    assert eps == pytest.approx(8) and deltas == pytest.approx(3e-4)
    assert three.labels[0] == pytest.approx(8 * LABEL_SHARE) and three.training.batch == 64
    # a model upload spends nothing on prototypes; without --dp no prototypes part either
    assert split_budget("8", "exact", 500, "model").prototypes is None
    assert split_budget(None, "exact", 500, "prototypes").prototypes is None


def test_one_sample_moves_the_clipped_release_by_at_most_c_sqrt_2():
    torch.manual_seed(0)
    model = build_model(make_spec("fedgh-cnn1", (1, 8, 8), 10, fc1=64, representation=32))
    x = np.random.default_rng(0).random((60, 1, 8, 8), dtype=np.float32) * 1000  # features over C
    y = np.arange(60) % 10
    sums, counts = class_sums(model, x, y, 10, clip=PROTO_CLIP)
    less, fewer = class_sums(model, x[1:], y[1:], 10, clip=PROTO_CLIP)
    moved = math.sqrt(np.sum((sums - less) ** 2) + np.sum((PROTO_CLIP * (counts - fewer)) ** 2))
    assert moved == pytest.approx(PROTO_CLIP * math.sqrt(2))  # one clipped vector and one count
    assert np.linalg.norm(sums, axis=1).max() <= PROTO_CLIP * counts.max() + 1e-6
    raw, _ = class_sums(model, x, y, 10)
    assert np.linalg.norm(raw[y[0]] - class_sums(model, x[1:], y[1:], 10)[0][y[0]]) > 1.5


def test_the_release_spends_its_share_and_keeps_only_classes_above_the_noise():
    budget = Budget(None, LabelRelease("exact"), None, (4.0, 1e-3))
    sums = np.zeros((3, 5))
    # class 0: 4000 vectors of norm C along e0; class 2: none
    sums[0, 0], sums[1, 1] = 4000.0 * PROTO_CLIP, 20.0
    counts = np.array([4000, 20, 0])
    classes, means, stated, record = release_prototypes(
        sums, counts, budget, np.random.default_rng(0)
    )
    assert epsilon(record["noise_multiplier"], 1.0, 1, 1e-3) <= 4.0 * (1 + 1e-5)
    assert record["sensitivity"] == pytest.approx(PROTO_CLIP * math.sqrt(2))
    assert 2 not in classes and classes[0] == 0
    assert abs(stated[0] - 4000) < 20 and np.allclose(means[0], [PROTO_CLIP, 0, 0, 0, 0], atol=0.1)
    tiny = Budget(None, LabelRelease("exact"), None, (0.01, 1e-3))
    with pytest.raises(ConfigError, match="buries every class") as err:
        release_prototypes(sums[1:2], counts[1:2], tiny, np.random.default_rng(0))
    assert "raise --dp's epsilon" in err.value.hint


class _Recorder:
    """A numpy Generator's `normal`, recording the scale each call asked for."""

    def __init__(self, seed: int = 0):
        self.rng, self.scales = np.random.default_rng(seed), []

    def normal(self, loc, scale, size):
        self.scales.append(scale)
        return self.rng.normal(loc, scale, size)


def test_the_noise_added_is_the_one_the_record_states():
    budget = Budget(None, LabelRelease("exact"), None, (4.0, 1e-3))
    sums, counts = np.full((2, 3), 500.0), np.array([100, 100])
    rec = _Recorder()
    *_, record = release_prototypes(sums, counts, budget, rec)
    sigma = record["noise_multiplier"]
    # the smallest noise that spends the part's epsilon: a little less would spend more
    assert epsilon(sigma, 1.0, 1, 1e-3) <= 4.0 * (1 + 1e-5) < epsilon(0.99 * sigma, 1.0, 1, 1e-3)
    assert rec.scales == pytest.approx([sigma * math.sqrt(2) * PROTO_CLIP, sigma * math.sqrt(2)])


def test_the_upload_holds_the_noised_release_replayed_from_its_seed(tmp_path):
    """A simulation's seeded noise: the upload's classes, counts and means are exactly what the
    kept model's clipped sums give through the release, with the prototypes' own stream."""
    from edgefl.artifacts import rebuild
    from edgefl.client.job import SimSettings
    from edgefl.client.run import ClientJob, client_shard, run_client
    from edgefl.data import load_dataset, train_val_split

    job = ClientJob(
        profile="smartphone", dataset="digits", partition="dirichlet:1.0", num_clients=3,
        client_index=1, model=MODEL, epochs=2, batch_size=32, kind="prototypes", dp="8",
        label_counts="absent", sim=SimSettings(noise_seed=3), out_dir=str(tmp_path / "up"), keep_model=str(tmp_path / "local"),
    )  # fmt: skip
    run_client(job)
    data = load_dataset("digits", "train")
    train_idx, _ = train_val_split(client_shard(job, data), 0.1, seed=job.seed + 1)
    model, _ = rebuild(exporters.read_artifact(tmp_path / "local" / "client-001.onnx"))
    sums, counts = class_sums(
        model, data.x[train_idx], data.y[train_idx], data.num_classes, clip=PROTO_CLIP
    )
    budget = split_budget("8", "absent", len(train_idx), "prototypes")
    classes, means, stated, _ = release_prototypes(
        sums, counts, budget, np.random.default_rng([3, 1])
    )
    up = exporters.read_artifact(tmp_path / "up" / "client-001.onnx")
    assert up.metadata["classes"] == classes and up.metadata["counts"] == stated
    assert stated != counts[classes].tolist()  # noised, not the exact counts
    got = exporters.read_constant_outputs(up.model)["prototypes"]
    np.testing.assert_allclose(got, means, rtol=1e-6, atol=1e-6)


def test_prototypes_derived_from_a_kept_model_do_not_inherit_its_release(tmp_path):
    """`derive_upload` writes exact means: a kept model's record of a DP release is dropped, so
    the server counts them not private."""
    from edgefl.client.weightless import derive_upload
    from edgefl.data import load_dataset

    data = load_dataset("digits", "train")
    kept = tmp_path / "local" / "client-001.onnx"
    test_the_upload_holds_the_noised_release_replayed_from_its_seed(tmp_path)
    derive_upload("prototypes", str(kept), data.x[:200], data.y[:200], 10, tmp_path / "d.onnx")
    meta = exporters.read_artifact(tmp_path / "d.onnx").metadata
    assert "prototypes" not in meta["privacy"] and spent(meta).epsilon is None
    assert spent(exporters.read_artifact(kept).metadata).epsilon == pytest.approx(8, rel=1e-4)


@pytest.fixture(scope="module")
def dp_uploads(tmp_path_factory):
    """client-000: prototypes under --dp 8 with counts noised; client-001: FedOL predictions
    under --dp 8 with counts absent (both through the CLI)."""
    from typer.testing import CliRunner

    from edgefl.cli import app

    root = tmp_path_factory.mktemp("dp_protos")
    runner = CliRunner()
    protos = runner.invoke(
        app,
        ["client", "prototypes", *COMMON, "--client-index", "0", "--out", str(root / "up"),
         "--keep-model", str(root / "local"), "--dp", "8", "--label-counts", "noised"],
    )  # fmt: skip
    assert protos.exit_code == 0, protos.output
    pred = runner.invoke(
        app,
        ["client", "predict", "--profile", "smartphone", "--dataset", "digits",
         "--partition", "dirichlet:1.0", "--num-clients", "3", "--client-index", "1",
         "--public", "digits:public", "--public-size", "300", "--model", "cnn", "--epochs", "2",
         "--out", str(root / "up"), "--dp", "8", "--label-counts", "absent", "--quiet"],
    )  # fmt: skip
    assert pred.exit_code == 0, pred.output
    return root


def test_dp_prototypes_record_every_part_and_recompute_to_the_epsilon_asked(dp_uploads):
    meta = exporters.read_artifact(dp_uploads / "up" / "client-000.onnx").metadata
    record = meta["privacy"]
    assert record["prototypes"]["representation"] == "clipped"
    assert record["prototypes"]["clip"] == PROTO_CLIP
    assert record["prototypes"]["epsilon"] == pytest.approx(8 * PROTO_SHARE)
    got = spent(meta)
    assert got.problem is None and got.epsilon == pytest.approx(8, rel=1e-4)
    # the counts stated are the noisy ones, whole and positive, one per class kept
    assert len(meta["counts"]) == len(meta["classes"]) and min(meta["counts"]) >= 1
    kept = exporters.read_artifact(dp_uploads / "local" / "client-000.onnx").metadata
    assert kept["privacy"] == record  # the device's own model states the same spend


def test_dp_predictions_from_the_cli_are_private(dp_uploads):
    meta = exporters.read_artifact(dp_uploads / "up" / "client-001.onnx").metadata
    assert meta["kind"] == "predictions" and "prototypes" not in meta["privacy"]
    got = spent(meta)
    assert got.problem is None and got.epsilon == pytest.approx(8, rel=1e-4)


def _edited(src: Path, dst: Path, edit) -> dict:
    model = onnx.load(str(src))
    meta = exporters.get_metadata(model)
    edit(meta["privacy"])
    exporters.set_metadata(model, meta)
    onnx.save(model, str(dst))
    return exporters.read_artifact(dst).metadata


def test_a_missing_or_understated_prototypes_part_is_not_private(dp_uploads, tmp_path):
    src = dp_uploads / "up" / "client-000.onnx"
    dropped = _edited(src, tmp_path / "a.onnx", lambda r: r.pop("prototypes"))
    assert spent(dropped).epsilon is None and "exact means" in spent(dropped).why

    def understate(r):
        r["prototypes"]["noise_multiplier"] /= 2

    less = _edited(src, tmp_path / "b.onnx", understate)
    assert "prototypes spent epsilon" in spent(less).problem


def test_exporters_refuse_a_malformed_prototypes_part(dp_uploads):
    meta = exporters.read_artifact(dp_uploads / "up" / "client-000.onnx").metadata
    assert exporters.validate_metadata(meta) == []

    def without_dp(r):
        r.update(mechanism="none")
        r.pop("dp_sgd")

    for edit in (
        lambda r: r["prototypes"].update(sensitivity=1.0),
        lambda r: r["prototypes"].update(representation="raw"),
        lambda r: r["prototypes"].update(clip=2 * PROTO_CLIP),  # its sensitivity no longer C sqrt 2
        lambda r: r["prototypes"].pop("delta"),
        without_dp,  # prototypes noised, but from a model trained without DP
    ):
        broken = copy.deepcopy(meta)
        edit(broken["privacy"])
        problems = exporters.validate_metadata(broken)
        assert any("prototypes" in p for p in problems), problems


def test_simulate_under_dp_releases_fedghs_prototypes_privately(cli, tmp_path):
    """simulate --dp: each FedGH client trains again as a prototypes job (not exact prototypes
    derived from its DP model), so every upload FedGH fuses is private as a whole, and each
    client personalizes the model that job kept."""
    from edgefl.client.run import client_shard
    from edgefl.data import load_dataset, train_val_split
    from edgefl.simulate.job import SimJob
    from edgefl.simulate.run import client_jobs

    out = tmp_path / "sim"
    args = (
        "simulate", "--dataset", "digits", "--clients", "3", "--partition", "iid",
        "--mix", "smartphone:3", "--client-model", f"smartphone={MODEL}", "--methods", "fedgh",
        "--dp", "8", "--label-counts", "absent", "--classifier-epochs", "2", "--out", str(out),
        "--json", "--quiet",
    )  # fmt: skip
    r = cli(*args)
    assert r.exit_code == 0, r.output
    (row,) = [x for x in json.loads(r.stdout)["results"] if x["method"] == "fedgh"]
    assert row["error"] is None and row["privacy"]["private"] == 3, row
    assert row["privacy"]["epsilon"] == pytest.approx(8.0, rel=0.01)
    for i in range(3):
        name = f"client-{i:03d}.onnx"
        record = exporters.read_artifact(out / "uploads-prototypes" / name).metadata["privacy"]
        assert record["prototypes"]["mechanism"] == "gaussian", record
        assert (out / "models-prototypes" / name).exists()  # the model it personalized
    # Standalone is that kept model's accuracy on the client's local test split
    job = SimJob(dataset="digits", clients=3, partition="iid", mix="smartphone:3", out=str(out))
    data = load_dataset("digits", "train")
    per_client = json.loads((out / "global" / "fedgh.json").read_text())["per_client"]
    for cj in client_jobs(job):
        _, val = train_val_split(client_shard(cj, data), 0.1, seed=cj.seed + cj.client_index)
        kept = exporters.read_artifact(
            out / "models-prototypes" / f"client-{cj.client_index:03d}.onnx"
        )
        acc = float((kept.run(data.x[val]).argmax(1) == data.y[val]).mean())
        assert per_client[f"client-{cj.client_index:03d}"]["standalone"] == pytest.approx(acc)
    (out / "global" / "fedgh.json").unlink()  # fused again, from the uploads kept
    stamps = {p: p.stat().st_mtime_ns for p in (out / "uploads-prototypes").iterdir()}
    again = cli(*args)  # resumed: the pairs are checked to be this job's, reused as they are
    assert again.exit_code == 0, again.output
    assert stamps == {p: p.stat().st_mtime_ns for p in (out / "uploads-prototypes").iterdir()}
    assert json.loads(again.stdout)["results"][0]["accuracy"] == row["accuracy"]


def test_simulate_under_dp_trains_fedghs_clients_again_in_its_workers(cli, tmp_path, monkeypatch):
    """The second training of simulate --dp's FedGH clients runs in its --jobs workers, and
    gives what one worker gives: the same prototypes, bit for bit (each client single-threaded,
    its noise seeded by the run)."""
    from edgefl.simulate import pool

    pooled = []
    real = pool._train_pooled
    monkeypatch.setattr(
        pool, "_train_pooled", lambda c, todo, *a: pooled.append(todo) or real(c, todo, *a)
    )

    def run(out, jobs):
        args = (
            "simulate", "--dataset", "digits", "--clients", "2", "--partition", "iid",
            "--mix", "smartphone:2", "--client-model", f"smartphone={MODEL}", "--methods",
            "fedgh", "--dp", "8", "--label-counts", "absent", "--classifier-epochs", "1",
            "--jobs", str(jobs), "--out", str(out), "--json", "--quiet",
        )  # fmt: skip
        r = cli(*args)
        assert r.exit_code == 0, r.output
        return {
            p.name: [numpy_helper.to_array(t) for t in onnx.load(p).graph.initializer]
            for p in sorted((out / "uploads-prototypes").glob("*.onnx"))
        }

    alone = run(tmp_path / "one", 1)
    assert pooled == []
    together = run(tmp_path / "two", 2)
    assert pooled == [[0, 1], [0, 1]]  # the clients, then their second training
    assert alone.keys() == together.keys() == {"client-000.onnx", "client-001.onnx"}
    for name, arrays in alone.items():
        assert arrays and sum(a.size for a in arrays) > 10, name  # the prototypes are in them
        assert all(np.array_equal(a, b) for a, b in zip(arrays, together[name], strict=True))


def test_withheld_or_noised_label_counts_keep_the_prototypes_counts_off_the_upload(cli, tmp_path):
    """Without --dp a prototypes upload stated its exact per-class counts beside
    --label-counts absent (or noised): the very histogram the user withheld. Left out now,
    and an upload that states them against its record is malformed."""
    for release, client in (("absent", 0), ("noised:2", 1), ("exact", 2)):
        r = cli(
            "client", "prototypes", *COMMON, "--client-index", str(client),
            "--out", str(tmp_path / "up"), "--keep-model", str(tmp_path / "local"),
            "--label-counts", release, "--quiet",
        )  # fmt: skip
        assert r.exit_code == 0, r.output
        meta = exporters.read_artifact(tmp_path / "up" / f"client-{client:03d}.onnx").metadata
        assert ("counts" in meta) == (release == "exact"), (release, meta.get("counts"))
        assert exporters.validate_metadata(meta) == []
    absent = exporters.read_artifact(tmp_path / "up" / "client-000.onnx").metadata
    stated = absent | {"counts": [1] * len(absent["classes"])}
    problems = exporters.validate_metadata(stated)
    assert any("exact class counts" in p for p in problems), problems
    fused = cli(
        "server", "fuse", str(tmp_path / "up"), "--method", "fedgh",
        "--out", str(tmp_path / "g.onnx"), "--json", "--quiet",
    )  # fmt: skip
    assert fused.exit_code == 0, fused.output
    assert len(json.loads(fused.stdout)["used"]) == 3  # FedGH fuses with or without counts


def test_client_prototypes_says_what_it_spent(cli, tmp_path):
    """client train printed its privacy; client prototypes and predict printed none."""
    r = cli(
        "client", "prototypes", *[a for a in COMMON if a != "--quiet"], "--client-index", "0",
        "--out", str(tmp_path / "up"), "--keep-model", str(tmp_path / "local"), "--dp", "8",
        "--label-counts", "absent",
    )  # fmt: skip
    said = " ".join(r.output.split())
    assert r.exit_code == 0, said
    assert "privacy: DP-SGD epsilon" in said and "prototypes noised (epsilon 4)" in said, said
    assert "(8, " in said and "-DP in all" in said, said
