"""Fusion methods are plugins: the pipeline, `simulate` and the CLI read each method's contract,
never its name. Proved by a toy method of each kind (classifier, decoder, predictions,
per-client) registered from this module alone and run through `edgefl server fuse`,
`edgefl simulate` (local engine and Flower's) and `edgefl reproduce`; plus one ingest for many
methods, and the option declarations checked for every registered method (scikit-learn style:
invalid values are generated from the declarations)."""

from __future__ import annotations

import ast
import contextlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from fed_fixtures import build_federation, snapshot

import edgefl.server.fuse
import edgefl.server.ingest
import exporters
from edgefl.client.weightless import APPLIERS
from edgefl.data.public import public_fingerprint
from edgefl.errors import ConfigError, FusionError
from edgefl.fusion import BUDGETS, METHODS
from edgefl.fusion.base import FusionResult, Method, Reference
from edgefl.fusion.config import FusionConfig
from edgefl.fusion.options import declared, option
from edgefl.fusion.public_set import PublicSetConfig, public_samples
from edgefl.fusion.student import train_student

ROOT = Path(__file__).resolve().parents[2]


# --- a toy method, defined here and nowhere else ----------------------------------------------


@dataclass(frozen=True)
class PickConfig(FusionConfig):
    pick: int = option(0, "which classifier upload (in file order) becomes the global model", low=0)
    scale: float = option(1.0, "logits are multiplied by this", low=0, low_open=True)


class _Scaled(torch.nn.Module):
    def __init__(self, inner, scale):
        super().__init__()
        self.inner, self.scale = inner, scale

    def forward(self, x):
        return self.inner(x) * self.scale


def _pick(ctx, cfg: PickConfig) -> FusionResult:
    classifiers = ctx.require("classifier")
    if cfg.pick >= len(classifiers):
        raise FusionError(f"--pick {cfg.pick}: only {len(classifiers)} classifier uploads")
    chosen = classifiers[cfg.pick]
    return FusionResult(_Scaled(chosen.module, cfg.scale), None, {"picked": chosen.client_id})


TOY = Method(
    name="toy-pick",
    description="the chosen client's classifier, as is",
    paper="a test",
    consumes=("classifier",),
    needs_modules=True,
    config_cls=PickConfig,
    fuse=_pick,
    references=(Reference("digits", 4, "dirichlet:1", 12.34, "made up for the test"),),
)


@dataclass(frozen=True)
class CentroidConfig(FusionConfig):
    per_class: int = option(50, "samples drawn per class from the decoders", low=1)


def _centroids(ctx, cfg: CentroidConfig) -> FusionResult:
    """Nearest class mean of the decoders' draws, as one linear layer: argmax_c of
    x . mu_c - |mu_c|^2 / 2 is the nearest mean in Euclidean distance."""
    from edgefl.fusion.samples import generate

    decoders = ctx.require("decoder")
    alloc = np.stack([np.where(u.label_counts > 0, cfg.per_class, 0) for u in decoders])
    x, y = generate(decoders, alloc, ctx.seed, ctx.device)
    mu = torch.stack([x[y == c].flatten(1).mean(0) for c in range(ctx.num_classes)])
    layer = torch.nn.Linear(mu.shape[1], ctx.num_classes)
    with torch.no_grad():
        layer.weight.copy_(mu)
        layer.bias.copy_(-0.5 * (mu**2).sum(1))
    return FusionResult(torch.nn.Sequential(torch.nn.Flatten(), layer), None, {"drawn": len(x)})


CENTROID = Method(
    name="toy-centroid",
    description="nearest class mean of the decoders' samples",
    paper="a test",
    consumes=("decoder",),
    needs_modules=True,
    config_cls=CentroidConfig,
    fuse=_centroids,
)


@dataclass(frozen=True)
class VoteConfig(PublicSetConfig):
    epochs: int = option(20, "student epochs on the voted public set", low=1)
    lr: float = option(1e-2, "student Adam learning rate", low=0, low_open=True)


