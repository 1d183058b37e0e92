"""edgefl reproduce: every registered table keeps its contract; the command runs a table end to
end (a tiny copy of FedMHO's Table 3 on digits), skips finished cells when run again, prints our
numbers beside the paper's with the gap, and refuses bad input with exit 2 before any work."""

import json
from dataclasses import fields, replace
from pathlib import Path

import pytest
from reported import onnx_accuracy

from edgefl.data.partition import parse_scheme
from edgefl.data.registry import DATASETS
from edgefl.fusion import BUDGETS, METHODS, paper_reference
from edgefl.models.parse import parse_model_arg
from edgefl.models.zoo import role_of
from edgefl.reproduce import run as rep
from edgefl.reproduce.render import table_markdown
from edgefl.reproduce.run import ReproduceJob, cells, summarize
from edgefl.reproduce.tables import FEDMHO_TABLE3, TABLES, Budget
from edgefl.simulate.job import SimJob, parse_mix
from edgefl.simulate.run import client_jobs

SIM_FIELDS = {f.name for f in fields(SimJob)}


@pytest.mark.parametrize("name", TABLES.names())
def test_table_contract(name, tmp_path):
    t = TABLES.get(name)
    info = DATASETS.get(t.dataset)
    profiles = set(parse_mix(t.mix, t.clients))
    assert {"cpu", "paper", "code"} <= set(t.budgets), "every table runs at cpu, paper, code"
    paper, code = t.budgets["paper"], t.budgets["code"]
    assert code.fusion == "code" and code.fuse_options == paper.fuse_options
    same = ("partitions", "seeds", "substitutes", "simulate")  # the paper's clients
    assert all(getattr(code, f) == getattr(paper, f) for f in same)
    assert len(t.methods) == len(set(t.methods)), "a method is judged in one setting"
    for s in t.settings:
        assert set(s.models) == profiles, f"{s.name}: a model for every device class"
        for m in s.methods:
            METHODS.get(m)
    for b in t.budgets.values():
        assert b.name in t.budgets and b.fusion in BUDGETS and b.seeds and b.partitions
        assert set(b.simulate) <= SIM_FIELDS, f"{b.name}: simulate keys are SimJob fields"
        assert b.name == "paper" or b.reductions, f"{b.name}: says what differs from the paper"
        for p in b.partitions:
            parse_scheme(p)
        for paper_model, instead in b.substitutes.items():
            assert role_of(parse_model_arg(instead, info.input_shape, info.num_classes)) == role_of(
                paper_model
            ), f"{b.name}: {instead} stands in for {paper_model}"
        for m, opts in b.fuse_options.items():
            assert m in t.methods
            METHODS.get(m).make_config(METHODS.get(m).budget_options(b.fusion) | opts)
        job = ReproduceJob(table=name, budget=b.name, out=str(tmp_path))
        for cell in cells(job, t, b):  # every cell is a valid simulation of the paper's models
            cell.sim.validate()
            assert len(client_jobs(cell.sim)) == t.clients
    # The paper's numbers come from the methods' registry entries, for the paper's partitions.
    for p in t.budgets["paper"].partitions:
        assert paper_reference(t.dataset, p, t.clients, t.source), f"no paper number at {p}"


FAST = {"epochs": 1, "synthetic": 200}
TINY = Budget(
    name="cpu",
    description="a test's few seconds",
    partitions=("dirichlet:1.0",),
    seeds=(0,),
    estimate="seconds",
    substitutes={"vgg9": "cnn", "cvae-large": "cvae-mlp:hidden=64"},
    simulate={
        "classifier_epochs": 1,
        "generator_epochs": 1,
        "classifier_optimizer": "sgd-momentum",
        "generator_optimizer": "adam",
    },
    fuse_options={
        "fedmho": FAST,
        "fedmho-md": FAST,
        "fedmho-sd": FAST,
        "fedcvae-ens": FAST,
        "feddf": {"epochs": 1},
        "dense": {"epochs": 1, "gen_steps": 2},
        "coboosting": {"epochs": 1, "gen_steps": 2},
    },
    reductions=("everything",),
)


