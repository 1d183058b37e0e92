"""edgefl simulate end to end on digits: CLI, resume after an interruption, --jobs parity."""

import json
import re
from pathlib import Path

import pytest
from reported import onnx_accuracy

import exporters
from edgefl.errors import ConfigError
from edgefl.outputs import sha256_file
from edgefl.simulate import pool
from edgefl.simulate import run as sim
from edgefl.simulate.job import SimJob, even_mix
from edgefl.simulate.run import simulate

FAST = {m: {"epochs": 2, "synthetic": 300} for m in ("fedmho", "fedmho-sd", "fedcvae-ens")}


def tiny(out, **kw) -> SimJob:
    base = dict(
        dataset="digits",
        clients=4,
        mix="smartphone:2,wristband:2",
        partition="dirichlet:1.0",
        out=str(out),
        paper_models=True,
        classifier_epochs=3,
        generator_epochs=3,
        methods=("fedavg", "fedmho-sd"),
        fuse_options=FAST,
    )
    return SimJob(**(base | kw))


def upload_state(out: Path) -> dict:
    files = sorted((out / "uploads").glob("*.onnx"))
    return {
        f.name: (f.stat().st_mtime_ns, exporters.read_artifact(f).metadata["weights_sha256"])
        for f in files
    }


def test_cli_end_to_end(cli, tmp_path):
    out = tmp_path / "run"
    r = cli(
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
        "3",
        "--generator-epochs",
        "3",
        "--methods",
        "fedavg,ensemble,fedmho-md",
        "--fuse-opt",
        "all:epochs=2",
        "--fuse-opt",
        "all:synthetic=300",
        "--generator-lr",
        "0.002",
        "--out",
        str(out),
    )
    assert r.exit_code == 0, r.output
    assert "fedmho-md" in r.output and "Traceback" not in r.output
    results = json.loads((out / "results.json").read_text())
    rows = {row["method"]: row for row in results["results"]}
    assert set(rows) == {"fedavg", "ensemble", "fedmho-md"}
    for method, row in rows.items():  # the number reported is the exported file's, on test
        assert (
            abs(row["accuracy"] - onnx_accuracy(out / "global" / f"{method}.onnx", "digits:test"))
            < 2e-3
        )
    # fedavg uses only the classifiers; fedmho-md every upload (classifiers + decoders).
    assert rows["fedmho-md"]["upload_bytes"] > rows["fedavg"]["upload_bytes"]
    roles = [c["role"] for c in results["clients"]]
    assert roles == ["classifier", "classifier", "generator", "generator"]
    assert [c["training"]["lr"] for c in results["clients"]] == [0.01, 0.01, 0.002, 0.002]
    assert {c["training"]["device"] for c in results["clients"]} == {"cpu"}
    for png in ("accuracy.png", "label_distribution.png", "samples_client-002.png"):
        assert (out / png).stat().st_size > 0
    assert "| fedmho-md |" in (out / "results.md").read_text()
    # Every file the run wrote at its top level is named, in the JSON and on screen.
    written = {p.name for p in out.iterdir() if p.is_file()}
    assert {Path(f).name for f in results["files"]} == written
    assert "samples_client-003.png" in " ".join(r.output.split())


