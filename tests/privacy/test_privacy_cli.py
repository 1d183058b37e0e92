"""Differential privacy through the product (issue 57, items 1, 3, 4): `client train --dp` and
`--label-counts` write an upload whose "privacy" record recomputes to what was asked; bad input
stops with one message before any data is read; exporters accept the record's shape and refuse
a malformed one; `server fuse --max-epsilon` sets aside, by name, uploads without DP, over the
budget or with a record that contradicts itself; and every method that reads label counts
fuses a federation that withholds them.

Tiny throughout: digits (8x8), scnn width 4 or the planner's small CVAE, one to three epochs.
"""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import fields
from pathlib import Path

import onnx
import pytest
from fed_fixtures import DATASET, NUM_CLIENTS, PARTITION

import exporters
from edgefl.client.privacy import LABEL_SHARE, LabelRelease, spent
from edgefl.client.run import ClientJob, run_client
from edgefl.errors import ConfigError
from edgefl.fusion import METHODS
from edgefl.privacy import DPPlan

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CLASSIFIER = "scnn:width=4"
COMMON = ("--dataset", DATASET, "--partition", PARTITION, "--num-clients", str(NUM_CLIENTS))


def train(cli, out: Path, index: int, *extra: str, generator: bool = False):
    """`edgefl client train` of client `index` on digits, one epoch (a generator: three)."""
    model = ("--profile", "wristband", "--role", "generator", "--epochs", "3")
    if not generator:
        model = ("--profile", "smartphone", "--model", CLASSIFIER, "--epochs", "1")
    return cli(
        "client", "train", *COMMON, *model, "--client-index", str(index), "--out", str(out),
        "--quiet", *extra,
    )  # fmt: skip


def meta_of(path: Path) -> dict:
    return exporters.read_artifact(path).metadata


@pytest.fixture(scope="module")
def uploads(tmp_path_factory):
    """client-000: no DP; client-001: --dp 2 (counts noised from its share); client-002:
    --dp 16, counts absent; client-003: a CVAE under --dp 4, counts noised:1 on top."""
    from typer.testing import CliRunner

    from edgefl.cli import app

    runner = CliRunner()

    def cli(*args):
        return runner.invoke(app, list(args))

    out = tmp_path_factory.mktemp("dp") / "uploads"
    runs = [
        train(cli, out, 0),
        train(cli, out, 1, "--dp", "2", "--label-counts", "noised"),
        train(cli, out, 2, "--dp", "16", "--label-counts", "absent"),
        train(cli, out, 3, "--dp", "4", "--label-counts", "noised:1", generator=True),
    ]
    for r in runs:
        assert r.exit_code == 0, r.output
    return out


# --- the upload's record ---------------------------------------------------------------------


def test_a_dp_classifier_records_what_it_spent(uploads):
    meta = meta_of(uploads / "client-001.onnx")
    record = meta["privacy"]
    assert record["mechanism"] == "dp-sgd" and record["accountant"] == "rdp"
    plan = DPPlan.from_dict(record["dp_sgd"])
    assert plan.problem() is None
    # The counts took their share of --dp 2, training the rest; each at half of delta 1/n.
    assert plan.epsilon == pytest.approx(2 * (1 - LABEL_SHARE))
    assert record["label_counts"]["epsilon"] == pytest.approx(2 * LABEL_SHARE)
    assert plan.delta == pytest.approx(record["label_counts"]["delta"])
    assert plan.delta == pytest.approx(0.5 / meta["training"]["samples"])
    got = spent(meta)
    assert got.problem is None and got.epsilon == pytest.approx(2, rel=0.01)
    assert record["epsilon"] == pytest.approx(2) and got.delta == pytest.approx(record["delta"])
    assert len(meta["label_counts"]) == meta["num_classes"]
    assert exporters.validate_metadata(meta) == []


def test_a_dp_cvae_records_training_and_counts_added(uploads):
    meta = meta_of(uploads / "client-003.onnx")
    assert meta["kind"] == "decoder"
    record = meta["privacy"]
    assert record["dp_sgd"]["epsilon"] == pytest.approx(4)  # noised:1 comes on top of --dp 4
    assert spent(meta).epsilon == pytest.approx(5, rel=0.01)
    assert record["epsilon"] == pytest.approx(5)


