"""Every maintained bench script at tiny scale (issue 58 item 6): a refactor must not break a
bench that a results file cites. Each script imports (pytest puts bench/ on sys.path, as
running `python bench/NAME.py` does) and builds its options; each table recorded in
bench/results/ is rendered again from its JSON and must give the recorded rows; the benches
whose measurement is cheap at a tiny size run it on a temporary folder."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
# The shared modules (no main): the record's header, the floors, the machine's peak.
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in ("_record", "_peak", "floors"))


def _recorded(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _rows(text: str) -> list[str]:
    """A markdown text's table rows, their separator lines left out."""
    return [
        line for line in text.splitlines() if line.startswith("|") and not set(line) <= set("|-: ")
    ]


def _same_rows(text: str, md: str) -> None:
    """Every table row rendered is in the recorded page (which may say more around them)."""
    rows = _rows(text)
    assert rows, text[:500]
    page = set((RESULTS / md).read_text().splitlines())
    missing = [r for r in rows if r not in page]
    # A changed table format fails here: re-render the page with the script (or say why not).
    assert not missing, f"rows not in bench/results/{md}: {missing[:3]}"


def _run_main(monkeypatch, name: str, *argv: str) -> None:
    """`python bench/NAME.py ARGV...` in this process (every main reads sys.argv)."""
    monkeypatch.setattr(sys, "argv", [f"bench/{name}.py", *argv])
    importlib.import_module(name).main()


# --- every script --------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_script_imports_and_builds_its_options(name, monkeypatch, capsys):
    with pytest.raises(SystemExit) as done:
        _run_main(monkeypatch, name, "--help")
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out


def _importable(module: str, name: str) -> bool:
    """`from module import name` would work: an attribute, or a submodule of a package."""
    found = importlib.import_module(module)
    if hasattr(found, name):
        return True
    return hasattr(found, "__path__") and importlib.util.find_spec(f"{module}.{name}") is not None


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_names_a_script_imports_late_exist(name):
    """Imports inside functions (a script's heavy or forked parts) name edgefl's modules too:
    one that a refactor moved fails here, not in the next recorded run."""
    tree = ast.parse((BENCH / f"{name}.py").read_text())
    late = [
        node
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef)
        for node in ast.walk(fn)
        if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] in ("edgefl", "exporters")
    ]
    missing = [
        f"{node.module}.{alias.name}"
        for node in late
        for alias in node.names
        if not _importable(node.module, alias.name)
    ]
    assert not missing, f"bench/{name}.py imports names that are gone: {missing}"


def test_every_script_is_listed_in_the_bench_readme():
    readme = (BENCH / "README.md").read_text()
    missing = [n for n in [*SCRIPTS, "_record", "_peak", "floors"] if f"| `{n}.py` |" not in readme]
    assert not missing, f"bench/README.md's table does not list {missing}"


def test_the_record_header_and_the_floors():
    from _record import run_header
    from floors import floors

    head = run_header("bench/x.py")
    assert {"command", "date", "machine", "commit"} <= set(head)
    assert {"typer", "rich"} <= set(floors())


# --- the recorded tables, rendered again from their JSON ------------------------------------


# Pages of one bench rendered the same way, each case named by its page's stem.
DP_SETTINGS_PAGES = (
    "dp_settings_mnist_generator",
    "dp_settings_mnist_classifier",
    "dp_settings_hapt_classifier",
    "dp_settings_mnist_sgd_rates",
    "dp_settings_hapt_sgd_rates",
    "dp_settings_mnist_generator_batch",
)
TEACHER_PASS_PAGES = (
    "teacher_pass_2000",
    "teacher_pass_2000_interleaved",
    "teacher_pass_onednn",
    "teacher_pass_onednn_archs",
)
TEACHER_PASS_GPU_PAGES = ("teacher_pass_gpu_forms", "teacher_pass_gpu")