def test_cli_bad_mix(cli, tmp_path):
    r = cli(
        "simulate",
        "--dataset",
        "digits",
        "--clients",
        "4",
        "--mix",
        "smartphone:3",
        "--out",
        str(tmp_path),
    )
    assert r.exit_code == 2 and "add up to --clients" in r.output
    assert "e.g. --mix smartphone:2,wristband:2" in " ".join(r.output.split())
    # No --mix: half smartphones, half wristbands for any --clients (it said the default's 10
    # clients did not add up to 3); the next check, --attack, is what refuses this one.
    r = cli("simulate", "--dataset", "digits", "--clients", "3", "--attack", "bogus:1")
    assert r.exit_code == 2 and "--mix" not in r.output and "bogus" in r.output
    assert [even_mix(n) for n in (1, 3, 10)] == [
        "smartphone:1",
        "smartphone:2,wristband:1",
        "smartphone:5,wristband:5",
    ]
    assert SimJob(clients=3).mix == even_mix(3)  # the job's own default, not only the CLI's
    r = cli("simulate", "--methods", "fedmh", "--out", str(tmp_path))
    assert r.exit_code == 2 and "did you mean" in r.output
    r = cli("simulate", "--budget", "huge", "--out", str(tmp_path))
    assert r.exit_code == 2 and "--budget must be one of cpu, paper, code" in r.output
    # These ran: the default table for no name, --seed over the method's seed, the later value.
    for flags, says in (
        (["--methods", ""], "--methods expects distinct names, got no name"),
        (["--methods", "fedavg,fedavg"], "got a name twice"),
        (["--fuse-opt", "fedmho:seed=7"], "a simulation fuses with its --seed"),
        (["--fuse-opt", "epochs=1"], "fix: e.g. --fuse-opt fedmho:epochs=5 (one method)"),
        (
            ["--fuse-opt", "all:epochs=1", "--fuse-opt", "all:epochs=3"],
            "option 'epochs' given twice in --fuse-opt, as '1' and '3'",
        ),
    ):
        r = cli("simulate", "--dataset", "digits", *flags, "--out", str(tmp_path / "o"))
        assert r.exit_code == 2 and says in " ".join(r.output.split()), r.output
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> dict:
    """What `simulate` returns for a real (tiny) run: the structure the CLI prints."""
    out = tmp_path_factory.mktemp("finished") / "run"
    return simulate(
        tiny(out, methods=("fedavg", "ensemble"), classifier_epochs=1, generator_epochs=1)
    )


def printed_summary_problems(output: str, results: dict) -> list[str]:
    """What the CLI's summary of `results` must show, missing from `output` (empty: all there):
    each method's row with its accuracy and the paper's, each client, where the results are."""
    from edgefl.simulate.render import accuracy_text

    lines = output.splitlines()
    problems = []
    for r in results["results"]:
        paper = f"{r['paper']:.2f}" if r.get("paper") is not None else "-"
        if not any(r["method"] in ln and accuracy_text(r) in ln and paper in ln for ln in lines):
            problems.append(f"no row {r['method']} {accuracy_text(r)} {paper}")
    for c in results["clients"]:
        if not any(c["client_id"] in ln and c["model"] in ln for ln in lines):
            problems.append(f"no client row {c['client_id']} {c['model']}")
    flat = "".join(output.split())  # rich wraps a long path wherever the width ends
    if "".join(f"results in {results['job']['out']}/results.md".split()) not in flat:
        problems.append("no 'results in .../results.md'")
    return problems


def test_cli_budget_under_the_users_options(cli, tmp_path, monkeypatch, finished_run):
    """The budget's options under the user's reach the job; the stand-in returns a real run's
    results, so the command must print them (a stub returning {} hid a KeyError there)."""
    seen = {}

    def stand_in(job, log=None, progress=None, trainer=None):
        seen["job"] = job
        return finished_run

    monkeypatch.setattr(sim, "simulate", stand_in)
    assert finished_run["results"] and all(0 <= r["accuracy"] <= 1 for r in finished_run["results"])
    r = cli(
        "simulate",
        "--methods",
        "fedavg,dense",
        "--budget",
        "paper",
        "--fuse-opt",
        "dense:epochs=3",
        "--out",
        str(tmp_path),
    )
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    assert printed_summary_problems(r.output, finished_run) == [], r.output
    opts = seen["job"].fuse_options
    assert opts["dense"]["epochs"] == 3  # the user's
    assert opts["dense"]["gen_steps"] == 30 and opts["dense"]["pool_every_step"] is False
    assert opts.get("fedavg", {}) == {}  # no paper budget: its defaults are the paper's
    seen.clear()
    r = cli(
        "simulate",
        "--methods",
        "fedmho,fedmho-sd,dense",
        "--budget",
        "code",
        "--fuse-opt",
        "fedmho-sd:epochs=4",
        "--out",
        str(tmp_path),
    )
    assert r.exit_code == 0 and printed_summary_problems(r.output, finished_run) == [], r.output
    opts = seen["job"].fuse_options
    assert opts["fedmho"]["epochs"] == 20 and opts["fedmho-sd"]["epochs"] == 4  # code; user's
    assert opts["dense"]["gen_steps"] == 30  # no code divergence: its paper budget