def test_label_counts_exact_absent_and_noised_in_the_metadata(uploads):
    plain, absent = meta_of(uploads / "client-000.onnx"), meta_of(uploads / "client-002.onnx")
    assert plain["privacy"] == {"mechanism": "none", "label_counts": {"release": "exact"}}
    assert sum(plain["label_counts"]) > 0
    assert spent(plain).epsilon is None and "without DP" in spent(plain).why
    assert "label_counts" not in absent and absent["privacy"]["label_counts"] == {
        "release": "absent"
    }
    assert spent(absent).epsilon == pytest.approx(16, rel=0.01)
    noised = meta_of(uploads / "client-001.onnx")
    assert noised["privacy"]["label_counts"]["release"] == "noised"
    assert noised["privacy"]["label_counts"]["noise_multiplier"] > 0


def test_noised_counts_without_dp_are_recorded_but_the_upload_is_not_private(cli, tmp_path):
    r = train(cli, tmp_path, 0, "--label-counts", "noised:1")
    assert r.exit_code == 0, r.output
    meta = meta_of(tmp_path / "client-000.onnx")
    assert meta["privacy"]["mechanism"] == "none" and meta["privacy"]["epsilon"] is None
    assert meta["privacy"]["label_counts"]["epsilon"] == 1
    assert spent(meta).epsilon is None and exporters.validate_metadata(meta) == []


def test_exact_counts_under_dp_leave_the_upload_not_private_as_a_whole(cli, tmp_path):
    r = train(cli, tmp_path, 0, "--dp", "8")
    assert r.exit_code == 0, r.output
    meta = meta_of(tmp_path / "client-000.onnx")
    assert meta["privacy"]["epsilon"] is None
    assert DPPlan.from_dict(meta["privacy"]["dp_sgd"]).spent() == pytest.approx(8, rel=0.01)
    assert "exact" in spent(meta).why


def test_dp_sgd_trains_by_its_own_defaults_unless_the_job_names_them(cli, tmp_path):
    """Under --dp a client takes Adam at DP_LR and about six expected batches an epoch (the
    profile's SGD at 0.01 and batch 64 lost 16-30 points at epsilon 8); a named lr and batch
    stay the job's. The upload records what was used."""
    from edgefl.privacy.config import DP_LR, DP_OPTIMIZER, dp_expected_batch

    r = train(cli, tmp_path / "own", 0, "--dp", "8")
    assert r.exit_code == 0, r.output
    training = meta_of(tmp_path / "own" / "client-000.onnx")["training"]
    assert (training["optimizer"], training["lr"]) == (DP_OPTIMIZER, DP_LR)
    n = training["samples"]
    rate = training["privacy"]["sample_rate"]
    assert rate == pytest.approx(min(1.0, dp_expected_batch(n, training["batch_size"]) / n))
    r = train(cli, tmp_path / "named", 0, "--dp", "8,batch=8", "--lr", "0.003")
    assert r.exit_code == 0, r.output
    training = meta_of(tmp_path / "named" / "client-000.onnx")["training"]
    assert (training["optimizer"], training["lr"]) == (DP_OPTIMIZER, 0.003)
    assert training["privacy"]["sample_rate"] == pytest.approx(8 / training["samples"])
    # --optimizer, as docs/privacy.md says (the client commands lacked it)
    r = train(cli, tmp_path / "sgd", 0, "--dp", "8", "--optimizer", "sgd", "--lr", "0.5")
    assert r.exit_code == 0, r.output
    training = meta_of(tmp_path / "sgd" / "client-000.onnx")["training"]
    assert (training["optimizer"], training["lr"]) == ("sgd", 0.5)


