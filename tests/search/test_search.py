"""PSO-FedNAS (pFedZKD's client): the search space, the alignment operator, the budget as a hard
constraint (a property test over random budgets), and a tiny end-to-end search on digits whose
result exports and rebuilds like any zoo model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import exporters
from device_profiles import Profile
from edgefl.artifacts import rebuild
from edgefl.client.run import ClientJob, run_client
from edgefl.errors import BudgetError, ConfigError
from edgefl.models.nas import (
    DEFAULT_GENES,
    MAX_DEPTH,
    MIN_DEPTH,
    WINDOW_GENES,
    check_genes,
    depth,
    gene_problems,
)
from edgefl.models.plan import check_fit
from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import build_model, make_spec
from edgefl.profiles import get_profile
from edgefl.search import run_search
from edgefl.search.budget import Budget, repair, sample_feasible, tiniest
from edgefl.search.genes import align, legalize, make_target, random_genes
from edgefl.search.pso_config import PSOConfig

SHAPES = [(1, 8, 8), (1, 28, 28), (3, 32, 32)]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _profile(ram: int, frac: float, storage: int, mps: float, opt: str, batch: int, secs: float):
    return Profile(
        "random", "hypothesis budget", ram, frac, storage, mps, opt, batch, 1, secs, "test"
    )


budgets = st.builds(
    _profile,
    ram=st.integers(64 * 2**10, 64 * 2**20),
    frac=st.floats(0.1, 1.0),
    storage=st.integers(32 * 2**10, 16 * 2**20),
    mps=st.floats(1e6, 1e10),
    opt=st.sampled_from(["sgd", "sgd-momentum", "adam"]),
    batch=st.integers(1, 64),
    secs=st.floats(1.0, 600.0),
)


def _assert_valid(genes, shape):
    assert gene_problems(genes, shape) == []
    assert genes[0]["type"] == "conv" and genes[-1]["type"] == "fc"
    assert MIN_DEPTH <= depth(genes) <= MAX_DEPTH
    h = shape[1]
    for g in genes[:-1]:
        if g["type"] == "pool":
            assert h >= 2
            h //= 2
        else:
            assert 1 <= g["out"] <= 128 and g["kernel"] in (1, 3, 5, 7)
    assert h >= 1 and all(1 <= n <= 300 for n in genes[-1]["hidden"])


def test_no_fit_names_the_binding_constraint():
    """With the profile roomy and --max-macs tiny, the fix said "a larger device profile"; it
    names the cap and the least it must be, which then fits."""
    cfg = PSOConfig(max_macs=10, redraws=2)
    phone = get_profile("smartphone")
    budget = Budget(phone, (1, 28, 28), 10, samples=500, batch_size=None, max_macs=10)
    with pytest.raises(BudgetError) as err:
        sample_feasible(np.random.default_rng(0), budget, cfg)
    least = int(err.value.hint.rsplit(" ", 1)[1].replace(",", ""))
    assert err.value.hint.startswith("raise --max-macs") and f"{least:,} >" in str(err.value)
    room = Budget(phone, (1, 28, 28), 10, samples=500, batch_size=None, max_macs=least)
    assert room.fits(sample_feasible(np.random.default_rng(0), room, cfg))
    # a profile too small as well: both fixes
    tiny = _profile(2048, 0.5, 2048, 1e6, "sgd", 32, 1.0)
    budget = Budget(tiny, (1, 28, 28), 10, samples=500, batch_size=None, max_macs=10)
    with pytest.raises(BudgetError) as err:
        sample_feasible(np.random.default_rng(0), budget, cfg)
    assert "larger device profile" in err.value.hint and "--max-macs" in err.value.hint


# Found by hypothesis (2026-11-23): a 36 KiB budget where a second conv's feature map does not
# fit but a 1-unit hidden layer does; the tiniest set lacked it, so a later draw raised.
@example(
    profile=_profile(65536, 0.5625, 32768, 1e6, "sgd", 32, 1.0),
    shape=(1, 8, 8),
    samples=10,
    max_macs=None,
    seed=3,
)
@example(
    profile=_profile(65536, 0.5625, 32768, 1e6, "sgd", 32, 1.0),
    shape=(1, 8, 8),
    samples=10,
    max_macs=None,
    seed=1443,
)
@settings(
    max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    profile=budgets,
    shape=st.sampled_from(SHAPES[:2]),
    samples=st.integers(10, 6000),
    max_macs=st.one_of(st.none(), st.integers(5_000, 5_000_000)),
    seed=st.integers(0, 2**16),
)
def test_every_sampled_repaired_or_aligned_architecture_fits(
    profile, shape, samples, max_macs, seed
):
    cfg = PSOConfig(max_macs=max_macs, redraws=4)
    budget = Budget(profile, shape, 10, samples=samples, batch_size=None, max_macs=max_macs)
    rng = np.random.default_rng(seed)
    try:
        a = sample_feasible(rng, budget, cfg)
    except BudgetError:
        # Only when even the tiniest architectures of the space are over budget.
        assert not any(budget.fits(g) for g in tiniest(cfg, shape))
        return
    b = sample_feasible(rng, budget, cfg)
    moved = align(a, make_target(a, b, 0.5, rng), rng, cfg, shape)
    big = random_genes(rng, cfg, shape)  # unconstrained draw, usually far over a small budget
    for genes in (a, b, repair(moved, budget, cfg), repair(big, budget, cfg)):
        assert genes is not None
        _assert_valid(genes, shape)
        spec = ModelSpec("nas-cnn", shape, 10, {"genes": genes})
        fit = check_fit(spec, profile, samples=samples)
        assert fit.fits, fit.reasons
        if max_macs:
            from edgefl.models.cost import costs

            assert costs(spec).macs <= max_macs


@settings(max_examples=60, deadline=None, database=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=st.sampled_from(SHAPES),
    cg=st.floats(0, 1),
    max_depth=st.integers(MIN_DEPTH, MAX_DEPTH),
)
def test_alignment_always_yields_a_valid_sequence_with_the_targets_layer_types(
    seed, shape, cg, max_depth
):
    cfg = PSOConfig(max_depth=max_depth)
    rng = np.random.default_rng(seed)
    particle, pbest, gbest = (random_genes(rng, cfg, shape) for _ in range(3))
    target = make_target(pbest, gbest, cg, rng)
    moved = align(particle, target, rng, cfg, shape)
    _assert_valid(moved, shape)
    assert depth(moved) <= max_depth
    types = [g["type"] for g in moved[:-1]]
    assert types == [g["type"] for g in legalize(target, cfg, shape)[:-1]]
    # The same architecture rebuilds and runs.
    model = build_model(ModelSpec("nas-cnn", shape, 10, {"genes": moved}))
    assert model(torch.rand(2, *shape)).shape == (2, 10)


def test_align_to_itself_is_identity_and_target_follows_parents():
    cfg, shape = PSOConfig(), (1, 28, 28)
    rng = np.random.default_rng(0)
    a, b = random_genes(rng, cfg, shape), random_genes(rng, cfg, shape)
    assert align(a, a, rng, cfg, shape) == a
    assert make_target(a, b, 1.0, rng)[:-1] == b[:-1]  # Cg = 1: every layer from gBest
    assert make_target(a, b, 0.0, rng)[:-1] == a[:-1]  # Cg = 0: every layer from pBest


def test_nas_cnn_spec_round_trips_and_matches_the_paper_layers():
    genes = [
        {"type": "conv", "out": 8, "kernel": 5},
        {"type": "pool", "kind": "avg"},
        {"type": "conv", "out": 16, "kernel": 3},
        {"type": "fc", "hidden": [32, 16]},
    ]
    spec = make_spec("nas-cnn", (1, 28, 28), 10, genes=genes)
    again = ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec and again.to_json() == spec.to_json()
    model = build_model(spec)
    kinds = [type(m).__name__ for m in model.features]
    assert kinds[:3] == ["Conv2d", "BatchNorm2d", "ReLU"] and "AvgPool2d" in kinds
    assert [m.p for m in model.features if isinstance(m, torch.nn.Dropout)] == [0.3, 0.3]
    assert isinstance(model.head, torch.nn.Linear) and model.head.in_features == 16


@pytest.mark.parametrize(
    "genes, match",
    [
        ([{"type": "pool", "kind": "max"}, {"type": "fc", "hidden": []}], "gene 0 must be a conv"),
        ([{"type": "conv", "out": 4, "kernel": 3}], "last gene must be the fc"),
        ([{"type": "conv", "out": 999, "kernel": 3}, {"type": "fc", "hidden": [8]}], "1..128"),
        ([{"type": "conv", "out": 4, "kernel": 4}, {"type": "fc", "hidden": [8]}], "kernel"),
        (
            [{"type": "conv", "out": 4, "kernel": 3}]
            + [{"type": "pool", "kind": "max"}] * 4
            + [{"type": "fc", "hidden": []}],
            "would leave nothing",
        ),
        ([{"type": "conv", "out": 4, "kernel": 3}, {"type": "fc", "hidden": []}], "depth 2"),
        ("not a list", "non-empty list"),
    ],
)
def test_invalid_genes_are_config_errors(genes, match):
    with pytest.raises(ConfigError, match=match):
        check_genes(genes, (1, 8, 8))


def test_options_are_validated():
    with pytest.raises(ConfigError, match="--particles"):
        PSOConfig(particles=0)
    with pytest.raises(ConfigError, match="unknown search option.*--swarm"):
        PSOConfig.from_options({"swarm": 3})
    assert PSOConfig.from_options({"candidate-epochs": 2, "max_macs": None}).candidate_epochs == 2
    with pytest.raises(ConfigError, match="unknown --search"):
        run_search("darts", profile=get_profile("mcu"), info=None, local=None)


def test_tiny_budget_search_on_digits_exports_and_rebuilds(tmp_path):
    messages = []
    job = ClientJob(
        profile="mcu",
        dataset="digits",
        out_dir=str(tmp_path),
        num_clients=4,
        epochs=2,
        search="pso",
        search_options={"particles": 3, "generations": 2, "candidate_epochs": 1},
    )
    result = run_client(job, on_status=messages.append)
    assert result.spec.name == "nas-cnn" and result.fit.fits
    assert sum(m.startswith("generation ") for m in messages) == 3  # initial swarm + 2
    art = exporters.read_artifact(result.path)
    module, why = rebuild(art)  # also checks torch-vs-onnxruntime parity
    assert why is None and module is not None
    assert ModelSpec.from_dict(art.metadata["spec"]) == result.spec


def test_search_cli_prints_candidates_that_all_fit(cli):
    res = cli(
        "search",
        "--profile",
        "wristband",
        "--dataset",
        "digits",
        "--num-clients",
        "4",
        "--particles",
        "2",
        "--generations",
        "1",
        "--json",
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)  # progress went to stderr
    prof = get_profile("wristband")
    assert out["candidates"] and out["profile"] == "wristband"
    for cand in out["candidates"]:
        spec = make_spec("nas-cnn", (1, 8, 8), 10, genes=cand["genes"])
        assert check_fit(spec, prof, samples=out["budget"]["samples"]).fits
    assert min(c["fitness"] for c in out["candidates"]) == out["best"]["fitness"]
    bad = cli("search", "--profile", "wristband", "--dataset", "digits", "--particles", "0")
    assert bad.exit_code == 2 and "--particles" in bad.output


def test_search_save_then_client_train_spec(cli, tmp_path):
    saved = tmp_path / "best.json"
    res = cli(
        "search",
        "--profile",
        "wristband",
        "--dataset",
        "digits",
        "--num-clients",
        "4",
        "--particles",
        "2",
        "--generations",
        "1",
        "--save",
        str(saved),
        "--json",
    )
    assert res.exit_code == 0, res.output
    best = json.loads(res.stdout)
    assert best["saved"] == str(saved)
    spec = ModelSpec.from_json(saved.read_text())
    assert spec.name == "nas-cnn" and spec.params["genes"] == best["best"]["genes"]
    out = tmp_path / "up"
    res = cli(
        "client",
        "train",
        "--profile",
        "wristband",
        "--dataset",
        "digits",
        "--num-clients",
        "4",
        "--epochs",
        "1",
        "--spec",
        str(saved),
        "--out",
        str(out),
        "--json",
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    art = exporters.read_artifact(summary["path"])
    assert ModelSpec.from_dict(art.metadata["spec"]) == spec
    assert "warnings" not in summary or not any("searched" in w for w in summary["warnings"])
    # Trained on another shard than searched (the default 10 clients): said.
    res = cli(
        "client", "train", "--profile", "wristband", "--dataset", "digits", "--epochs", "1",
        "--spec", str(saved), "--out", str(tmp_path / "other"), "--json",
    )  # fmt: skip
    warned = [w for w in json.loads(res.stdout).get("warnings", []) if "was searched" in w]
    assert warned == [f"{saved} was searched with num_clients 4 (here 10): its search fitted "
                      "another shard"], warned  # fmt: skip
    res = cli(
        "client", "train", "--profile", "wristband", "--dataset", "digits", "--epochs", "1",
        "--num-clients", "4", "--partition-seed", "1", "--spec", str(saved), "--out",
        str(tmp_path / "seed1"), "--json",
    )  # fmt: skip
    warned = [w for w in json.loads(res.stdout).get("warnings", []) if "was searched" in w]
    assert warned and "partition_seed 0 (here 1)" in warned[0], warned


def test_a_spec_searched_on_sensor_windows_trains_from_its_file(cli, tmp_path):
    # Windows (C, 1, L) are searched as one-row images; the saved spec was refused by
    # `client train --spec` ("reads images, but this data is signals").
    saved = tmp_path / "win.json"
    shard = ["--dataset", "hapt", "--partition", "user", "--num-clients", "4"]
    res = cli(
        "search", "--profile", "smartphone", *shard, "--particles", "2", "--generations", "0",
        "--fitness-samples", "64", "--save", str(saved), "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    spec = ModelSpec.from_json(saved.read_text())
    assert spec.input_shape == (3, 1, 128) and spec.name == "nas-cnn"
    res = cli(
        "client", "train", "--profile", "smartphone", *shard, "--epochs", "1", "--spec",
        str(saved), "--out", str(tmp_path / "up"), "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    art = exporters.read_artifact(json.loads(res.stdout)["path"])
    assert ModelSpec.from_dict(art.metadata["spec"]) == spec
    # Pool genes leave no row of a window: refused before any build, with what to do.
    with pytest.raises(ConfigError, match="pooling a 1x128 map") as err:
        make_spec("nas-cnn", (3, 1, 128), 6, genes=DEFAULT_GENES)
    assert "edgefl search" in err.value.hint
    # `--model nas-cnn` on windows takes the image defaults' convs, unpooled.
    assert make_spec("nas-cnn", (3, 1, 128), 6).params["genes"] == WINDOW_GENES
    res = cli("models", "--dataset", "hapt", "--json")
    assert res.exit_code == 0 and "C16k3-C32k3-F64" in res.stdout, res.output


def test_search_names_the_shard_in_the_command_it_prints(cli, tmp_path):
    """It printed `client train --profile P --dataset D --spec S`: client 0 of 10 by default,
    not the client 0 of 4 searched."""
    saved = tmp_path / "best.json"
    res = cli(
        "search", "--profile", "wristband", "--dataset", "digits", "--num-clients", "4",
        "--client-index", "2", "--particles", "2", "--generations", "0", "--save", str(saved),
    )  # fmt: skip
    said = " ".join(res.output.split())
    assert res.exit_code == 0, said
    assert (
        "train it with `edgefl client train --profile wristband --dataset digits --partition "
        f"dirichlet:0.5 --num-clients 4 --client-index 2 --partition-seed 0 --spec {saved}`"
    ) in said, said


@pytest.mark.parametrize(
    "content, extra, message",
    [
        (None, [], "no such file"),
        ("{not json", [], "not valid JSON"),
        ('{"name": "nas-cnn"}', [], "missing key 'input_shape'"),
        ("[1, 2]", [], "must be a JSON object"),
        (
            '{"name": "nas-cnn", "input_shape": [1, 28, 28], "num_classes": 10, "params": {}}',
            [],
            "this dataset has input [1, 8, 8]",
        ),
        (
            '{"name": "cnn", "input_shape": [1, 8, 8], "num_classes": 10}',
            ["--model", "cnn"],
            "--spec without --model or --search",
        ),
    ],
)
def test_client_train_spec_errors_are_one_message(cli, tmp_path, content, extra, message):
    path = tmp_path / "spec.json"
    if content is not None:
        path.write_text(content)
    res = cli(
        "client",
        "train",
        "--profile",
        "wristband",
        "--dataset",
        "digits",
        "--num-clients",
        "4",
        "--epochs",
        "1",
        "--spec",
        str(path),
        "--out",
        str(tmp_path / "o"),
        *extra,
        "--json",
    )
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split()) and "Traceback" not in res.output
    assert json.loads(res.stdout)["fix"], res.output  # the fix, for every one
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_search_save_is_checked_before_the_search(cli, tmp_path):
    (tmp_path / "afile").write_text("x")
    res = cli(
        "search",
        "--profile",
        "wristband",
        "--dataset",
        "digits",
        "--particles",
        "50",
        "--generations",
        "50",
        "--save",
        str(tmp_path / "afile" / "best.json"),
    )
    assert res.exit_code == 2 and "--save" in res.output, res.output


def test_search_options_are_typed_by_their_fields_not_their_look():
    cfg = PSOConfig.from_text({"particles": "3", "cg": "1", "max-macs": "none", "p_conv": "0.5"})
    assert cfg.particles == 3 and cfg.max_macs is None
    assert isinstance(cfg.cg, float) and cfg.cg == 1.0  # "1" is a float where a float is declared
    assert PSOConfig.from_text({"fitness_samples": " 60 "}).fitness_samples == 60
    with pytest.raises(ConfigError, match="--particles must be an integer, got '3.0'"):
        PSOConfig.from_text({"particles": "3.0"})
    with pytest.raises(ConfigError, match="--cg must be a number, got 'half'"):
        PSOConfig.from_text({"cg": "half"})
    with pytest.raises(ConfigError, match="unknown search option"):
        PSOConfig.from_text({"swarm": "2"})
    with pytest.raises(ConfigError, match="--max-depth must be an integer, got 6.0"):
        PSOConfig.from_options({"max_depth": 6.0})  # the tables' path checks it too


def test_a_search_past_its_candidate_cap_is_refused_before_any_work(cli, tmp_path):
    """--particles 1000000 began a search its own estimate put at 13,339 hours."""
    from edgefl.search.pso_config import MAX_CANDIDATES, PSOConfig

    PSOConfig(particles=MAX_CANDIDATES, generations=0)  # the cap itself is allowed
    with pytest.raises(ConfigError, match="candidates to train, more than 10,000"):
        PSOConfig(particles=MAX_CANDIDATES, generations=1)
    save = tmp_path / "spec.json"
    res = cli("search", "--profile", "wristband", "--dataset", "digits", "--particles",
              "1000000", "--generations", "1000", "--save", str(save), "--json")  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "--particles 20 --generations 10" in json.loads(res.stdout)["fix"]
    assert not save.exists()