RENDERS = {
    # case: (module, render(module, recorded JSON) -> markdown, STEM of STEM.json and STEM.md)
    **{stem: ("bench_dp_settings", lambda m, d: m.render(d), stem) for stem in DP_SETTINGS_PAGES},
    **{
        stem: ("bench_teacher_pass", lambda m, d: m.markdown(d["meta"], d["rows"]), stem)
        for stem in TEACHER_PASS_PAGES
    },
    **{
        stem: ("bench_teacher_pass", lambda m, d: m.markdown_gpu(d["meta"], d["rows"]), stem)
        for stem in TEACHER_PASS_GPU_PAGES
    },
    "datafree": ("bench_datafree", lambda m, d: m.markdown(d), "datafree"),
    "datafree_converged": ("bench_datafree", lambda m, d: m.markdown(d), "datafree_converged"),
    "datafree_coboosting": ("bench_datafree", lambda m, d: m.markdown(d), "datafree_coboosting"),
    "datafree_coboosting_adapt": (
        "bench_datafree",
        lambda m, d: m.markdown(d),
        "datafree_coboosting_adapt",
    ),
    "datafree_hapt": ("bench_datafree_hapt", lambda m, d: m.markdown(d), "datafree_hapt_fedhydra"),
    "dp_memory": ("bench_dp_memory", lambda m, d: m.render(d), "dp_memory"),
    "privacy_audit_hapt6": ("bench_privacy", lambda m, d: m.render(d), "privacy_audit_hapt6"),
    "export": ("bench_export", lambda m, d: m.markdown(d), "export"),
    "export_template": ("bench_export_template", lambda m, d: m.markdown(d), "export_template"),
    "flower": ("bench_flower", lambda m, d: m.markdown(d["rows"], d["meta"]), "flower_vgg9"),
    "flower_deploy": (
        "bench_flower_deploy",
        lambda m, d: m.markdown(d["row"], d["meta"]),
        "flower_deploy_vgg9",
    ),
    "fuse": ("bench_fuse", lambda m, d: m.markdown(d), "fuse"),
    **{
        stem: ("bench_startup", lambda m, d: m.render(d["meta"], d["rows"]), stem)
        for stem in ("startup", "startup_before")
    },
    "fuzz": ("bench_fuzz", lambda m, d: m.markdown(d), "fuzz"),
    "generator_memory": (
        "bench_generator_memory",
        lambda m, d: m.markdown(d["rows"], d["meta"]),
        "generator_memory",
    ),
    "load": ("bench_load", lambda m, d: m.markdown(d), "load"),
    "pfedzkd": ("bench_pfedzkd", lambda m, d: m.markdown(d), "pfedzkd"),
    "public": (
        "bench_public",
        lambda m, d: m.markdown(d["meta"], d["part_a"], d["part_b"]),
        "public_mnist",
    ),
    "parked": (
        "bench_parked",
        lambda m, d: m.table(d, d["upload_bytes"], d["phones"], d["methods"]),
        "parked",
    ),
    "robust_clean": (
        "bench_robust",
        lambda m, d: m.clean_markdown(d["rows"], d["meta"]),
        "robust_clean",
    ),
    "same_models": (
        "bench_same_models",
        lambda m, d: m.markdown(d["meta"], d["rows"]),
        "same_models",
    ),
    "same_models_since": (
        "bench_same_models",
        lambda m, d: m.markdown(d["meta"], d["rows"]),
        "same_models_since_69c8b9d",
    ),
    "teacher_groups": (
        "bench_teacher_groups",
        lambda m, d: m._markdown(d, d["rows"]),
        "teacher_groups",
    ),
}


def test_generator_memory_settings_of_one_federation_agree_bit_for_bit():
    """bench_generator_memory's tiny setting: the checkpointed and plain steps, same gradients."""
    bench = importlib.import_module("bench_generator_memory")
    plain, grouped = (bench._one(5, g, 4, 1) for g in (0, 2))
    assert plain["grads_sha256"] == grouped["grads_sha256"]
    assert plain["peak_rss_mib"] > 0 and grouped["s_per_step"] > 0


@pytest.mark.parametrize("case", sorted(RENDERS))
def test_a_recorded_table_renders_again(case):
    module, render, stem = RENDERS[case]
    text = render(importlib.import_module(module), _recorded(f"{stem}.json"))
    _same_rows(text, f"{stem}.md")


def test_datafree_render_mode(monkeypatch, tmp_path):
    """`bench_datafree.py --render JSON... --out STEM`: rows of several runs merged."""
    runs = [RESULTS / "datafree_coboosting.json"]
    _run_main(
        monkeypatch, "bench_datafree", "--render", *map(str, runs), "--out", str(tmp_path / "d")
    )
    _same_rows((tmp_path / "d.md").read_text(), "datafree_coboosting.md")


