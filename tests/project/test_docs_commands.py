"""The docs pages' commands run as written (issue 34): each `edgefl ...` line of a page's bash
blocks runs in a scratch folder, in the page's order, with flags appended that shorten the work
(each in place of the page's value of its flag), the way tests/project/test_tour.py runs the README's tour.

Shortened: training to 1 epoch (`client train`, simulate's clients), fusion to 1 epoch over 600
synthetic samples where a method draws them (`--fuse-opt all:epochs=1 --fuse-opt
all:synthetic=600`, `server fuse --epochs 1 --synthetic 600`), simulate on MNIST to a 3,000-sample
subset, deploy's evaluation to 200 samples. `reproduce` lines are not run here: a paper's whole
table takes an hour (tests/reproduce/test_reproduce.py runs the same command on its tiny table; the `cpu`
line's run is recorded in the results file named in RECORDED, the `paper` and `code` lines need
a GPU). docs/flower.md's SuperLink and SuperNodes run in tests/flower/test_flower_deploy.py.
docs/deploy.md's command starts from the demo's output: `edgefl demo --quick` makes it first.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
from pathlib import Path

import pytest
from cli_lines import edgefl_lines, overridden

ROOT = Path(__file__).resolve().parents[2]
SHORTEN = {
    ("client", "train"): ["--epochs", "1"],
    ("server", "fuse"): ["--epochs", "1", "--synthetic", "600"],
    ("simulate",): [
        "--classifier-epochs",
        "1",
        "--generator-epochs",
        "1",
        "--fuse-opt",
        "all:epochs=1",
        "--fuse-opt",
        "all:synthetic=600",
        "--jobs",
        "2",
    ],
    ("deploy",): ["--eval-samples", "200"],
}
# Image datasets are cut to a subset; a user partition of windows keeps its users whole.
SUBSET = ["--subset", "3000"]
RECORDED = {
    "edgefl reproduce fedmho-table3 --budget cpu --jobs 2 --out runs/table3": (
        "bench/results/fedmho_table3_cpu.md",
        "edgefl reproduce fedmho-table3 --budget cpu",
    ),
}
TFLITE = all(importlib.util.find_spec(m) for m in ("onnx2tf", "tensorflow"))


def _commands(page: str) -> list[list[str]]:
    return [shlex.split(line) for line in edgefl_lines((ROOT / "docs" / page).read_text())]


def _key(words: list[str]) -> tuple[str, ...]:
    return next((k for k in SHORTEN if tuple(words[1 : 1 + len(k)]) == k), ())


def _run(cli, words: list[str]) -> dict:
    args = overridden(words[1:], SHORTEN.get(_key(words), []))
    if words[1] == "simulate" and "hapt" not in words:
        args = overridden(args, SUBSET)
    r = cli(*args, "--json", "--quiet")
    assert r.exit_code == 0, f"$ {shlex.join(words)}\n{r.output}"
    assert "Traceback" not in r.output
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    """docs/security.md's two commands, run in order in one folder -> (folder, reports)."""
    from typer.testing import CliRunner

    from edgefl.cli import app

    folder = tmp_path_factory.mktemp("security")
    runner = CliRunner()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        reports = [
            _run(lambda *a: runner.invoke(app, list(a)), words)
            for words in _commands("security.md")
        ]
    return folder, reports


def test_the_pages_show_what_this_test_runs():
    assert [c[1] for c in _commands("security.md")] == ["simulate", "server"]
    assert [c[1] for c in _commands("har.md")] == ["client", "simulate"]
    assert [c[1] for c in _commands("deploy.md")] == ["deploy"]
    reproduce = [shlex.join(c) for c in _commands("methods.md")]
    assert reproduce and all(c.startswith("edgefl reproduce ") for c in reproduce)