# --- bad input: one message, exit 2, before any data --------------------------------------


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--dp", "0"), "--dp epsilon"),
        (("--dp", "-1"), "--dp epsilon"),
        (("--dp", "8,delta=1"), "--dp delta"),
        (("--dp", "8,delta=2"), "--dp delta"),
        (("--dp", "eight"), "must be a number"),
        (("--dp", "8,noise=1"), "is not delta=D, clip=C or batch=B"),
        (("--dp", "8,clip=0"), "--dp clip"),
        (("--label-counts", "fuzzy"), "--label-counts"),
        (("--label-counts", "noised"), "no --dp is given"),
        (("--label-counts", "noised:0"), "epsilon must be in [0.01, 100], got 0.0: raise it"),
        # as --dp's: above 100 the guarantee says nothing (1e9 was recorded as noised)
        (("--label-counts", "noised:1e9"), "epsilon must be in [0.01, 100]"),
        (("--label-counts", "noised:inf"), "must be a finite number in [0.01, 100]"),
        (("--dp", "8", "--label-counts", "exact:1"), "--label-counts"),
    ],
)
def test_bad_privacy_flags_stop_before_any_data(cli, tmp_path, monkeypatch, flags, says):
    def no_data(*a, **k):
        raise AssertionError("data loaded before the flags were checked")

    monkeypatch.setattr("edgefl.client.run.load_dataset", no_data)
    r = train(cli, tmp_path, 0, *flags)
    assert r.exit_code == 2, r.output
    assert says in r.output and "Traceback" not in r.output
    assert r.output.count("error") == 1, r.output
    assert not (tmp_path / "client-000.onnx").exists()


def test_a_search_under_dp_is_refused_before_any_data(cli, tmp_path, monkeypatch):
    """The search picks the architecture by accuracy on the local data: --dp does not cover
    that choice, so the two are refused together, by client train and by simulate."""

    def no_data(*a, **k):
        raise AssertionError("data loaded before the flags were checked")

    monkeypatch.setattr("edgefl.client.run.load_dataset", no_data)
    r = cli(
        "client", "train", *COMMON, "--profile", "wristband", "--search", "pso",
        "--client-index", "0", "--out", str(tmp_path), "--dp", "8",
    )  # fmt: skip
    assert r.exit_code == 2 and "--search with --dp" in r.output, r.output
    assert "Traceback" not in r.output and not list(tmp_path.iterdir())
    r = cli(
        "simulate", "--dataset", DATASET, "--out", str(tmp_path / "s"), "--dp", "8",
        "--mix", "wristband:3", "--clients", "3", "--client-model", "wristband=search:pso",
    )  # fmt: skip
    assert r.exit_code == 2 and "with --dp" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "s").exists()


def test_simulate_refuses_bad_privacy_flags_before_training(cli, tmp_path):
    r = cli("simulate", "--dataset", DATASET, "--out", str(tmp_path / "s"), "--dp", "0")
    assert r.exit_code == 2 and "--dp epsilon" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "s" / "uploads").exists()


def test_a_batchnorm_model_is_refused_under_dp_before_training(cli, tmp_path, monkeypatch):
    def no_training(*a, **k):
        raise AssertionError("trained")

    monkeypatch.setattr("edgefl.training._dp_epoch", no_training)
    r = cli(
        "client", "train", *COMMON, "--profile", "smartphone", "--model", "scnn:width=4,bn=true",
        "--epochs", "1", "--out", str(tmp_path), "--dp", "8", "--quiet",
    )  # fmt: skip
    assert r.exit_code == 2 and "BatchNorm" in r.output and "bn=false" in r.output, r.output
    assert "--force" not in r.output  # no budget is exceeded: forcing meets the same refusal
    assert not (tmp_path / "client-000.onnx").exists()


def test_simulate_refuses_a_model_dp_cannot_train_before_any_client(cli, tmp_path, monkeypatch):
    """A --client-model with BatchNorm under --dp was refused at its client's turn, after the
    clients before it had trained."""
    monkeypatch.setattr("edgefl.simulate.pool._train_one", lambda *a: pytest.fail("trained"))
    r = cli(
        "simulate", "--dataset", "digits", "--clients", "2", "--mix", "smartphone:1,wristband:1",
        "--methods", "ensemble", "--dp", "8", "--client-model", "smartphone=mlp",
        "--client-model", "wristband=scnn:width=4,bn=true", "--out", str(tmp_path / "run"),
    )  # fmt: skip
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "Traceback" not in said, said
    assert "wristband's model scnn:width=4,bn=true" in said and "BatchNorm" in said, said
    assert "--client-model wristband=scnn:bn=false" in said, said