@pytest.mark.parametrize(
    ("name", "stem", "argv"),
    [
        ("bench_robust", "robust", ["--render"]),
        ("bench_hapt", "hapt", ["--render"]),
    ],
)
def test_render_modes_rewrite_the_page_from_its_json(name, stem, argv, monkeypatch, tmp_path):
    shutil.copy(RESULTS / f"{stem}.json", tmp_path / f"{stem}.json")
    _run_main(monkeypatch, name, *argv, "--out", str(tmp_path / stem))
    _same_rows((tmp_path / f"{stem}.md").read_text(), f"{stem}.md")


def test_dp_settings_trains_both_roles_at_dp_sgds_default_batch(monkeypatch, tmp_path):
    out = tmp_path / "dp"
    _run_main(
        monkeypatch, "bench_dp_settings", "--dataset", "mnist", "--epochs", "1", "--subset",
        "300", "--setting", "generator/cvae-mlp:hidden=8/0/1e-2/adam", "--setting",
        "classifier/mlp:hidden=8/32/1e-2/adam", "--out", str(out),
    )  # fmt: skip
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    # BATCH 0: n/6 of 300 samples (over the band's 16); BATCH 32 as named
    assert [(r["batch"], r["steps"]) for r in rows] == [(50, 6), (32, 10)]
    assert all(0 <= r["accuracy"] <= 100 and r["noise_multiplier"] > 0 for r in rows)
    assert out.with_suffix(".md").read_text().count("| generator/") == 1
    with pytest.raises(SystemExit) as bad:  # a malformed setting: refused before any data loads
        _run_main(monkeypatch, "bench_dp_settings", "--setting", "generator/cvae-small/0")
    assert bad.value.code == 2


def test_privacy_render_mode(monkeypatch, tmp_path):
    shutil.copy(RESULTS / "privacy_audit.json", tmp_path / "p.json")
    _run_main(monkeypatch, "bench_privacy", "--render", str(tmp_path / "p.json"))
    _same_rows((tmp_path / "p.md").read_text(), "privacy_audit.md")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--epsilons", "0"], "--epsilons: each must be a number > 0"),
        (["--epsilons", "none,abc"], "--epsilons: numbers or none"),
        (["--samples", "0"], "--samples must be >= 1"),
        (["--shadows", "1"], "--shadows must be >= 2"),  # was refused after training
    ],
)
def test_privacy_bad_options_exit_2_before_any_training(argv, says, monkeypatch, capsys):
    with pytest.raises(SystemExit) as done:
        _run_main(monkeypatch, "bench_privacy", *argv, "--out", "/nonexistent/x")
    assert done.value.code == 2 and says in capsys.readouterr().err


def test_fedmho_code_rerender_mode(monkeypatch, tmp_path):
    shutil.copy(RESULTS / "fedmho_code_budget.json", tmp_path / "c.json")
    _run_main(
        monkeypatch,
        "bench_fedmho_code",
        "unused-run",
        "--rerender",
        "--record",
        str(tmp_path / "c"),
    )
    _same_rows((tmp_path / "c.md").read_text(), "fedmho_code_budget.md")


def test_scale_merge_mode(monkeypatch, tmp_path):
    """`bench_scale.py --merge JSON... --out STEM`: one record of several runs, growth fitted."""
    runs = [RESULTS / "scale_held_10k.json", RESULTS / "scale_parked_10k.json"]
    _run_main(monkeypatch, "bench_scale", "--merge", *map(str, runs), "--out", str(tmp_path / "s"))
    merged = json.loads((tmp_path / "s.json").read_text())
    assert len(merged["runs"]) == 2
    assert len(merged["rows"]) == sum(len(_recorded(p.name)["rows"]) for p in runs)
    text = (tmp_path / "s.md").read_text()
    assert _rows(text) and all(r["command"] in text for r in merged["runs"])
    # recorded before the peak was measured: no peak, every stage's rate "-" (issue 59)
    assert text.count("not measured") == 2
    assert "| 10,000 | fedmho-md | teacher | 589.11 | - | - | - |" in text