def test_resume_after_interruption(tmp_path, monkeypatch):
    import edgefl.server.fuse as server_fuse

    out = tmp_path / "run"
    real_outcome = server_fuse._outcome

    def flaky(p, run):  # fedavg and fedmho-sd fuse in one call: the second is interrupted
        if p.method.name == "fedmho-sd":
            raise KeyboardInterrupt
        return real_outcome(p, run)

    monkeypatch.setattr(server_fuse, "_outcome", flaky)
    with pytest.raises(KeyboardInterrupt):
        simulate(tiny(out))
    before = upload_state(out)
    assert len(before) == 4 and (out / "global" / "fedavg.onnx").exists()
    assert not (out / "global" / "fedmho-sd.onnx").exists()
    assert not list((out / "global").glob("*.tmp*"))

    monkeypatch.setattr(server_fuse, "_outcome", real_outcome)
    trained = []
    real_train = pool._train_one
    monkeypatch.setattr(pool, "_train_one", lambda c, *a: trained.append(c) or real_train(c, *a))
    results = simulate(tiny(out))
    assert trained == []  # every finished upload reused, none retrained
    assert upload_state(out) == before  # nor overwritten
    assert {r["method"] for r in results["results"]} == {"fedavg", "fedmho-sd"}


def test_a_run_of_fewer_methods_does_not_replace_the_results_of_more(tmp_path, monkeypatch):
    """results.json and results.md of a run of fedavg and FedMHO-SD were replaced by a later
    run of fedavg alone into the same --out: refused before any work, the results kept."""
    from edgefl.errors import ConfigError

    out = tmp_path / "run"
    simulate(tiny(out))
    kept = (out / "results.json").read_bytes()
    monkeypatch.setattr(pool, "_train_one", lambda *a: pytest.fail("trained before refusing"))
    with pytest.raises(ConfigError, match="holds the results of fedmho-sd") as err:
        simulate(tiny(out, methods=("fedavg",)))
    assert "--methods fedavg,fedmho-sd" in err.value.hint
    assert (out / "results.json").read_bytes() == kept


def test_resume_refuses_a_different_setting(tmp_path, monkeypatch):
    """Another dataset's, federation's or subset's uploads in --out are never reused as this
    run's (a Fashion run's numbers were reported as MNIST's): refused before any training."""
    from edgefl.errors import ConfigError

    out = tmp_path / "run"
    simulate(tiny(out, methods=("fedavg",)))
    before = upload_state(out)
    monkeypatch.setattr(pool, "_train_one", lambda *a: pytest.fail("trained before refusing"))
    for change, message in (
        ({"partition": "iid"}, r"partition dirichlet:1.0 -> iid"),
        ({"dataset": "mnist", "subset": 2000}, r"dataset digits -> mnist"),
        ({"subset": 1000}, r"subset None -> 1000"),
        ({"public_size": 300}, r"public_size 0 -> 300"),  # FedDF's carve moves every shard
        ({"clients": 5, "mix": "smartphone:3,wristband:2"}, r"num_clients 4 -> 5"),
    ):
        with pytest.raises(ConfigError, match="different run") as err:
            simulate(tiny(out, methods=("fedavg",), **change))
        assert re.search(message, err.value.message), err.value.message
        assert "fresh --out" in err.value.hint
    assert upload_state(out) == before