@pytest.mark.parametrize(
    ("data", "mix", "dp", "says"),
    [
        # Dir(0.1) over 3 digits phones: client 1 holds 456 samples, client 0 more
        (
            "digits",
            "smartphone:3",
            "8,delta=0.0024",
            "client 1 (smartphone): --dp delta 0.0024 is above 1/n",
        ),
        # an MCU holding half of MNIST: DP-SGD's indices of its whole shard overflow it
        ("mnist", "smartphone:1,mcu:1", "8,batch=200000", "client 1 (mcu): cvae-mlp(hidden=4)"),
    ],
)
def test_simulate_checks_every_clients_dp_plan_before_any_trains(
    cli, tmp_path, monkeypatch, data, mix, dp, says
):
    """A delta above 1/n of one small shard, a DP batch a band cannot hold: refused at that
    client's turn, after the clients before it had trained and left their uploads, with a fix
    naming flags simulate does not have (--force)."""
    monkeypatch.setattr("edgefl.simulate.pool._train_one", lambda *a: pytest.fail("trained"))
    r = cli(
        "simulate", "--dataset", data, "--clients", str(sum(int(m[-1]) for m in mix.split(","))),
        "--mix", mix, "--partition", "dirichlet:0.1", "--methods", "fedavg",
        "--client-model", "smartphone=cnn", "--dp", dp, "--out", str(tmp_path / "run"),
    )  # fmt: skip
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "Traceback" not in said, said
    assert says in said and "--force" not in said and "--dp EPS,delta=D,batch=B" in said, said
    assert not (tmp_path / "run").exists()


def test_a_dp_batch_above_a_shard_is_said_not_recorded_silently(cli, tmp_path):
    """`--dp 8,batch=100000` on shards of ~600 digits: every step takes the whole shard
    (sampling rate 1), which only the uploads' records said."""
    r = cli(
        "simulate", "--dataset", "digits", "--clients", "2", "--mix", "smartphone:2",
        "--client-model", "smartphone=scnn:bn=false", "--classifier-epochs", "2",
        "--dp", "8,batch=100000", "--methods", "fedavg", "--out", str(tmp_path / "run"), "-q",
    )  # fmt: skip
    said = " ".join(r.output.split())
    assert r.exit_code == 0, said
    for client in ("client-000", "client-001"):
        assert f"{client}: every DP-SGD step took all of its" in said, said
    assert "(sampling rate 1, 2 steps" in said, said
    r = cli(
        "simulate", "--dataset", "digits", "--clients", "2", "--mix", "smartphone:2",
        "--client-model", "smartphone=scnn:bn=false", "--classifier-epochs", "2",
        "--dp", "8,batch=64", "--methods", "fedavg", "--out", str(tmp_path / "b64"), "-q",
    )  # fmt: skip
    assert r.exit_code == 0 and "every DP-SGD step" not in r.output, r.output


def test_label_release_parses_its_forms():
    assert LabelRelease.parse("noised:0.5") == LabelRelease("noised", 0.5)
    assert LabelRelease.parse("absent") == LabelRelease("absent")
    with pytest.raises(ConfigError):
        LabelRelease.parse("absent:1")


def test_a_rerun_with_other_privacy_is_not_the_same_upload(cli, uploads, tmp_path):
    shutil.copytree(uploads, tmp_path / "u")
    r = train(cli, tmp_path / "u", 1, "--dp", "3", "--label-counts", "noised")
    assert r.exit_code == 2 and "dp 2 -> 3" in r.output, r.output
    r = train(cli, tmp_path / "u", 0, "--label-counts", "absent")
    assert r.exit_code == 2 and "label-counts exact -> absent" in r.output, r.output


# --- exporters: the record's shape ---------------------------------------------------------