def test_scale_gpu_stages_against_the_gpu():
    """A `--device cuda` fusion's teacher pass is measured against the GPU's matmul, its ingest
    against the CPU's copy; recorded without a GPU peak, the fraction is unknown (None, shown
    as such), never a CPU fraction (it read 1,350 % of the CPU's matmul)."""
    import bench_scale as b

    row = {
        "device": "cuda",
        "stages": {"ingest": 2.0, "teacher": 1.0},
        "work": {"ingest": {"bytes": 8e9}, "teacher": {"macs": 1e12}},
    }
    cpu = {"threads": 1, "matmul_gmacs": 50.0, "copy_gbs": 10.0}
    gpu = cpu | {"device": {"name": "GPU", "matmul_gmacs": 2e4, "copy_gbs": 4e3}}
    assert b.stage_rates(row, gpu)["teacher"]["of_matmul"] == pytest.approx(1000 / 2e4)
    assert b.stage_rates(row, gpu)["ingest"]["of_copy"] == pytest.approx(4 / 10)
    assert b.stage_rates(row, cpu)["teacher"]["of_matmul"] is None
    assert b.stage_rates(row | {"device": "cpu"}, cpu)["teacher"]["of_matmul"] == 20.0
    assert b._achieved({"gmac_s": 1e3, "of_matmul": None})[1].startswith("- (on the GPU")
    # an old GPU record (no "device" in its rows) merged: its GPU stages lose the CPU fraction
    old = {
        "command": "python bench/bench_scale.py --device cuda",
        "peak": cpu,
        "rows": [dict(row, rates=b.stage_rates(row | {"device": "cpu"}, cpu))],
    }
    del old["rows"][0]["device"]
    b._mark_gpu_rows(old)
    rates = old["rows"][0]["rates"]
    assert old["rows"][0]["device"] == "cuda" and rates["teacher"]["of_matmul"] is None
    assert rates["ingest"]["of_copy"] == pytest.approx(0.4)


def test_scale_stage_work_counts():
    """Each counted stage's work is the cost model's count of what the report says it ran."""
    import bench_scale as b

    from edgefl.models.cost import costs

    cnn, scnn, band = (
        b._spec(c).to_json() for c in ("client-00000", "client-00005", "client-00001")
    )
    cnn, scnn = costs(b.ModelSpec.from_json(cnn)).macs, costs(b.ModelSpec.from_json(scnn)).macs
    decoder = b._decoder_macs(band)
    assert 0 < decoder < costs(b.ModelSpec.from_json(band)).macs  # the decoder alone
    accepted = [
        {"client_id": f"client-{i:05d}", "kind": "classifier" if i % 5 == 0 else "decoder"}
        for i in range(11)
    ]
    phones, bands = ["client-00000", "client-00005", "client-00010"], ["client-00001"]
    spec = b._spec("client-00000")  # a cnn global model
    ens = b.stage_work("ensemble", {"members": phones, "eval": {"samples": 100}}, None, 7)
    assert ens == {"ingest": {"bytes": 7}, "eval": {"macs": 100 * (2 * cnn + scnn)}}
    rep = {
        "accepted": accepted,
        "used": phones + bands,
        "synthetic_per_decoder": {"client-00001": [3, 4]},
        "synthetic_per_class": [3, 4],
        "loss_history": [1.0, 0.5],
    }
    cw = b.stage_work("fedmho-cw", rep, spec, 7)
    assert cw["generate"] == {"macs": 7 * decoder}
    assert cw["teacher"] == {"macs": 7 * (2 * cnn + scnn)}  # every classifier teaches
    assert cw["train"] == {"macs": 3 * 7 * 2 * cnn}  # forward + backward, 2 epochs
    assert "initialise" not in cw and "eval" not in cw
    cvae = {"synthetic_per_client": {"client-00001": 7}, "synthetic_per_class": [3, 4]}
    cvae = b.stage_work("fedcvae-ens", cvae | {"loss_history": [1.0]}, spec, 7)
    assert cvae["generate"] == {"macs": 7 * decoder} and cvae["train"] == {"macs": 3 * 7 * cnn}
    zkd = {"teachers": [{"client_id": "client-00005", "images": 4}], "mixes": 4}
    zkd = b.stage_work("pfedzkd", zkd | {"loss_history": [1.0]}, spec, 7)
    assert zkd["label"] == {"macs": 8 * scnn} and zkd["distill"] == {"macs": 3 * 8 * cnn}
    # a stage without counted work has no rate; rates against the larger measurement
    row = {"stages": {"ingest": 2.0, "teacher": 1.0, "export": 1.0}, "work": cw | ens}
    peak = {"threads": 1, "matmul_gmacs": 1.0, "matmul_gmacs_after": 2.0, "copy_gbs": 4.0}
    rates = b.stage_rates(row, peak)
    assert set(rates) == {"ingest", "teacher"}
    assert rates["teacher"]["of_matmul"] == pytest.approx(7 * (2 * cnn + scnn) / 1e9 / 2, 1e-3)
    assert rates["ingest"] == {"gb_s": 3.5e-9, "of_copy": 8.75e-10}