@pytest.fixture
def tiny_table():
    """FedMHO's Table 3 with its own settings and methods, on digits with 4 clients."""
    t = replace(
        FEDMHO_TABLE3,
        name="tiny-table3",
        dataset="digits",
        clients=4,
        mix="smartphone:2,wristband:2",
        public_size=300,
        budgets={
            "cpu": TINY,
            "paper": replace(TINY, name="paper", simulate=TINY.simulate | {"classifier_epochs": 2}),
        },
    )
    TABLES.add(t.name, t)
    yield t
    TABLES.remove(t.name)


def test_reproduce_end_to_end_then_skips_finished_cells(cli, tmp_path, tiny_table, monkeypatch):
    out = tmp_path / "t3"
    r = cli("reproduce", "tiny-table3", "--out", str(out), "--jobs", "1")
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output and "[3/3]" in r.output
    summary = json.loads((out / "table.json").read_text())
    rows = {row["method"]: row for row in summary["rows"]}
    assert list(rows) == list(FEDMHO_TABLE3.methods)
    # Each method in its own setting: the baselines' clients all train classifiers, FedCVAE's
    # all train CVAEs (the large ones the budget's stand-in), the FedMHOs one of each.
    by_setting = {c["setting"]: c for c in summary["cells"]}
    assert {c["model"] for c in by_setting["classifiers"]["clients"]} == {"cnn"}
    assert [c["role"] for c in by_setting["fedcvae"]["clients"]] == ["generator"] * 4
    assert [c["model"] for c in by_setting["fedmho"]["clients"]] == ["cnn"] * 2 + ["cvae-small"] * 2
    assert rows["fedmho-md"]["setting"] == "fedmho" and rows["dense"]["setting"] == "classifiers"
    cell = rows["fedmho-sd"]["partitions"]["dirichlet:1.0"]
    assert cell["n"] == 1 and cell["std"] == 0.0
    # The cell is the accuracy its run measured (in points), not a number of its own.
    run = json.loads((out / "fedmho" / "dirichlet1.0-s0" / "results.json").read_text())
    (measured,) = [r["accuracy"] for r in run["results"] if r["method"] == "fedmho-sd"]
    assert cell["mean"] == pytest.approx(100 * measured, abs=0.01)
    assert (out / "table.png").stat().st_size > 0
    md = (out / "table.md").read_text()
    assert "| fedmho-sd | fedmho |" in md and "everything" in md
    assert (out / "fedmho" / "dirichlet1.0-s0" / "results.json").exists()

    # Run again: every cell is skipped, nothing trains or fuses.
    monkeypatch.setattr(rep, "simulate", lambda *a, **k: pytest.fail("a finished cell reran"))
    r = cli("reproduce", "tiny-table3", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert r.output.count("finished earlier, skipped") == 3

    # A narrower run would rewrite the table without the others' rows: refused, table kept.
    table = (out / "table.json").read_bytes()
    r = cli("reproduce", "tiny-table3", "--methods", "fedmho", "--out", str(out))
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "this run would rewrite it without them" in said, said
    assert "coboosting" in said and (out / "table.json").read_bytes() == table

    # Another budget's settings in the same folder: refused before any work.
    r = cli("reproduce", "tiny-table3", "--budget", "paper", "--out", str(out))
    # Read as words: the message wraps at the terminal's width, wherever the path ends.
    assert r.exit_code == 2 and "trained with other settings" in " ".join(r.output.split())
    assert "Traceback" not in r.output

    # --federation fedmho on the same folder: every method of the table on the FedMHO
    # federation's uploads, none trained again (one tiny reproduce serves both checks).
    monkeypatch.undo()
    trained = []
    real = rep.simulate

    def spy(job, log=None, **kw):
        from edgefl.simulate import pool

        before = pool._train_one
        pool._train_one = lambda c, *a: trained.append(c) or before(c, *a)
        try:
            return real(job, log, **kw)
        finally:
            pool._train_one = before

    monkeypatch.setattr(rep, "simulate", spy)
    summary = rep.reproduce(ReproduceJob(table="tiny-table3", out=str(out), federation="fedmho"))
    assert trained == []  # the FedMHO cell's uploads serve every method
    assert {r["setting"] for r in summary["rows"]} == {"fedmho"}
    rows = {r["method"]: r["partitions"]["dirichlet:1.0"] for r in summary["rows"]}
    assert rows["fedavg"]["mean"] is not None  # the classifiers share one architecture here
    assert (out / "table-fedmho-federation.md").exists() and (out / "table.md").exists()


def test_one_cell_of_the_shipped_table3_at_the_smoke_budget(cli, tmp_path):
    """The shipped fedmho-table3 itself (not a test's copy), one cell at its `smoke` budget,
    through the command a user types: the table it writes holds the accuracy the cell's global
    model scores on MNIST's test split and the paper's FedMHO number beside it."""
    out = tmp_path / "t3"
    args = ["fedmho-table3", "--budget", "smoke", "--methods", "fedmho", "--out", str(out)]
    r = cli("reproduce", *args)
    assert r.exit_code == 0, r.output
    assert "[1/1] fedmho dirichlet:0.5 seed 0" in r.output and "Traceback" not in r.output
    # Inside the cell its own steps show, named by the cell: a long fusion is never silent.
    assert "  [1/1] clients trained 10/10 done" in r.output
    assert "  [1/1] fedmho epoch 1/1 done: loss" in r.output
    summary = json.loads((out / "table.json").read_text())
    assert (summary["table"], summary["budget"]["name"]) == ("fedmho-table3", "smoke")
    assert [(row["method"], row["setting"]) for row in summary["rows"]] == [("fedmho", "fedmho")]
    (record,) = summary["cells"]
    assert [c["model"] for c in record["clients"]] == ["scnn(hidden=128,width=16)"] * 5 + [
        "cvae-small"
    ] * 5  # the table's FedMHO setting, VGG-9 replaced as the budget says
    cell = summary["rows"][0]["partitions"]["dirichlet:0.5"]
    # A real accuracy: the cell's global model file, read back and scored on MNIST's test split.
    run = Path(record["dir"])
    scored = 100 * onnx_accuracy(run / "global" / "fedmho.onnx", "mnist:test")
    assert 0 <= cell["mean"] <= 100 and cell["n"] == 1
    assert cell["mean"] == pytest.approx(scored, abs=0.01)
    # The paper's number is the shipped one (FedMHO Table 3, MNIST Dir(0.5)), the gap ours - it.
    assert cell["paper"] == 93.45 == paper_reference("mnist", "dirichlet:0.5", 10)["fedmho"]
    assert cell["gap"] == pytest.approx(cell["mean"] - 93.45)
    md = (out / "table.md").read_text()
    row = f"| fedmho | fedmho | {cell['mean']:.2f} +- 0.00 (n=1) | 93.45 | {cell['gap']:+.2f} |"
    assert row in md, md
    assert "--budget smoke --methods fedmho" in md and "not a result" in md
    assert (out / "table.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The printed table: the same row, and every reduction the budget names.
    flat = " ".join(r.output.split())
    assert f"{cell['mean']:.2f} +- 0.00 (n=1) │ 93.45 │ {cell['gap']:+.2f}" in flat, r.output
    for reduction in FEDMHO_TABLE3.budgets["smoke"].reductions:
        assert f"reduced: {' '.join(reduction.split())}" in flat


def test_methods_picks_rows_and_their_settings_only(tmp_path):
    t = FEDMHO_TABLE3
    job = ReproduceJob(table=t.name, budget="smoke", out=str(tmp_path), methods=("dense", "fedmho"))
    todo = cells(job, t, t.budgets["smoke"])
    assert [(c.setting, c.sim.methods) for c in todo] == [
        ("classifiers", ("dense",)),
        ("fedmho", ("fedmho",)),
    ]
    assert todo[0].sim.fuse_options.keys() <= {"dense"}
    summary = summarize(job, t, t.budgets["smoke"], [])
    assert [r["method"] for r in summary["rows"]] == ["dense", "fedmho"]
    assert [s["name"] for s in summary["settings"]] == ["classifiers", "fedmho"]


def test_table_shows_the_gap_to_the_paper():
    t, b = FEDMHO_TABLE3, FEDMHO_TABLE3.budgets["cpu"]
    job = ReproduceJob(table=t.name, out="unused")

    def rec(setting, seed, method, acc, error=None):
        return {
            "setting": setting,
            "partition": "dirichlet:0.5",
            "seed": seed,
            "dir": "d",
            "skipped": False,
            "seconds": {"total": 1.0},
            "clients": [],
            "results": [{"method": method, "accuracy": acc, "error": error}],
        }

    records = [
        rec("fedmho", 0, "fedmho", 0.90),
        rec("fedmho", 1, "fedmho", 0.92),
        rec("classifiers", 0, "fedavg", None, "needs one architecture"),
    ]
    summary = summarize(job, t, b, records)
    cell = {r["method"]: r for r in summary["rows"]}["fedmho"]["partitions"]["dirichlet:0.5"]
    assert cell["paper"] == paper_reference("mnist", "dirichlet:0.5", 10)["fedmho"] == 93.45
    assert cell["mean"] == pytest.approx(91.0) and cell["gap"] == pytest.approx(-2.45)
    # The JSON carries the numbers as written, not the float arithmetic's tails
    assert cell["accuracies"] == [90.0, 92.0] and cell["gap"] == -2.45 and cell["std"] == 1.4142
    md = table_markdown(summary)
    assert "| fedmho | fedmho | 91.00 +- 1.41 (n=2) | 93.45 | -2.45 |" in md
    assert "fedavg: needs one architecture" in md
    assert "refused | 85.91 | -" in md


def test_a_partial_average_says_what_it_averaged_and_has_no_gap():
    """Table 1's classifier setting: fedavg over VGG-9 and CNN clients averages one architecture
    (issue 33). Its cell says which, per seed where they differ, and is not set against the
    paper's FedAvg row (which averaged every client)."""
    t, b = FEDMHO_TABLE3, FEDMHO_TABLE3.budgets["cpu"]
    job = ReproduceJob(table=t.name, out="unused")

    def rec(seed, acc, scope):
        return {
            "setting": "classifiers",
            "partition": "dirichlet:0.5",
            "seed": seed,
            "dir": "d",
            "skipped": False,
            "seconds": {"total": 1.0},
            "clients": [],
            "results": [{"method": "fedavg", "accuracy": acc, "error": None, "scope": scope}],
        }

    same = [rec(0, 0.5, "5 of 10: vgg9 only"), rec(1, 0.7, "5 of 10: vgg9 only")]
    cell = {r["method"]: r for r in summarize(job, t, b, same)["rows"]}["fedavg"]
    cell = cell["partitions"]["dirichlet:0.5"]
    assert cell["paper"] == 85.91 and cell["gap"] is None
    md = table_markdown(summarize(job, t, b, same))
    assert "| fedavg | classifiers | 5 of 10: vgg9 only: 60.00 +- 14.14 (n=2) | 85.91 | - |" in md
    mixed = [rec(0, 0.5, "5 of 10: vgg9 only"), rec(1, 0.7, "5 of 10: cnn only")]
    md = table_markdown(summarize(job, t, b, mixed))
    assert "5 of 10: vgg9 only (seed 0); 5 of 10: cnn only (seed 1): 60.00" in md


def test_an_interrupted_table_says_it_is_partial_and_how_to_finish_it(tmp_path, monkeypatch):
    """Ctrl-C after the first of three cells: the table written then says it holds one of
    three cells, and the command it records (with --seeds and --out) is the one that finishes
    it. Finishing it writes a table that no longer says so."""
    t = FEDMHO_TABLE3
    out = tmp_path / "my table"
    job = ReproduceJob(
        table=t.name, budget="smoke", out=str(out), methods=("fedavg",), seeds=(3, 4, 5)
    )
    calls = []

    def fake(sim, log=None, progress=None):
        calls.append(sim.seed)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return {
            "seconds": {"total": 1.0},
            "clients": [],
            "results": [{"method": "fedavg", "accuracy": 0.5, "error": None}],
        }

    monkeypatch.setattr(rep, "simulate", fake)
    with pytest.raises(KeyboardInterrupt):
        rep.reproduce(job)
    summary = json.loads((out / "table.json").read_text())
    assert (summary["complete"], summary["cells_planned"], len(summary["cells"])) == (False, 3, 1)
    md = (out / "table.md").read_text()
    assert "**Partial: 1 of 3 cells finished**" in md
    command = summary["command"]
    assert command.endswith(f"--methods fedavg --seeds 3,4,5 --out '{out}'"), command
    assert command.startswith("edgefl reproduce fedmho-table3 --budget smoke")
    assert f"`{command}`" in md
    # The same job over a folder whose cells are all finished: complete, no partial line.
    calls.clear()
    monkeypatch.setattr(
        rep,
        "finished_cell",
        lambda c: {
            "seconds": {"total": 1.0},
            "clients": [],
            "results": [{"method": "fedavg", "accuracy": 0.5, "error": None}],
        },
    )
    summary = rep.reproduce(job)
    assert summary["complete"] and calls == []
    assert "Partial" not in (out / "table.md").read_text()


def test_errors_exit_2_before_any_work(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(rep, "simulate", lambda *a, **k: pytest.fail("work started"))
    a_file = tmp_path / "f"
    a_file.write_text("")
    (tmp_path / "holds" / "table.md").mkdir(parents=True)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "table.json").write_text('{"my": "precious"}')
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "table.md").write_text("# my notes")
    for args, message in (
        (["fedmho-tabel3"], "did you mean 'fedmho-table3'"),
        (["fedmho-table3", "--budget", "gpu"], "--budget must be one of cpu, smoke, paper, code"),
        (["fedmho-table3", "--methods", "fedmo"], "did you mean 'fedmho'"),
        (["fedmho-table3", "--methods", "fedmo"], "valid fedmho-table3 methods: coboosting,"),
        (["fedmho-table3", "--methods", ","], "--methods names no method"),
        (["fedmho-table3", "--out", str(a_file)], "is a file"),
        (["fedmho-table3", "--out", str(a_file / "sub")], "cannot be written"),
        (["fedmho-table3", "--out", str(tmp_path / "holds")], "table.md is a folder"),
        (["fedmho-table3", "--federation", "fedmo"], "--federation must be own or one of"),
        (["fedmho-table3", "--seeds", "0,x"], "--seeds expects comma-separated integers"),
        (["fedmho-table3", "--partitions", "dirichlet:x"], "--partitions: invalid partition"),
        # said before the first cell trains, not after it
        (["fedmho-table3", "--partitions", "dirichlet:0.5,classes:11"], "dataset has 10"),
        (["fedmho-table3", "--partitions", "dirichlet:0.5,user"], "says whose each sample is"),
        (["fedmho-table3", "--seeds", "0,0"], "--seeds names 0 more than once"),
        (["fedmho-table3", "--dataset", "fashion-mnist"], "did you mean 'fmnist'?"),
        (
            ["fedmho-table3", "--partitions", "dirichlet:0.5,dirichlet:0.50"],
            "--partitions names dirichlet:0.5 more than once",
        ),
        (["fedmho-table3", "--train-device", "tpu"], "--train-device must be auto, cpu or cuda"),
        # a user's own table files there were replaced, exit 0
        (["fedmho-table3", "--out", str(tmp_path / "mine")], "reproduce did not write"),
        (["fedmho-table3", "--out", str(tmp_path / "notes")], "notes/table.md, which"),
        (["fedmho-table3", "--seeds", "0,,1"], "--seeds expects comma-separated integers"),
        (["fedmho-table3", "--methods", "fedmho,fedmho"], "--methods names fedmho more than once"),
    ):
        r = cli("reproduce", *args, *([] if "--out" in args else ["--out", str(tmp_path / "o")]))
        assert r.exit_code == 2, (args, r.output)
        assert message in " ".join(r.output.split()), (args, r.output)
        assert "Traceback" not in r.output, (args, r.output)
    assert (tmp_path / "mine" / "table.json").read_text() == '{"my": "precious"}'
    assert (tmp_path / "notes" / "table.md").read_text() == "# my notes"


def test_lists_tables(cli):
    r = cli("reproduce")
    assert r.exit_code == 0 and "fedmho-table3" in r.output and "--budget cpu" in r.output
    assert "--budget code" in r.output


def test_simulate_client_model_per_device_class(cli, tmp_path):
    """The general option behind a paper's settings: a model per device class, any role."""
    job = SimJob(
        dataset="digits",
        clients=4,
        mix="smartphone:2,wristband:2",
        out=str(tmp_path),
        client_models={"wristband": "cnn", "smartphone": "cnn"},
        classifier_optimizer="adam",
        classifier_batch_size=8,
    )
    jobs = client_jobs(job)
    assert [(c.model, c.optimizer, c.batch_size, c.force) for c in jobs] == [
        ("cnn", "adam", 8, True)
    ] * 4
    r = cli(
        "simulate",
        "--dataset",
        "digits",
        "--clients",
        "4",
        "--mix",
        "smartphone:2,wristband:2",
        "--client-model",
        "watch=cnn",
        "--out",
        str(tmp_path),
    )
    assert r.exit_code == 2 and "no client of --mix" in r.output
    r = cli("simulate", "--client-model", "wristband", "--out", str(tmp_path))
    assert r.exit_code == 2 and "PROFILE=MODEL" in r.output


def test_simulate_clients_that_search_their_own_architecture(cli, tmp_path):
    """pFedZKD's setting: `--client-model PROFILE=search:pso` makes each such client search."""
    opts = {"particles": 2, "generations": 1, "candidate_epochs": 1, "fitness_samples": 60}
    job = SimJob(
        dataset="digits",
        clients=3,
        mix="raspberry-pi-5:2,wristband:1",
        out=str(tmp_path / "sim"),
        client_models={"raspberry-pi-5": "search:pso"},
        search_options=opts,
        classifier_epochs=1,
        methods=("ensemble",),
    )
    job.validate()
    jobs = client_jobs(job)
    assert [(c.search, c.model, c.search_options) for c in jobs[:2]] == [("pso", None, opts)] * 2
    assert jobs[2].search is None and jobs[2].search_options is None
    r = cli(
        "simulate",
        "--dataset",
        "digits",
        "--clients",
        "2",
        "--mix",
        "raspberry-pi-5:2",
        "--client-model",
        "raspberry-pi-5=search:pso",
        "--search-opt",
        "particles=2",
        "--search-opt",
        "generations=1",
        "--search-opt",
        "fitness_samples=60",
        "--search-opt",
        "candidate_epochs=1",
        "--classifier-epochs",
        "1",
        "--methods",
        "ensemble",
        "--out",
        str(tmp_path / "cli"),
        "--json",
        "--quiet",
    )
    assert r.exit_code == 0, r.output
    models = [c["model"] for c in json.loads(r.stdout)["clients"]]
    assert all(m.startswith("nas-cnn") for m in models), models  # searched, not planned
    # Each mistake is one message before any client trains.
    for args, says in (
        (["--client-model", "raspberry-pi-5=search:grid"], "unknown search"),
        (["--search-opt", "particles=2"], "no --client-model"),
        (
            ["--client-model", "raspberry-pi-5=search:pso", "--search-opt", "swarm=2"],
            "unknown search option",
        ),
        (["--client-model", "raspberry-pi-5=search:pso", "--search-opt", "particles"], "key=value"),
        (
            ["--client-model", "raspberry-pi-5=search:pso", "--search-opt", "particles=2.5"],
            "--particles must be an integer, got '2.5'",
        ),
        (
            ["--client-model", "raspberry-pi-5=search:pso", "--search-opt", "max_macs=lots"],
            "--max-macs must be an integer (or none), got 'lots'",
        ),
    ):
        r = cli(
            "simulate",
            "--dataset",
            "digits",
            "--clients",
            "2",
            "--mix",
            "raspberry-pi-5:2",
            *args,
            "--out",
            str(tmp_path / "bad"),
        )
        assert r.exit_code == 2 and says in r.output, (args, r.output)
        assert not (tmp_path / "bad" / "uploads").exists()


def test_time_left_counts_each_cell_at_its_settings_pace():
    """A table's settings differ by 10x (searched clients against CNNs): the cells left are
    each counted at their own setting's mean so far, a setting not yet run at the mean of all."""
    assert rep.time_left(["pso", "cnn"], {}) is None  # nothing run yet: no guess
    spent = {"pso": [700.0, 500.0]}
    assert rep.time_left(["pso", "pso"], spent) == 1200.0
    assert rep.time_left(["pso", "cnn"], spent) == 1200.0  # cnn not yet run: all cells' mean
    spent["cnn"] = [60.0]
    assert rep.time_left(["pso", "cnn", "cnn"], spent) == 600.0 + 120.0