def _vote(ctx, cfg: VoteConfig) -> FusionResult:
    """An MLP student trained on the public set, each sample labelled by the argmax of the mean
    of the clients' predictions on it (those made on another public set are set aside)."""
    x = public_samples(ctx, cfg)
    mine = public_fingerprint(x)
    uploads = ctx.require("predictions")
    voters = [u for u in uploads if u.meta["public_fingerprint"] == mine]
    ctx.set_aside([(u, "predictions on another public set") for u in uploads if u not in voters])
    if not voters:
        raise FusionError("toy-vote: no predictions on the server's public set")
    probs = [exporters.read_constant_outputs(u.artifact.model)["predictions"] for u in voters]
    labels = torch.from_numpy(np.mean([p.astype(np.float32) for p in probs], 0).argmax(1))
    spec, student = ctx.student("mlp")
    x = torch.from_numpy(x)
    history = train_student(
        student,
        x,
        labels,
        epochs=cfg.epochs,
        lr=cfg.lr,
        batch_size=64,
        seed=cfg.seed,
        device=ctx.device,
    )
    info = {"voters": [u.client_id for u in voters], "public_samples": len(x), "loss": history}
    return FusionResult(student, spec, info, samples=x)


VOTE = Method(
    name="toy-vote",
    description="a student of the public set, labelled by the clients' mean prediction",
    paper="a test",
    consumes=("predictions",),
    needs_modules=False,
    config_cls=VoteConfig,
    fuse=_vote,
)


@dataclass(frozen=True)
class HeaderConfig(FusionConfig):
    weighted: bool = option(True, "weigh each client's class mean by its sample count")


def _nearest_mean_header(
    protos: list[tuple[list[int], np.ndarray, list[int]]], classes: int, weighted: bool
):
    """(weight C x R, bias C) of the linear layer whose argmax is the nearest of the class means
    pooled over the clients' prototypes ((classes, means, counts) each); a class no client holds
    gets no weights and a bias of -1e4, far below a held class's logit."""
    size = protos[0][1].shape[1]
    sums, total = np.zeros((classes, size)), np.zeros(classes)
    for held, means, counts in protos:
        w = np.asarray(counts, dtype=np.float64) if weighted else np.ones(len(held))
        np.add.at(sums, held, means * w[:, None])
        np.add.at(total, held, w)
    mu = sums / np.maximum(total, 1)[:, None]
    bias = np.where(total > 0, -0.5 * (mu**2).sum(1), -1e4)
    return mu.astype(np.float32), bias.astype(np.float32)


def _prototypes(upload) -> tuple[list[int], np.ndarray, list[int]]:
    means = exporters.read_constant_outputs(upload.artifact.model)["prototypes"]
    return upload.meta["classes"], means.astype(np.float64), upload.meta["counts"]


def _header(ctx, cfg: HeaderConfig) -> FusionResult:
    """Per client: a global nearest-class-mean header each device splices onto its own
    features (FedGH's `header` output, with no training)."""
    uploads = ctx.require("prototypes")
    sizes = {u.meta["representation_size"] for u in uploads}
    if len(sizes) > 1:
        raise FusionError(f"toy-header: representations of sizes {sorted(sizes)}")
    protos = [_prototypes(u) for u in uploads]
    weight, bias = _nearest_mean_header(protos, ctx.num_classes, cfg.weighted)
    layer = torch.nn.Linear(weight.shape[1], ctx.num_classes)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(weight))
        layer.bias.copy_(torch.from_numpy(bias))
        fit = [layer(torch.from_numpy(m).float()).argmax(1).numpy() == h for h, m, _ in protos]
    info = {"prototype_accuracy": float(np.concatenate(fit).mean())}
    return FusionResult(
        layer, None, info, input_shape=weight.shape[1:], input_name="representation"
    )