@pytest.mark.slow
def test_scale_tiny_against_the_peak(monkeypatch, tmp_path):
    """A 3-upload federation, one short fedmho-md: the run's peak (before and after) and each
    counted stage's rate against it in the JSON and the page; merged with a run recorded
    before the peak was measured, each keeps its own."""
    import functools

    import bench_scale

    small = functools.partial(bench_scale.machine_peak, n=256, mib=8, repeats=2)
    monkeypatch.setattr(bench_scale, "machine_peak", small)
    out = tmp_path / "s"
    _run_main(
        monkeypatch,
        "bench_scale",
        *("--sizes", "3", "--methods", "fedmho-md:epochs=1", "--jobs", "1", "--build-jobs", "2"),
        *("--work", str(tmp_path / "w"), "--out", str(out), "--timeout", "120"),
    )
    record = json.loads(out.with_suffix(".json").read_text())
    peak = record["peak"]
    assert {"threads", "matmul_gmacs", "matmul_gmacs_after", "copy_gbs", "copy_gbs_after"} <= set(
        peak
    )
    assert peak["matmul_gmacs"] > 0 and peak["copy_gbs"] > 0
    (row,) = record["rows"]
    assert row.get("rc") == 0, row  # the uploads two build processes made were all accepted
    assert record["federations"]["3"]["build_jobs"] == 2 and row["used"] == 3
    with pytest.raises(SystemExit) as bad:  # no build process: refused before any work
        _run_main(monkeypatch, "bench_scale", "--build-jobs", "0", "--work", str(tmp_path / "z"))
    assert bad.value.code == 2 and not (tmp_path / "z").exists()
    work, rates = row["work"], row["rates"]
    assert {"ingest", "initialise", "generate", "teacher", "train", "eval"} <= set(work)
    assert work["train"]["macs"] == 3 * work["teacher"]["macs"]  # 1 cnn teacher, 1 epoch
    for stage in ("teacher", "train", "eval"):
        assert rates[stage]["gmac_s"] > 0 and rates[stage]["of_matmul"] > 0
    assert rates["ingest"]["gb_s"] > 0 and rates["ingest"]["of_copy"] > 0
    text = out.with_suffix(".md").read_text()
    assert "% of matmul |" in text and "% of copy |" in text
    assert f"dense fp32 matmul {peak['matmul_gmacs']} / {peak['matmul_gmacs_after']} GMAC/s" in text
    merged = tmp_path / "m"
    old = RESULTS / "scale_held_10k.json"
    _run_main(
        monkeypatch, "bench_scale", "--merge", str(out) + ".json", str(old), "--out", str(merged)
    )
    both = json.loads(merged.with_suffix(".json").read_text())
    assert [r.get("peak") for r in both["runs"]] == [peak, None]
    assert both["rows"][0]["rates"] == rates
    page = merged.with_suffix(".md").read_text()
    assert "% of matmul |" in page and "not measured" in page
    # the ingest bench on the same uploads: timed at two --jobs, two files profiled
    uploads = tmp_path / "w" / "n3" / "uploads"
    _run_main(
        monkeypatch, "bench_ingest", str(uploads), "--jobs", "1,2", "--profile", "2",
        "--out", str(tmp_path / "i"),
    )  # fmt: skip
    ingest = json.loads((tmp_path / "i.json").read_text())
    assert [r["jobs"] for r in ingest["runs"]] == [1, 2]
    assert all(r["accepted"] == 3 and r["stages_s"]["rebuild"] > 0 for r in ingest["runs"])
    prof = ingest["profile"]
    assert prof["uploads"] == 2 and prof["run"]["accepted"] == 2
    assert any("_rebuilt" in r["function"] for r in prof["by_total"]), prof["by_total"]
    assert sorted(p.name for p in uploads.iterdir()) == [f"client-0000{i}.onnx" for i in range(3)]