def _broken(meta: dict, change) -> dict:
    meta = copy.deepcopy(meta)
    change(meta)
    return meta


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m["privacy"].update(mechanism="laplace"),
        lambda m: m["privacy"]["dp_sgd"].pop("steps"),
        lambda m: m["privacy"]["dp_sgd"].update(noise_multiplier=-1.0),
        lambda m: m["privacy"]["dp_sgd"].update(sample_rate=2.0),
        lambda m: m["privacy"]["label_counts"].update(release="fuzzy"),
        lambda m: m["privacy"]["label_counts"].pop("noise_multiplier"),
        lambda m: m["privacy"].update(epsilon="small"),
        lambda m: m.update(privacy=[]),
        lambda m: m["privacy"].update(mechanism="none"),  # a plan under mechanism none
    ],
)
def test_exporters_refuse_a_malformed_record(uploads, change):
    meta = _broken(meta_of(uploads / "client-001.onnx"), change)
    problems = exporters.validate_metadata(meta)
    assert problems and any("privacy" in p for p in problems), problems


def test_exporters_refuse_counts_a_record_says_are_absent(uploads):
    meta = meta_of(uploads / "client-002.onnx")
    assert exporters.validate_metadata(meta) == []
    with_counts = _broken(meta, lambda m: m.update(label_counts=[1] * m["num_classes"]))
    assert any("absent" in p for p in exporters.validate_metadata(with_counts))
    # Counts may be left out only where the record says so.
    plain = _broken(meta_of(uploads / "client-000.onnx"), lambda m: m.pop("label_counts"))
    assert any("label_counts" in p for p in exporters.validate_metadata(plain))


# --- the server: --max-epsilon and forged records -----------------------------------------


def forge(src: Path, dst: Path, change) -> None:
    """`src` with its metadata changed (the weights as they were)."""
    model = onnx.load(str(src))
    for prop in model.metadata_props:
        if prop.key == exporters.METADATA_KEY:
            meta = json.loads(prop.value)
            change(meta)
            prop.value = json.dumps(meta)
    onnx.save(model, str(dst))


def fuse(cli, folder: Path, out: Path, *extra: str):
    return cli(
        "server", "fuse", str(folder), "--method", "fedavg", "--out", str(out / "g.onnx"),
        "--device", "cpu", "--json", *extra,
    )  # fmt: skip


def report_of(r) -> dict:
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout[r.stdout.index("{") :])


def test_max_epsilon_sets_aside_uploads_without_dp_or_over_budget(cli, uploads, tmp_path):
    folder = tmp_path / "u"
    folder.mkdir()
    for i in range(3):  # the classifiers
        shutil.copy(uploads / f"client-00{i}.onnx", folder)
    rep = report_of(fuse(cli, folder, tmp_path, "--max-epsilon", "4"))
    rejected = {x["file"]: x["reason"] for x in rep["rejected"]}
    assert set(rejected) == {"client-000.onnx", "client-002.onnx"}
    assert "not differentially private" in rejected["client-000.onnx"]
    assert "without DP" in rejected["client-000.onnx"]
    assert "spent epsilon 16" in rejected["client-002.onnx"]
    assert rep["used"] == ["client-001"]
    privacy = rep["privacy"]
    assert privacy["max_epsilon_allowed"] == 4 and privacy["epsilon"] == pytest.approx(2, rel=0.01)
    assert privacy["private"] == 1 and privacy["not_private"] == 0
    # DP-SGD protects a sample, not a client's whole data: the report and the line say so
    assert privacy["unit"] == "sample"
    assert meta_of(tmp_path / "g.onnx")["privacy"]["epsilon"] == pytest.approx(2, rel=0.01)
    # Without the flag every upload is used, and the report says not all are private.
    rep = report_of(fuse(cli, folder, tmp_path / "all"))
    assert len(rep["used"]) == 3 and rep["privacy"]["epsilon"] is None
    assert rep["privacy"]["not_private"] == 1 and rep["privacy"]["label_counts_absent"] == 1
    # Several methods (--out-dir) print each one's privacy line too (they printed none).
    r = cli(
        "server", "fuse", str(folder), "--method", "fedavg,ensemble", "--max-epsilon", "4",
        "--out-dir", str(tmp_path / "many"), "--device", "cpu",
    )  # fmt: skip
    said = " ".join(r.output.split())
    assert r.exit_code == 0, said
    for m in ("fedavg", "ensemble"):
        assert f"{m} privacy: (epsilon 2" in said, said
    assert "for each training sample" in said and "not a client's data as a whole" in said