HEADER = Method(
    name="toy-header",
    description="a nearest-class-mean header of the clients' prototypes, spliced per client",
    paper="a test",
    consumes=("prototypes",),
    needs_modules=False,
    config_cls=HeaderConfig,
    fuse=_header,
    judged="per-client",
    personalize="header",
)


TOYS = (TOY, CENTROID, VOTE, HEADER)


@contextlib.contextmanager
def registered():
    """The toy methods in the registry for the block, as a plugin would add its own."""
    for m in TOYS:
        METHODS.add(m.name, m)
    try:
        yield
    finally:
        for m in TOYS:
            METHODS.remove(m.name)


@pytest.fixture
def toy():
    with registered():
        yield TOY


@pytest.fixture
def cli(cli):
    return lambda *args: cli(*[str(a) for a in args])


@pytest.fixture(scope="session")
def federation(tmp_path_factory):
    return build_federation(tmp_path_factory.mktemp("fed"))


# One federation for every toy: cnn phones (predictions sent, models kept) and CVAE bands, on
# digits less a 300-sample public set. 15 epochs at lr 0.05 cost the phones no more time than 2
# (their shards are ~280 samples) and make them classify: 0.83-0.85 local val accuracy.
SIMULATE = [
    "simulate",
    "--dataset",
    "digits",
    "--clients",
    "4",
    "--mix",
    "smartphone:2,wristband:2",
    "--partition",
    "dirichlet:1.0",
    "--paper-models",
    "--classifier-epochs",
    "15",
    "--classifier-lr",
    "0.05",
    "--generator-epochs",
    "4",
    "--public-size",
    "300",
    "--methods",
    "toy-pick,toy-centroid,fedavg,toy-vote,toy-header",
    "--fuse-opt",
    "toy-pick:pick=1",
]


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> Path:
    """The run directory of `edgefl simulate` (local engine) of every toy, made once."""
    from typer.testing import CliRunner

    from edgefl.cli import app

    out = tmp_path_factory.mktemp("sim") / "run"
    with registered():
        r = CliRunner().invoke(app, [*SIMULATE, "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out


def _results(run: Path) -> dict[str, dict]:
    return {row["method"]: row for row in json.loads((run / "results.json").read_text())["results"]}


def test_toy_method_through_server_fuse(toy, federation, tmp_path, cli):
    out = tmp_path / "g.onnx"
    r = cli(
        "server",
        "fuse",
        federation,
        "--method",
        "toy-pick",
        "--out",
        out,
        "--eval",
        "digits",
        "--device",
        "cpu",
        "--pick",
        "1",
        "--opt",
        "scale=2",
    )
    assert r.exit_code == 0, r.output
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["picked"] == "client-001" and report["config"]["scale"] == 2.0
    assert 0.3 < report["accuracy"] <= 1.0
    methods = json.loads(cli("server", "methods", "toy-pick", "--json").stdout)
    assert methods["options"]["pick"]["constraint"] == "an integer >= 0"
    bad = cli(
        "server",
        "fuse",
        federation,
        "--method",
        "toy-pick",
        "--out",
        tmp_path / "h.onnx",
        "--pick",
        "-1",
    )
    assert bad.exit_code == 2 and "--pick must be an integer >= 0, got -1" in bad.output


def test_toy_decoder_method_through_server_fuse(toy, federation, tmp_path, cli):
    """A method that learns from the decoders alone, also defined only in this module."""
    out = tmp_path / "c.onnx"
    args = ["--method", "toy-centroid", "--out", out, "--eval", "digits", "--opt", "per_class=20"]
    r = cli("server", "fuse", federation, *args)
    assert r.exit_code == 0, r.output
    report = json.loads(out.with_suffix(".json").read_text())
    assert sorted(report["used"]) == ["client-002", "client-003"]  # the decoders, not the rest
    assert report["drawn"] > 0 and report["accuracy"] > 0.3  # chance is 0.1


def test_toy_method_through_simulate(simulated):
    rows = _results(simulated)
    assert rows["toy-pick"]["error"] is None
    assert rows["toy-pick"]["paper"] == 12.34  # its reference, read from its contract
    picked = json.loads((simulated / "global" / "toy-pick.json").read_text())["picked"]
    assert picked == "client-001"
    # The global model is that phone's upload (logits scaled): the run scores it as the upload
    # file itself scores on the test split.
    from edgefl.data import load_dataset

    test = load_dataset("digits", "test")
    upload = simulated / "uploads" / "client-001.onnx"  # the classifier it trained
    own = float((exporters.read_artifact(upload).run(test.x).argmax(1) == test.y).mean())
    assert own > 0.3 and abs(rows["toy-pick"]["accuracy"] - own) <= 1 / len(test.y)
    # Four generator epochs: the decoders' draws sit near their class means (chance: 0.1).
    assert rows["toy-centroid"]["error"] is None and rows["toy-centroid"]["accuracy"] > 0.3


def test_toy_predictions_method_through_simulate(simulated):
    """The phones send predictions on the public slice the run carved (their models stay on the
    device): the vote's student beats chance (0.1) by far, on the test split."""
    rows = _results(simulated)
    assert rows["toy-vote"]["error"] is None and rows["toy-vote"]["clients_used"] == 2
    assert rows["toy-vote"]["accuracy"] > 0.6
    report = json.loads((simulated / "global" / "toy-vote.json").read_text())
    assert report["voters"] == ["client-000", "client-001"] and report["public_samples"] == 300
    assert report["loss"][-1] < 0.5 * report["loss"][0]


def test_toy_per_client_method_through_simulate(simulated):
    """Each phone derives prototypes from the model it kept, the header comes back and is
    spliced onto that model (`personalize`), and each is tested on its own local split."""
    row = _results(simulated)["toy-header"]
    assert row["error"] is None and row["clients_used"] == 2
    assert row["metric"].startswith("mean accuracy of personalized models")
    assert row["accuracy"] > 0.5  # chance on a local split: about 0.1
    report = json.loads((simulated / "global" / "toy-header.json").read_text())
    assert sorted(report["per_client"]) == ["client-000", "client-001"]
    assert (simulated / "global" / "toy-header-header.onnx").is_file()
    personalized = sorted(p.name for p in (simulated / "personalized").iterdir())
    assert personalized == ["client-000.onnx", "client-001.onnx"]


def _vote_reference(uploads: Path, x: np.ndarray) -> np.ndarray:
    """The vote, from the upload files alone: argmax of the summed class probabilities."""
    total = sum(
        exporters.read_constant_outputs(exporters.read_artifact(p).model)["predictions"]
        for p in sorted(uploads.glob("*.onnx"))
    )
    return total.argmax(1)


def _header_reference(uploads: Path, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Per class, the count-weighted mean of the clients' prototypes, class by class."""
    sums: dict[int, np.ndarray] = {}
    counts: dict[int, int] = {}
    for p in sorted(uploads.glob("*.onnx")):
        art = exporters.read_artifact(p)
        means = exporters.read_constant_outputs(art.model)["prototypes"].astype(np.float64)
        for c, mean, n in zip(art.metadata["classes"], means, art.metadata["counts"], strict=True):
            sums[c] = sums.get(c, 0) + n * mean
            counts[c] = counts.get(c, 0) + n
    held = sorted(counts)
    assert held == list(range(classes)), held  # dirichlet:1.0: the two phones hold every digit
    mu = np.stack([sums[c] / counts[c] for c in held])
    return mu, -0.5 * (mu**2).sum(1)


def test_toy_predictions_method_through_server_fuse(toy, simulated, tmp_path, cli):
    """The simulation's predictions through `edgefl server fuse`: the student agrees with the
    vote computed here from the upload files."""
    from edgefl.data.public import load_public

    public = ["--opt", "public=digits:public", "--opt", "public_size=300"]
    out = tmp_path / "vote.onnx"
    r = cli(
        "server",
        "fuse",
        simulated / "uploads-predictions",
        "--method",
        "toy-vote",
        "--out",
        out,
        "--eval",
        "digits",
        *public,
    )
    assert r.exit_code == 0, r.output
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["voters"] == ["client-000", "client-001"] and report["accuracy"] > 0.6
    x = load_public("digits:public", public_size=300, seed=0)
    vote = _vote_reference(simulated / "uploads-predictions", x)
    agree = (exporters.read_artifact(out).run(x).argmax(1) == vote).mean()
    assert agree > 0.9, agree


def test_toy_per_client_method_through_server_fuse(toy, simulated, tmp_path, cli):
    """The simulation's prototypes through `edgefl server fuse`: the header is the nearest
    class mean computed here from the upload files."""
    from edgefl.artifacts import read_header

    out = tmp_path / "header.onnx"
    r = cli(
        "server", "fuse", simulated / "uploads-prototypes", "--method", "toy-header", "--out", out
    )
    assert r.exit_code == 0, r.output
    report = json.loads(out.with_suffix(".json").read_text())
    assert sorted(report["used"]) == ["client-000", "client-001"]
    # Two extractors trained apart: the pooled means place about half of each one's own class
    # means (chance: 0.1); spliced onto each phone's features it classifies (simulate's test).
    assert report["prototype_accuracy"] > 0.3
    mu, bias = _header_reference(simulated / "uploads-prototypes", 10)
    weight, b = read_header(str(out), mu.shape[1], 10)
    assert np.allclose(weight, mu, atol=1e-5) and np.allclose(b, bias, rtol=1e-5, atol=1e-4)


@pytest.mark.slow
@pytest.mark.serial  # Ray's workers and deadlines: alone (conftest.py)
def test_toy_methods_through_simulate_on_flower(toy, simulated, tmp_path, cli):
    """The same simulation with its clients on Flower's simulation engine (Ray): the clients
    never look a method up (each is sent its ClientJob: what to upload, whether to keep its
    model), and fusion runs in this process, where the toys are registered. The same uploads
    give every toy the local engine's accuracy."""
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    out = tmp_path / "flower"
    r = cli(*SIMULATE, "--engine", "flower", "--out", out)
    assert r.exit_code == 0, r.output
    local, flower = _results(simulated), _results(out)
    assert json.loads((out / "results.json").read_text())["engine"] == "flower"
    for m in ("toy-pick", "toy-centroid", "toy-vote", "toy-header"):
        assert flower[m]["error"] is None, flower[m]
        assert abs(flower[m]["accuracy"] - local[m]["accuracy"]) <= 1e-6, (m, flower[m], local[m])


def test_toy_methods_through_reproduce(toy, simulated, tmp_path, cli):
    """A table registered here, of the four toy methods, runs through `edgefl reproduce`: its
    cells name each toy's accuracy, and the classifier toy's paper number from its contract.
    Its one cell is the simulation above: it resumes from that run's client uploads (simulate
    refuses uploads made with other settings) and fuses every toy itself."""
    from edgefl.reproduce.tables import TABLES, Budget, Setting, Table

    budget = Budget(
        name="cpu",
        description="a test's seconds",
        partitions=("dirichlet:1.0",),
        seeds=(0,),
        estimate="seconds",
        # SIMULATE's clients
        simulate={"classifier_epochs": 15, "classifier_lr": 0.05, "generator_epochs": 4},
        fuse_options={"toy-pick": {"pick": 1}, "toy-centroid": {"per_class": 20}},
    )
    models = {"smartphone": "cnn", "wristband": "cvae-small"}
    setting = Setting("mixed", "phones and bands", models, tuple(m.name for m in TOYS))
    table = Table(
        name="toy-table",
        title="toys",
        source="made up for the test",  # the toy's Reference names this source
        dataset="digits",
        clients=4,
        mix="smartphone:2,wristband:2",
        settings=(setting,),
        budgets={"cpu": budget},
        public_size=300,  # the predictions toy's public set
    )
    cell = tmp_path / "t" / "mixed" / "dirichlet1.0-s0"
    for folder in ("uploads", "uploads-predictions"):
        shutil.copytree(simulated / folder, cell / folder)
    TABLES.add(table.name, table)
    try:
        r = cli("reproduce", "toy-table", "--out", tmp_path / "t", "--jobs", "1")
    finally:
        TABLES.remove(table.name)
    assert r.exit_code == 0, r.output
    ran = json.loads((cell / "results.json").read_text())
    assert all(c["reused"] for c in ran["clients"])  # trained once, above
    summary = json.loads((tmp_path / "t" / "table.json").read_text())
    rows = {row["method"]: row for row in summary["rows"]}
    assert list(rows) == ["toy-pick", "toy-centroid", "toy-vote", "toy-header"]
    cells = {m: rows[m]["partitions"]["dirichlet:1.0"] for m in rows}
    assert all(c["n"] == 1 and c["error"] is None for c in cells.values()), cells
    assert cells["toy-pick"]["paper"] == 12.34
    assert cells["toy-centroid"]["mean"] > 30  # chance: 10
    assert cells["toy-vote"]["mean"] > 60 and cells["toy-header"]["mean"] > 50
    # The same uploads fused again with the same options: the simulation's numbers (toy-centroid
    # draws 20 per class here, 50 there).
    local = _results(simulated)
    for m in ("toy-pick", "toy-vote", "toy-header"):
        # (the table's JSON rounds to 4 decimals)
        assert abs(cells[m]["mean"] - 100 * local[m]["accuracy"]) <= 5e-5, (m, cells[m], local[m])


# --- one ingest, many methods ----------------------------------------------------------------


def test_many_methods_ingest_each_upload_once(federation, tmp_path, cli, monkeypatch):
    seen = []
    real = edgefl.server.ingest.rebuild
    monkeypatch.setattr(
        edgefl.server.ingest,
        "rebuild",
        lambda art, **kw: seen.append(Path(art.path).name) or real(art, **kw),
    )
    before = snapshot(federation)
    r = cli(
        "server",
        "fuse",
        federation,
        "--method",
        "fedavg,ensemble,fedmho",
        "--out-dir",
        tmp_path / "g",
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--synthetic",
        "100",
        "--jobs",
        "2",
        "--eval",
        "digits",
    )
    assert r.exit_code == 0, r.output
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 4  # each upload rebuilt once
    reports = {
        m: json.loads((tmp_path / "g" / f"{m}.json").read_text())
        for m in ("fedavg", "ensemble", "fedmho")
    }
    assert {r["ingest_shared_by"] for r in reports.values()} == {3}
    assert len({r["seconds"]["ingest"] for r in reports.values()}) == 1  # the same ingest
    assert reports["fedmho"]["config"]["epochs"] == 1  # a flag goes to the methods having it
    assert "epochs" not in reports["fedavg"]["config"]
    assert all((tmp_path / "g" / f"{m}.onnx").is_file() for m in reports)
    assert snapshot(federation) == before


def test_many_methods_one_refusal_is_a_result(federation, tmp_path, cli):
    r = cli(
        "server",
        "fuse",
        federation,
        "--method",
        "fedavg,fedol",
        "--out-dir",
        tmp_path,
        "--device",
        "cpu",
    )
    assert r.exit_code == 0, r.output
    assert "refused" in r.output and (tmp_path / "fedavg.onnx").is_file()
    assert not (tmp_path / "fedol.onnx").exists()


def test_unwritable_output_fails_before_any_upload_is_read(federation, tmp_path, cli, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    read = []
    monkeypatch.setattr(edgefl.server.fuse, "ingest", lambda *a, **k: read.append(a))
    for args in (["--out-dir", blocker / "g"], ["--out", blocker / "g.onnx"]):
        methods = "fedavg,ensemble" if args[0] == "--out-dir" else "fedavg"
        r = cli("server", "fuse", federation, "--method", methods, *args)
        assert r.exit_code == 2 and "is not a writable folder" in " ".join(r.output.split())
    assert read == []


def test_many_methods_user_error_while_fusing_is_one_message(federation, tmp_path, cli):
    # The public set is read while fusing, in a worker process: its error still reaches the user.
    r = cli(
        "server",
        "fuse",
        federation,
        "--method",
        "fedavg,feddf",
        "--out-dir",
        tmp_path,
        "--device",
        "cpu",
        "--opt",
        f"feddf:public={tmp_path / 'missing.npz'}",
    )
    assert r.exit_code == 2 and "missing.npz" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--method", "fedavg,ensemble", "--out", "x.onnx"], "use --out-dir"),
        (["--method", "fedavg,ensemble"], "several methods need --out-dir"),
        (["--method", "fedavg,fedavg", "--out-dir", "g"], "distinct names"),
        (
            ["--method", "fedavg,ensemble", "--out-dir", "g", "--lam", "0.5"],
            "--lam: none of fedavg, ensemble has an option --lam",
        ),
        (
            ["--method", "fedavg,ensemble", "--out-dir", "g", "--opt", "fedmho:lam=0.5"],
            "not among --method",
        ),
    ],
)
def test_many_methods_user_errors(federation, tmp_path, monkeypatch, cli, args, message):
    monkeypatch.chdir(tmp_path)
    r = cli("server", "fuse", federation, *args)
    assert r.exit_code == 2 and message in " ".join(r.output.split())
    assert list(tmp_path.iterdir()) == []


# --- the contract, for every registered method ----------------------------------------------


def _invalid(opt) -> list:
    """Values each declaration must refuse."""
    bad: list = [object()]
    if opt.kind in ("int", "float"):
        bad += ["text", True]
        if opt.low is not None:
            bad.append(opt.low if opt.low_open else opt.low - 1)
        if opt.high is not None:
            bad.append(opt.high if opt.high_open else opt.high + 1)
    if opt.kind == "int":
        bad.append(1.5)
    if opt.choices:
        bad.append("not-a-choice")
    if opt.kind == "bool":
        bad.append("yes")
    if not opt.nullable:
        bad.append(None)
    return bad


@pytest.mark.parametrize("name", METHODS.names())
def test_every_option_is_declared_and_enforced(name):
    method = METHODS.get(name)
    method.make_config({})  # the defaults satisfy their own declarations
    for field_name, _default, opt in declared(method.config_cls):
        assert opt.help and opt.describe(), (name, field_name)
        for value in _invalid(opt):
            with pytest.raises(ConfigError) as err:
                method.make_config({field_name: value})
            flag = "--" + field_name.replace("_", "-")
            assert err.value.message.startswith(f"{flag} must be "), err.value.message
            assert err.value.hint


@pytest.mark.parametrize("name", METHODS.names())
def test_contract_fields(name):
    m = METHODS.get(name)
    assert m.description and m.paper and m.consumes
    assert m.public_data == ({"public", "public_size", "public_seed"} <= m.option_names())
    # What a device is sent to personalize with is a name it can apply.
    assert m.personalize is None or m.personalize in APPLIERS
    for ref in m.references:
        assert 0 < ref.accuracy <= 100 and ref.source
        # One number per paper and setting (two papers may print different ones for it).
        assert m.reference(ref.dataset, ref.partition, ref.clients, ref.source) == ref
    keys = [(r.dataset, r.partition, r.clients, r.source) for r in m.references]
    assert len(keys) == len(set(keys))
    # A method that says it trains nothing (and so claims no core beside others) has nothing
    # to train for: no epochs, rounds, steps or learning rate among its options.
    training = {"epochs", "rounds", "steps", "lr", "synthetic"}
    assert m.trains or not training & m.option_names(), name


@pytest.mark.parametrize("name", METHODS.names())
def test_every_budget_is_a_valid_config(name):
    m = METHODS.get(name)
    assert set(BUDGETS) == {"cpu", "paper", "code"}
    assert m.budget_options("cpu") == {}  # the defaults are the cpu budget
    cpu = m.make_config({})
    for budget in BUDGETS:
        over = m.budget_options(budget)
        cfg = m.make_config(over)  # builds, and validates against the declarations
        for key in m.option_names():  # differs from cpu exactly where the budget says
            assert getattr(cfg, key) == over.get(key, getattr(cpu, key)), (budget, key)
    with pytest.raises(ConfigError, match="--budget must be one of"):
        m.budget_options("huge")


@pytest.mark.parametrize("name", METHODS.names())
def test_code_budget_is_the_paper_with_the_codes_divergences(name):
    m = METHODS.get(name)
    paper, own = m.budget_options("paper"), m.budgets.get("code", {})
    assert m.budget_options("code") == paper | own
    defaults = m.make_config({})
    for key, value in own.items():  # each declared divergence changes the paper's value
        assert value != paper.get(key, getattr(defaults, key)), key
    if own:  # what the code budget follows is written where the method is, saying so
        assert any("--budget code" in d for d in m.divergences), m.divergences


@pytest.mark.parametrize("method", TOYS, ids=lambda m: m.name)
def test_toys_keep_every_methods_contract(toy, method):
    """The toys registered here pass the checks every built-in method passes."""
    test_every_option_is_declared_and_enforced(method.name)
    test_contract_fields(method.name)
    test_every_budget_is_a_valid_config(method.name)
    test_code_budget_is_the_paper_with_the_codes_divergences(method.name)


@pytest.mark.parametrize("name", ["fedmho", "fedmho-md", "fedmho-sd"])
def test_fedmho_code_budget_is_its_codes_twenty_epochs(name):
    """The authors' code trains 20 global epochs on MNIST where Table 7 says 10; nothing else
    in the budgets differs (their lr, batch, synthetic count and filter ratio are the paper's)."""
    m = METHODS.get(name)
    paper = m.effective_config(m.budget_options("paper"), (1, 28, 28), "mnist")
    assert paper.epochs == 10  # Table 7's MNIST column
    assert m.make_config(m.budget_options("paper")).epochs is None  # until the data is known
    assert m.budget_options("code") == {"epochs": 20}
    assert any("Softmax" in d for d in m.divergences)  # the two known, not followed
    assert any("random 80%" in d for d in m.divergences)
    assert METHODS.get("fedmho-cw").budget_options("code") == {}  # edgefl's own: no code


def test_no_method_name_outside_fusion():
    """simulate, server, flower and cli never branch on (or spell) a method's name."""
    names = set(METHODS.names())
    for pkg in ("simulate", "server", "flower", "cli"):
        for path in (ROOT / "edgefl" / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in names:
                    pytest.fail(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")


def test_layers_point_one_way():
    """No two subpackages of edgefl/ import each other; fusion imports nothing above it."""
    edges: dict[tuple[str, str], str] = {}
    for path in (ROOT / "edgefl").rglob("*.py"):
        parts = path.relative_to(ROOT / "edgefl").with_suffix("").parts
        src = parts[0] if len(parts) > 1 else None
        if src is None:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                mods = [node.module]
            for mod in mods:
                bits = mod.split(".")
                if bits[0] == "edgefl" and len(bits) > 1 and bits[1] != src:
                    edges[(src, bits[1])] = str(path)
    two_way = sorted(f"{a}<->{b}" for a, b in edges if (b, a) in edges and a < b)
    assert two_way == []
    up = sorted(
        b for a, b in edges if a == "fusion" and b in ("client", "server", "simulate", "cli")
    )
    assert up == []