def test_resume_refuses_uploads_trained_otherwise(tmp_path):
    from edgefl.errors import ConfigError

    out = tmp_path / "run"
    simulate(tiny(out, methods=("fedavg",), classifier_lr=0.02))
    before = upload_state(out)
    meta = exporters.read_artifact(out / "uploads" / "client-000.onnx").metadata
    assert meta["training"]["lr"] == 0.02  # the flag reaches the client
    from edgefl.profiles import get_profile

    # The smartphone profile's default for this shard: its epochs, stretched to min_steps.
    default = get_profile("smartphone").local_epochs(
        meta["training"]["samples"], meta["training"]["batch_size"]
    )
    assert default > 10
    for change, message in (
        ({"classifier_epochs": 4}, r"epochs 3 -> 4"),
        ({"classifier_epochs": None}, rf"epochs 3 -> {default}\b"),
        ({"classifier_lr": 0.05}, r"lr 0.02 -> 0.05"),
        ({"generator_lr": 0.005}, r"lr 0.001 -> 0.005"),
        ({"paper_classifier": "lenet5"}, r"model cnn -> lenet5"),
    ):
        with pytest.raises(ConfigError, match=message) as err:
            simulate(tiny(out, **({"methods": ("fedavg",), "classifier_lr": 0.02} | change)))
        assert "fresh --out" in err.value.hint
    assert upload_state(out) == before  # refused before anything was retrained or overwritten


def test_train_device_is_checked_before_training(tmp_path):
    import torch

    from edgefl.errors import ConfigError

    with pytest.raises(ConfigError, match="--train-device must be auto, cpu or cuda"):
        simulate(tiny(tmp_path / "a", train_device="tpu"))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="--train-device cuda: no CUDA") as err:
            simulate(tiny(tmp_path / "b", train_device="cuda"))
        assert "--train-device auto or cpu" in err.value.hint
    assert not (tmp_path / "a" / "uploads").exists()


@pytest.mark.parametrize(
    "flag, value",
    [
        ("classifier_lr", -1.0),
        ("generator_lr", 0.0),
        ("classifier_epochs", 0),
        ("generator_epochs", -2),
    ],
)
def test_local_schedule_flags_are_checked_before_training(tmp_path, flag, value):
    from edgefl.errors import ConfigError

    name = "--" + flag.replace("_", "-")
    # epochs > 0, a rate in (0, 1e6]: both refuse a value at or under 0
    with pytest.raises(ConfigError, match=f"{name} must be (> 0|in \\(0, )") as err:
        simulate(tiny(tmp_path / "run", **{flag: value}))
    assert name in err.value.hint
    assert not (tmp_path / "run" / "uploads").exists()


def test_a_method_reading_no_planned_upload_is_refused_before_any_client_trains(tmp_path):
    from edgefl.errors import FusionError

    # Only CVAE clients: fedavg would have nothing to average, known from the mix.
    with pytest.raises(
        FusionError,
        match="fedavg reads classifier uploads, and every client of "
        "--mix wristband:4 trains a CVAE",
    ) as err:
        simulate(tiny(tmp_path / "run", mix="wristband:4", methods=("fedavg",)))
    assert "--mix" in err.value.hint and "under --dp" not in err.value.message
    assert not (tmp_path / "run" / "uploads").exists()