def test_when_max_epsilon_sets_every_upload_aside_the_fix_is_the_flag(cli, uploads, tmp_path):
    """The files are sound: "fix or remove the rejected files" was the wrong fix."""
    folder = tmp_path / "u"
    folder.mkdir()
    for i in (0, 2):  # no DP; epsilon 16
        shutil.copy(uploads / f"client-00{i}.onnx", folder)
    r = fuse(cli, folder, tmp_path, "--max-epsilon", "4")
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "no usable uploads" in said, said
    assert "raise --max-epsilon (the least spent here: 16" in said, said
    assert "fix or remove the rejected files" not in said, said


def test_a_record_that_understates_its_epsilon_is_set_aside(cli, uploads, tmp_path):
    folder = tmp_path / "u"
    folder.mkdir()
    shutil.copy(uploads / "client-001.onnx", folder)

    def lower(meta):  # the same noise and steps, claimed to spend half
        meta["privacy"]["dp_sgd"]["epsilon"] /= 2
        meta["privacy"]["epsilon"] /= 2

    forge(uploads / "client-002.onnx", folder / "forged.onnx", lower)
    for extra in ((), ("--max-epsilon", "100")):
        rep = report_of(fuse(cli, folder, tmp_path / str(len(extra)), *extra))
        rejected = {x["file"]: x["reason"] for x in rep["rejected"]}
        assert list(rejected) == ["forged.onnx"] and "inconsistent" in rejected["forged.onnx"]
        assert rep["used"] == ["client-001"]


def test_a_total_below_its_parts_is_inconsistent(uploads):
    meta = meta_of(uploads / "client-001.onnx")
    meta["privacy"]["epsilon"] = 1.0
    got = spent(meta)
    assert got.epsilon is None and "below its parts" in got.problem


def test_max_epsilon_must_be_positive(cli, uploads, tmp_path):
    r = fuse(cli, uploads, tmp_path, "--max-epsilon", "0")
    assert r.exit_code == 2 and "--max-epsilon" in r.output and "Traceback" not in r.output


# --- methods that read label counts, on a federation that withholds them --------------------

# Small knobs where a method's config has the field (as tests/fusion/test_fusion.py's contract).
SMALL = dict(epochs=2, synthetic=200, batch_size=32, gen_steps=2, nz=16, ngf=4)
READS_COUNTS = [
    "fedavg",
    "fedcvae-ens",
    "fedmho",
    "fedmho-md",
    "fedmho-sd",
    "fedmho-cw",
    "fedhydra",
]


@pytest.fixture(scope="module")
def withheld(tmp_path_factory):
    """Two classifiers and two CVAE decoders, none stating its label counts."""
    out = tmp_path_factory.mktemp("absent") / "uploads"
    base = dict(
        dataset=DATASET,
        out_dir=str(out),
        partition=PARTITION,
        num_clients=NUM_CLIENTS,
        batch_size=64,
        label_counts="absent",
    )
    for i in range(2):
        run_client(
            ClientJob(profile="smartphone", model=CLASSIFIER, epochs=3, client_index=i, **base)
        )
    for i in (2, 3):
        run_client(
            ClientJob(profile="wristband", role="generator", epochs=5, client_index=i, **base)
        )
    return out


@pytest.mark.parametrize("name", READS_COUNTS)
def test_methods_that_read_label_counts_fuse_without_them(name, withheld, tmp_path):
    from edgefl.server.fuse import FuseJob, run_fuse

    have = {f.name for f in fields(METHODS.get(name).config_cls)}
    job = FuseJob(
        uploads=str(withheld),
        method=name,
        out=str(tmp_path / "g.onnx"),
        options={k: v for k, v in SMALL.items() if k in have},
        device="cpu",
        eval="digits",
    )
    rep = run_fuse(job)
    assert rep["used"] and not rep["rejected"], rep
    assert rep["privacy"]["label_counts_absent"] == len(rep["used"])
    assert 0 <= rep["accuracy"] <= 1