@pytest.mark.slow
def test_teacher_pass_tiny(monkeypatch, tmp_path):
    """Its peak (from bench/_peak.py), both passes and the record, at a tiny size."""
    import torch

    threads = torch.get_num_threads()  # --threads sets this process's torch: restored after
    try:
        _run_main(
            monkeypatch,
            "bench_teacher_pass",
            *("--teachers", "3", "--samples", "8", "--threads", "1", "--ort", "1"),
            *("--rounds", "2", "--out", str(tmp_path / "tp")),
        )
    finally:
        torch.set_num_threads(threads)
    (row,) = json.loads((tmp_path / "tp.json").read_text())["rows"]
    # the two passes took turns over two slices of the teachers (one and two), and agree
    assert row["teachers"] == 3 and row["rounds"] == 2 and row["max_abs_diff"] < 1e-4
    assert row["matmul_gmacs"] > 0 and row["copy_gbs"] > 0 and row["form_of_peak"] > 0
    assert row["ort_teachers"] == 1 and row["ort_gmacs"] > 0
    page = (tmp_path / "tp.md").read_text()
    assert "| cnn | 3 x 8 | 1 |" in page and f"| {row['ort_gmacs']} (1) |" in page
    with pytest.raises(SystemExit) as bad:  # no rounds: refused before any pass runs
        _run_main(monkeypatch, "bench_teacher_pass", "--rounds", "0")
    assert bad.value.code == 2
    with pytest.raises(SystemExit) as bad:  # a device it does not know: refused likewise
        _run_main(monkeypatch, "bench_teacher_pass", "--device", "xyz")
    assert bad.value.code == 2


def test_stacked_teacher_pass_agrees_with_the_plain_one():
    """The GPU run's third pass (stacked weights, vmapped), checked here on the CPU: the same
    mean logits up to float rounding, over more teachers than one stack holds."""
    from types import SimpleNamespace

    import bench_teacher_pass as b
    import torch

    from edgefl.models.parse import parse_model_arg
    from edgefl.models.zoo import build_model

    spec = parse_model_arg("cnn", (1, 28, 28), 10)
    torch.manual_seed(0)
    ups = [SimpleNamespace(module=build_model(spec).eval()) for _ in range(5)]
    x = torch.rand(7, 1, 28, 28)
    stacked = b._stacked_pass(ups, x, group=2, batch=3)
    assert stacked.shape == (7, 10)
    assert (stacked - b._plain_pass(ups, x)).abs().max() < 1e-5


# --- tiny measurements ---------------------------------------------------------------------


@pytest.mark.slow
def test_teacher_groups_tiny(monkeypatch, tmp_path):
    """Its whole path: one setting in a child process, the record written."""
    _run_main(
        monkeypatch,
        "bench_teacher_groups",
        *("--teachers", "2", "--samples", "10", "--groups", "1", "--kinds", "mean"),
        *("--out", str(tmp_path / "tg")),
    )
    rows = json.loads((tmp_path / "tg.json").read_text())["rows"]
    assert [(r["teachers"], r["samples"], r["group"], r["kind"]) for r in rows] == [
        (2, 10, 1, "mean")
    ]
    assert "| 2 | 10 | mean | 1 |" in (tmp_path / "tg.md").read_text()