def test_a_refused_method_beside_others_is_reported_not_raised(tmp_path):
    out = tmp_path / "run"
    lines: list[str] = []
    res = simulate(
        tiny(out, mix="wristband:4", methods=("fedavg", "fedcvae-ens")), log=lines.append
    )
    assert any(ln.startswith("fedavg will be refused: fedavg reads classifier") for ln in lines)
    refused, fused = res["results"]
    assert refused["accuracy"] is None and "classifier" in refused["error"]
    assert "\n" in refused["error"]  # it lists the uploads it went without, a line each
    assert fused["accuracy"] is not None
    # results.md keeps the refusal in its table row: one line, not one per upload
    (row,) = [ln for ln in (out / "results.md").read_text().splitlines() if "| fedavg |" in ln]
    assert row.startswith("| fedavg | refused: ") and row.endswith(" | - | 0.0 | 0 |")
    assert "; not used client-000.onnx" in row


def test_a_mix_the_dp_planner_made_all_cvaes_says_so(tmp_path):
    # On the digits' small shards the DP planner makes the phone a CVAE too at epsilon 0.5.
    job = tiny(
        tmp_path / "run",
        mix="smartphone:1,wristband:3",
        methods=("fedavg", "fedcvae-ens"),
        paper_models=False,
        dp="0.5",
    )
    (name,) = sim.refused_by_kinds(job)
    exc = sim.refused_by_kinds(job)[name]
    assert name == "fedavg" and "under --dp (without it some would not)" in exc.message
    assert "--client-model smartphone=" in exc.hint


def test_a_refusal_of_several_lines_is_one_table_cell():
    from edgefl.simulate.render import accuracy_text

    text = accuracy_text({"accuracy": None, "error": "none usable\n  not used a|b.onnx: x"})
    assert text == "refused: none usable; not used a\\|b.onnx: x"


def test_resume_refuses_a_global_model_fused_with_other_options(tmp_path):
    out = tmp_path / "run"
    simulate(tiny(out))
    from edgefl.errors import ConfigError

    faster = FAST | {"fedmho-sd": {"epochs": 1, "synthetic": 300}}
    with pytest.raises(ConfigError, match=r"epochs 2 -> 1") as err:
        simulate(tiny(out, fuse_options=faster))
    assert "global" in err.value.hint
    # The same options: the finished global model is reused, not refused.
    again = simulate(tiny(out))
    assert {r["method"] for r in again["results"]} == {"fedavg", "fedmho-sd"}


def test_a_global_model_fused_from_other_uploads_is_fused_again(tmp_path):
    """Deleting an upload to retrain it (what the refusal above advises) must not leave the
    global model of the old upload reported as this run's: a report names the sha256 of every
    upload it fused, and a run whose folder holds other bytes fuses that method again."""
    import onnx
    from onnx import numpy_helper

    from exporters.graph import weights_hash

    out = tmp_path / "run"
    first = simulate(tiny(out, methods=("fedavg",)))["results"][0]
    report = json.loads((out / "global" / "fedavg.json").read_text())
    path = out / "uploads" / "client-000.onnx"
    digest = {a["file"]: a["sha256"] for a in report["accepted"]}
    assert digest[path.name] == sha256_file(path)
    model = onnx.load(path)  # the same client's upload, other weights (as if retrained)
    weight = max(model.graph.initializer, key=lambda t: numpy_helper.to_array(t).size)
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * -1.0, weight.name))
    meta = exporters.read_artifact(path).metadata
    exporters.set_metadata(model, meta | {"weights_sha256": weights_hash(model)})
    onnx.save(model, path)
    lines = []
    again = simulate(tiny(out, methods=("fedavg",)), log=lines.append)["results"][0]
    assert any("fedavg: fusing again: 1 upload(s) differ" in line for line in lines), lines
    assert not again.get("reused") and again["accuracy"] != first["accuracy"]
    report = json.loads((out / "global" / "fedavg.json").read_text())
    fused = {a["file"]: a["sha256"] for a in report["accepted"]}
    assert fused[path.name] == sha256_file(path)
    lines.clear()  # nothing changed since: reused
    simulate(tiny(out, methods=("fedavg",)), log=lines.append)
    assert "reusing finished fedavg" in lines