def test_security_page_names_its_attackers_and_screens_them(attacked):
    folder, (sim, fuse) = attacked
    attackers = {c["client_id"]: c["attack"] for c in sim["clients"] if c["attack"]}
    assert sorted(attackers.values()) == ["invert", "noise", "scale"], attackers
    assert json.loads((folder / "runs/attacked/attackers.json").read_text()) == attackers
    assert sim["results"] and all("screened" in r for r in sim["results"])  # the screen ran
    assert fuse["method"] == "fedmho" and (folder / "global.onnx").is_file()
    assert {s["client_id"] for s in fuse["screened"]} <= set(attackers), fuse["screened"]


def test_har_page_runs(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train, sim = (_run(cli, words) for words in _commands("har.md"))
    assert train["model"].startswith(("cnn1d", "cvae")), train["model"]
    assert {c["client_id"] for c in sim["clients"]} == {f"client-{i:03d}" for i in range(18)}
    assert {r["method"] for r in sim["results"]} == {
        "fedavg",
        "ensemble",
        "fedmho-md",
        "fedol",
        "dense",
    }


@pytest.mark.skipif(not TFLITE, reason="deploy --target tflite-micro needs onnx2tf and TensorFlow")
def test_deploy_page_deploys_the_demos_fedmho_model(cli, tmp_path, monkeypatch):
    """The page starts from the demo's output (runs/demo/global/fedmho.onnx): the demo makes it
    here, as the README says (`edgefl demo`, at its documented reduced scale `--quick`, one
    worker), and the page's command deploys that very file."""
    import exporters

    monkeypatch.chdir(tmp_path)
    r = cli("demo", "--quick", "--jobs", "1")
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    demo = tmp_path / "runs" / "demo"
    (words,) = _commands("deploy.md")
    source = tmp_path / words[2]
    assert source == demo / "global" / "fedmho.onnx"
    results = json.loads((demo / "results.json").read_text())
    fedmho = next(row for row in results["results"] if row["method"] == "fedmho")
    demo_sha = exporters.read_artifact(source).metadata["weights_sha256"]
    report = _run(cli, words)
    # What the page promises: the int8 flatbuffer, its C array and header, a JSON sidecar.
    written = {Path(f["path"]).suffix: tmp_path / f["path"] for f in report["files"]}
    assert set(written) == {".tflite", ".cc", ".h", ".json"}, report["files"]
    assert all(p.parent == tmp_path / _option(words, "--out") for p in written.values())
    flatbuffer = written[".tflite"].read_bytes()
    assert flatbuffer[4:8] == b"TFL3"
    assert all(f["bytes"] == (tmp_path / f["path"]).stat().st_size for f in report["files"])
    sidecar = json.loads(written[".json"].read_text())
    # Deployed from the demo's FedMHO model, not another run's.
    assert sidecar["source"]["method"] == "fedmho"
    assert sidecar["source"]["weights_sha256"] == demo_sha
    assert sidecar["profile"]["name"] == "wristband" and sidecar["target"] == "tflite-micro"
    assert sidecar["quantization"]["calibration"] == _option(words, "--calibrate")
    assert report["model"] == words[2] and 0 <= fedmho["accuracy"] <= 1
    assert report["eval_ref"] == _option(words, "--eval")
    accuracy = report["accuracy"]  # the int8 file against its fp32 source, on --eval-samples
    assert accuracy["samples"] == 200, accuracy
    assert 0 <= accuracy["accuracy"] <= 1 and 0 <= accuracy["accuracy_fp32"] <= 1, accuracy


def _option(words: list[str], flag: str) -> str:
    return words[words.index(flag) + 1]


@pytest.mark.parametrize("line", sorted(RECORDED))
def test_a_reproduce_line_is_the_command_its_results_recorded(line):
    page = [shlex.join(c) for c in _commands("methods.md")]
    assert line in page, f"docs/methods.md no longer shows {line!r}"
    results, recorded = RECORDED[line]
    assert recorded in (ROOT / results).read_text(), (results, recorded)