@pytest.mark.slow
def test_fedhydra_targets_tiny(monkeypatch, tmp_path):
    """Its targets scored on real digits, and its student the one `server fuse` keeps with the
    same options and seed (the bench's stratification is the fusion's)."""
    from fed_fixtures import build_classifier_only, fuse_digits

    ups = build_classifier_only(tmp_path)
    tiny = {"epochs": 2, "gen_steps": 2, "batch_size": 16, "nz": 8, "ngf": 4}
    tiny |= {"strat_steps": 2, "strat_batch": 8, "max_gen_steps": 3, "val_size": 32}
    opts = [f"--opt={k}={v}" for k, v in tiny.items()]
    out = tmp_path / "ft"
    argv = [str(ups), "--eval", "digits", "--fuse", *opts, "--out", str(out)]
    _run_main(monkeypatch, "bench_fedhydra_targets", *argv)
    (row,) = json.loads(out.with_suffix(".json").read_text())["rows"]
    cols = ("logit_mean", "prob_mean", "cw_target", "sa_true_label", "student")
    assert all(0 <= row[c] <= 100 for c in cols), row
    report = fuse_digits(ups, tmp_path, "fedhydra", **tiny)
    assert row["student"] == round(100 * report["eval"]["accuracy"], 2)
    assert row["kept"] == report["student"]
    assert f"| {ups} | 2 |" in out.with_suffix(".md").read_text()


def test_teacher_groups_cw_teacher_in_process(monkeypatch):
    """The class-wise teacher kind (fedmho-cw's `_teacher`), which the child above skips."""
    import bench_teacher_groups

    from edgefl.fusion import teachers

    monkeypatch.setattr(teachers, "TEACHER_GROUP", teachers.TEACHER_GROUP)  # _one sets it
    row = bench_teacher_groups._one(3, 8, 2, "both")
    assert row["teachers"] == 3 and row["kind"] == "both" and row["checksum"] == row["checksum"]


def test_stacked_teachers_tiny(monkeypatch, tmp_path):
    _run_main(
        monkeypatch,
        "bench_stacked_teachers",
        *("--archs", "cnn", "--teachers", "2", "--samples", "8", "--threads", "1"),
        *("--repeats", "1", "--out", str(tmp_path / "st")),
    )
    (row,) = json.loads((tmp_path / "st.json").read_text())["rows"]
    assert row["arch"] == "cnn" and row["max_abs_diff"] < 1e-4  # the two ways agree
    assert "| cnn | 1 |" in (tmp_path / "st.md").read_text()


@pytest.mark.slow
def test_startup_tiny(monkeypatch, tmp_path):
    bench = importlib.import_module("bench_startup")
    monkeypatch.setattr(bench, "COMMANDS", (["--version"],))
    monkeypatch.setattr(bench, "MODULES", ("json",))
    _run_main(monkeypatch, "bench_startup", "--repeat", "2", "--out", str(tmp_path / "s"))
    rows = json.loads((tmp_path / "s.json").read_text())["rows"]
    assert [r["what"] for r in rows] == ["edgefl --version", "import json"]
    assert all(len(r["seconds"]) == 2 and r["median"] > 0 for r in rows)
    assert "| `edgefl --version` |" in (tmp_path / "s.md").read_text()


def test_fuzz_tiny(tmp_path):
    """20 items of the recorded sources through validation, rebuild and the downstream stage
    (the unmutated sources first: each method fuses them), one worker."""
    import bench_fuzz

    out = tmp_path / "fz"
    bench_fuzz.main(
        [
            *("--n", "20", "--jobs", "1", "--pipeline-every", "0", "--every", "10"),
            *("--uploads", str(RESULTS / "fuzz_sources"), "--out", str(out)),
        ]
    )
    state = json.loads(out.with_suffix(".json").read_text())
    counts = state["counts"]
    assert sum(counts.values()) == 20, counts
    assert counts.get("accepted", 0) + counts.get("rejected", 0) == 20, counts
    assert "| downstream-failed | 0 |" in out.with_suffix(".md").read_text()


@pytest.mark.slow
def test_export_template_tiny(monkeypatch, tmp_path):
    """A kept graph's file is byte-identical to a fresh trace's (the bench stops otherwise)."""
    import bench_export_template

    monkeypatch.setenv("EDGEFL_CACHE_DIR", "off")  # a fresh trace, not the disk's graph
    row = bench_export_template.bench("cnn", (1, 8, 8), 10, 1, tmp_path)
    assert row["bytes"] > 0 and set(row["median_s"]) == {"template", "trace"}