def test_changed_uploads_names_what_differs(tmp_path):
    from edgefl.simulate.resume import changed_uploads

    for name, data in (("a.onnx", b"a"), ("b.onnx", b"b"), ("c.onnx", b"c")):
        (tmp_path / name).write_bytes(data)
    sha = {n: sha256_file(tmp_path / n) for n in ("a.onnx", "b.onnx")}
    report = {
        "accepted": [{"file": "a.onnx", "sha256": sha["a.onnx"]}, {"file": "b.onnx"}],
        "rejected": [{"file": "c.onnx", "reason": "x"}, {"file": "gone.onnx", "reason": "y"}],
    }
    # b: no digest recorded (an older report); gone: no longer there; a, c: as fused
    assert changed_uploads(report, tmp_path) == ["b.onnx", "gone.onnx"]
    (tmp_path / "d.onnx").write_bytes(b"d")
    (tmp_path / "a.onnx").write_bytes(b"A")
    assert changed_uploads(report, tmp_path) == ["a.onnx", "b.onnx", "d.onnx", "gone.onnx"]
    # A rejected file written after the report: changed (its bytes have no digest there).
    written = (tmp_path / "c.onnx").stat().st_mtime_ns
    assert "c.onnx" not in changed_uploads(report, tmp_path, since_ns=written)
    assert "c.onnx" in changed_uploads(report, tmp_path, since_ns=written - 1)


def test_jobs_2_equals_jobs_1(tmp_path):
    a = simulate(tiny(tmp_path / "a", jobs=1, methods=("fedavg",)))
    b = simulate(tiny(tmp_path / "b", jobs=2, methods=("fedavg",)))
    hashes = [{k: v[1] for k, v in upload_state(tmp_path / d).items()} for d in "ab"]
    assert hashes[0] == hashes[1]
    assert a["results"][0]["accuracy"] == b["results"][0]["accuracy"]


def test_public_data_methods(tmp_path):
    """FedOL clients upload predictions (their model stays on the device); FedDF distills on the
    same carved public split; upload bytes are reported per artifact kind."""
    out = tmp_path / "pub"
    res = simulate(
        tiny(
            out,
            methods=("ensemble", "feddf", "fedol"),
            public_size=300,
            fuse_options={"feddf": {"epochs": 2}, "fedol": {"epochs": 1, "rounds": 2}},
        )
    )
    rows = {r["method"]: r for r in res["results"]}
    assert rows["fedol"]["error"] is None and rows["feddf"]["error"] is None
    preds = sorted((out / "uploads-predictions").glob("*.onnx"))
    assert len(preds) == 2  # the two classifier clients
    meta = exporters.read_artifact(preds[0]).metadata
    assert meta["kind"] == "predictions" and meta["public_size"] == 300
    assert rows["fedol"]["upload_bytes"] == sum(p.stat().st_size for p in preds)
    # Rerun: everything reused.
    again = simulate(
        tiny(
            out,
            methods=("ensemble", "feddf", "fedol"),
            public_size=300,
            fuse_options={"feddf": {"epochs": 2}, "fedol": {"epochs": 1, "rounds": 2}},
        )
    )
    assert all(c.get("reused") for c in again["clients"])