def test_client_train_says_what_the_upload_spent(cli, tmp_path):
    r = cli(
        *[a for a in r_args(tmp_path) if a != "--quiet"], "--dp", "8", "--label-counts", "absent"
    )
    assert r.exit_code == 0, r.output
    line = " ".join(r.output.split())
    assert "DP-SGD epsilon 8" in line and "no label counts" in line and "-DP in all" in line
    assert "for each training sample" in line


def r_args(out: Path) -> list[str]:
    return [
        "client", "train", *COMMON, "--profile", "smartphone", "--model", CLASSIFIER,
        "--epochs", "1", "--out", str(out), "--quiet",
    ]  # fmt: skip


def test_simulate_trains_every_client_under_dp_and_resumes_only_the_same(cli, tmp_path):
    out = tmp_path / "run"
    args = [
        "simulate", "--dataset", DATASET, "--clients", "4", "--mix", "smartphone:2,wristband:2",
        "--partition", PARTITION, "--client-model", f"smartphone={CLASSIFIER}",
        "--classifier-epochs", "1", "--generator-epochs", "2", "--methods", "fedmho-md",
        "--fuse-opt", "all:epochs=1", "--fuse-opt", "all:synthetic=200", "--out", str(out),
        "--label-counts", "absent",
    ]  # fmt: skip
    r = cli(*args, "--dp", "8", "--jobs", "2")
    assert r.exit_code == 0, r.output
    # spawned workers too: each client's DP-SGD steps are relayed as `client train` shows them, naming the client
    steps = [line for line in r.output.splitlines() if line.startswith("DP-SGD step, client ")]
    assert {line.split()[3] for line in steps} == {"0", "1", "2", "3"}, r.output
    results = json.loads((out / "results.json").read_text())
    for c in results["clients"]:
        assert c["training"]["privacy"]["epsilon"] == pytest.approx(8)
        assert c["label_counts"] is None
    row = results["results"][0]
    assert row["privacy"]["epsilon"] == pytest.approx(8, rel=0.01), row
    r = cli(*args, "--dp", "4")  # the finished uploads were trained otherwise
    assert r.exit_code == 2 and "dp 8 -> 4" in " ".join(r.output.split()), r.output


def test_the_servers_privacy_line_says_when_the_noise_is_replayable():
    """A simulation's uploads draw their noise from its seed: the line stated DP for them
    without a word of it (the report counted them, the terminal did not)."""
    from edgefl.cli.server_cmd import privacy_line

    base = {"epsilon": 8.0, "delta": 1e-3, "uploads": 3, "private": 3, "not_private": 0}
    assert "seeded" not in privacy_line(base | {"replayable": 0})
    line = privacy_line(base | {"replayable": 2})
    assert line.startswith("(epsilon 8, delta 0.001)-DP") and "2 of them with noise seeded" in line


def test_a_delta_above_one_over_n_is_no_guarantee(cli, uploads, tmp_path):
    """`--dp 8,delta=0.99` trained, and the server stated "(8, 0.99)-DP": a delta above 1/n
    is met by a release that publishes a sample outright. Refused on the device before
    training; an upload that states one is not private to the server."""
    r = train(cli, tmp_path / "u", 0, "--dp", "8,delta=0.5")
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "above 1/n" in said and "Traceback" not in said, said
    assert not list((tmp_path / "u").glob("*.onnx"))
    meta = copy.deepcopy(meta_of(uploads / "client-002.onnx"))  # --dp 16, counts absent
    assert spent(meta).epsilon == pytest.approx(16, rel=0.01)
    meta["training"]["samples"] = 10**9  # its delta (1/n of its real n) is now above 1/n
    got = spent(meta)
    assert got.epsilon is None and "above 1/n" in got.why


def test_client_train_json_carries_the_whole_privacy_record(cli, tmp_path):
    """--json gave DP-SGD's part only (epsilon 7.2 of --dp 8 with noised counts): the total
    and the counts' part are the upload's record, now in the summary too."""
    r = train(cli, tmp_path / "u", 0, "--dp", "8", "--label-counts", "noised", "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout[r.stdout.index("{") :])
    record = got["privacy"]
    assert record == meta_of(tmp_path / "u" / "client-000.onnx")["privacy"]
    assert record["epsilon"] == pytest.approx(8) and record["label_counts"]["release"] == "noised"