@pytest.mark.slow
def test_export_one_model_tiny(tmp_path):
    """One small model through export, int8, ORT and torch timing, and the on-device probe."""
    import bench_export

    row = bench_export.bench_model("mlp", {1: 1, 64: 1}, tmp_path, set())
    assert row["fp32_bytes"] > row["int8_bytes"] > 0
    assert set(row["latency_ms"]) == {"1", "64"}
    assert row["on_device_peak_rss_mib"]["fp32"] is not None
    assert "| mlp | classifier |" in bench_export.markdown(
        _recorded("export.json") | {"results": [row]}
    )


def test_same_models_fingerprints_ignore_only_the_timing(tmp_path):
    """bench_same_models: an upload's training seconds do not change its fingerprint; a weight
    or another metadata field does; a global model is its file's bytes."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    bench = importlib.import_module("bench_same_models")

    def write(folder: str, weight: float, seconds: float, epochs: int = 1) -> Path:
        w = numpy_helper.from_array(np.full((2,), weight, "float32"), "w")
        graph = helper.make_graph(
            [helper.make_node("Add", ["x", "w"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
            [w],
        )
        model = helper.make_model(graph)
        meta = {"client_id": "c", "training": {"seconds": seconds, "epochs": epochs}}
        helper.set_model_props(model, {"edgefl": json.dumps(meta)})
        path = tmp_path / f"{folder}-{weight}-{seconds}-{epochs}" / folder / "m.onnx"
        path.parent.mkdir(parents=True)
        onnx.save(model, str(path))
        return path

    base = bench.fingerprint(write("uploads", 1.0, 1.25))
    assert bench.fingerprint(write("uploads", 1.0, 0.98)) == base
    assert bench.fingerprint(write("uploads", 1.5, 1.25)) != base
    assert bench.fingerprint(write("uploads", 1.0, 1.25, epochs=2)) != base
    assert bench.fingerprint(write("global", 1.0, 1.25)) != bench.fingerprint(
        write("global", 1.0, 0.98)
    )
    rows = bench.compare({"a": {"f": "1 w", "g": "2 w", "h": "3 v"}, "b": {"f": "1 w", "h": "4 v"}})
    assert [(r["file"], r["same"], r["same_weights"]) for r in rows] == [
        ("f", True, True),
        ("g", False, False),
        ("h", False, True),  # metadata apart, the same graph and weights
    ]
    path = write("global", 2.0, 1.0)
    assert bench.weights_fingerprint(path) == bench.weights_fingerprint(
        write("uploads", 2.0, 3.0, epochs=5)
    )
    assert "1 of 3 files the same" in bench.markdown(
        {"commits": ["a", "b"], "command": "c", "date": "d", "machine": "m"}, rows
    )


def test_stage_memory_tags_each_sample_with_the_last_line(tmp_path, monkeypatch):
    """bench_stage_memory on a child that holds 64 MiB only after its second line: the peak
    lands in that phase, and the record renders from its JSON."""
    child = (
        "import sys, time\n"
        "print('loading 1/2', file=sys.stderr, flush=True); time.sleep(0.6)\n"
        "print('holding 2/2', file=sys.stderr, flush=True)\n"
        "x = bytearray(64 * 2**20); x[::4096] = b'1' * len(x[::4096]); time.sleep(0.6)\n"
    )
    out = tmp_path / "m"
    _run_main(
        monkeypatch, "bench_stage_memory", "--out", str(out), "--every", "0.1", "--",
        sys.executable, "-c", child,
    )  # fmt: skip
    record = json.loads(out.with_suffix(".json").read_text())
    peaks = {p["phase"]: p["peak_mib"] for p in record["phases"]}
    assert record["rc"] == 0 and list(peaks)[-2:] == ["loading", "holding"]
    assert peaks["holding"] > peaks["loading"] + 50
    bench = importlib.import_module("bench_stage_memory")
    assert out.with_suffix(".md").read_text() == bench.render(record)


@pytest.mark.parametrize(
    "stem", sorted(p.stem for p in RESULTS.glob("datafree_committee_10k_pfedzkd_*.json"))
)
def test_stage_memory_records_render_as_recorded(stem):
    bench = importlib.import_module("bench_stage_memory")
    text = bench.render(_recorded(f"{stem}.json"))
    assert text == (RESULTS / f"{stem}.md").read_text()