def test_fedgh_personalized_vs_standalone(tmp_path):
    """FedGH is judged as its paper does: personalized models on each client's local test split,
    beside each client alone; prototypes are what leaves the device."""
    out = tmp_path / "gh"
    # Trained extractors (3 epochs left them near chance, 0.255, and their representations so
    # small that the header's loss barely moved: 2.306 -> 2.295 in 100 epochs, personalized 0.08).
    res = simulate(
        tiny(
            out,
            mix="smartphone:4",
            paper_models=False,
            classifier_epochs=15,
            classifier_lr=0.05,
            methods=("fedgh",),
        )
    )
    (row,) = res["results"]
    # Measured 2026-11-28: personalized 0.84, standalone 0.78 (chance 0.1); the header fits
    # 84 % of the prototypes it was trained on.
    assert row["error"] is None and row["standalone_accuracy"] > 0.6
    assert row["accuracy"] >= row["standalone_accuracy"] - 0.05
    header = json.loads((out / "global" / "fedgh-header.json").read_text())
    assert header["prototype_accuracy"] > 0.7
    protos = sorted((out / "uploads-prototypes").glob("*.onnx"))
    assert len(protos) == 4 and row["upload_bytes"] == sum(p.stat().st_size for p in protos)
    assert exporters.read_artifact(protos[0]).metadata["kind"] == "prototypes"
    assert len(list((out / "personalized").glob("*.onnx"))) == 4
    # The personalized model is the client's features with the server's header.
    report = json.loads((out / "global" / "fedgh.json").read_text())
    assert set(report["per_client"]) == {"client-000", "client-001", "client-002", "client-003"}


def test_results_md_says_what_the_clients_released():
    from edgefl.simulate.render import results_markdown

    job = dict(dataset="mnist", clients=2, partition="iid", mix="smartphone:2", seed=0)
    run = {"date_utc": "2026-12-04", "seconds": {"clients": 1.0, "fusion": 1.0}}
    run |= {"results": [], "clients": []}
    plain = results_markdown(run | {"job": job | {"paper_models": False}})
    assert "DP" not in plain and "label counts" not in plain
    dp = results_markdown(
        run | {"job": job | {"paper_models": False, "dp": "8", "label_counts": "absent"}}
    )
    assert "Clients trained DP-SGD at `--dp 8`; label counts absent." in dp


def test_uploads_made_before_the_carve_was_recorded_are_still_reused(tmp_path, monkeypatch):
    """An --out of an earlier edgefl (e.g. `make demo`'s runs/demo) holds uploads that do not
    record --subset or the public carve: resumed as before, not refused for saying nothing."""
    import onnx

    out = tmp_path / "run"
    simulate(tiny(out, methods=("fedavg",), subset=1000))
    for f in (out / "uploads").glob("*.onnx"):
        model = onnx.load(str(f))
        for prop in model.metadata_props:
            if prop.key == exporters.METADATA_KEY:
                meta = json.loads(prop.value)
                assert meta["partition"]["subset"] == 1000
                del meta["partition"]["subset"], meta["partition"]["public_size"]
                prop.value = json.dumps(meta)
        onnx.save(model, str(f))
    monkeypatch.setattr(pool, "_train_one", lambda *a: pytest.fail("an old upload was retrained"))
    (out / "results.json").unlink()
    done = simulate(tiny(out, methods=("fedavg",), subset=1000))
    assert all(c["reused"] for c in done["clients"])


def test_files_of_a_runs_names_that_no_run_wrote_are_kept(tmp_path):
    """A --out folder holding the user's own results.md, results.json or accuracy.png: simulate
    replaced them without a word. Refused before any client trains; an earlier run's own files
    are still replaced by its rerun (the resume path)."""
    from edgefl.simulate.run import check_run_files

    out = tmp_path / "run"
    out.mkdir()
    (out / "results.md").write_text("my notes")
    with pytest.raises(ConfigError, match="results.md is not an earlier run's file"):
        simulate(tiny(out))
    assert (out / "results.md").read_text() == "my notes" and not (out / "uploads").exists()
    (out / "results.md").unlink()
    (out / "accuracy.png").write_bytes(b"\x89PNG\r\n\x1a\n not edgefl's")
    with pytest.raises(ConfigError, match="accuracy.png is not an earlier run's file"):
        check_run_files(out)
    (out / "accuracy.png").unlink()
    (out / "holiday.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # not a name a run writes: kept
    (out / "results.json").write_text(json.dumps({"job": {"methods": ["fedavg"]}}))
    (out / "results.md").write_text("# edgefl simulate: an earlier run's")
    check_run_files(out)  # a run's own files: its rerun replaces them
