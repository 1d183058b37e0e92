"""The README's first command (issue 55): `edgefl demo` itself, run as a user runs it (a real
process, piped, 80 columns), at the reduced scale of `--quick`; `.ci/run` runs the full one. It
crashed for three days of green CI (FedMHO's lr, unset until the input is known, compared with a
float) because nothing ran it. Checked: what it promises, not only its exit code."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from cli_lines import parses

from edgefl.fusion import DEFAULT_METHODS, METHODS

EDGEFL = str(Path(sys.executable).parent / "edgefl")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("demo")
    env = os.environ | {"COLUMNS": "80", "NO_COLOR": "1"}
    run = subprocess.run(
        [EDGEFL, "demo", "--quick", "--out", "runs/demo", "--jobs", "1"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return cwd, run


def test_it_runs_to_the_end_without_an_error(demo):
    _, run = demo
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    text = run.stdout + run.stderr
    assert "Traceback" not in text and "error:" not in text.lower()
    assert "Where everything is, and what to try next" in run.stdout


def test_every_method_leaves_a_global_model_onnxruntime_runs(demo):
    cwd, _ = demo
    out = cwd / "runs" / "demo"
    for name in DEFAULT_METHODS:
        model = out / "global" / f"{name}.onnx"
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        x = np.random.default_rng(0).random((3, 1, 28, 28), dtype=np.float32)
        (logits,) = session.run(None, {session.get_inputs()[0].name: x})
        assert logits.shape == (3, 10) and np.isfinite(logits).all(), name
        report = json.loads(model.with_suffix(".json").read_text())
        assert report["method"] == name and report["global_model"].endswith(f"{name}.onnx")


def test_results_md_shows_the_numbers_of_the_reports_and_the_papers(demo):
    cwd, _ = demo
    out = cwd / "runs" / "demo"
    results = json.loads((out / "results.json").read_text())
    table = (out / "results.md").read_text()
    assert [r["method"] for r in results["results"]] == list(DEFAULT_METHODS)
    for r in results["results"]:
        report = json.loads((out / "global" / f"{r['method']}.json").read_text())
        assert r["accuracy"] == pytest.approx(report["accuracy"])
        paper = [ref.accuracy for ref in METHODS.get(r["method"]).references]
        row = re.search(rf"^\| {re.escape(r['method'])} \| ([\d.]+) \| ([\d.]+|-) \|", table, re.M)
        assert row, r["method"]
        assert row[1] == f"{100 * r['accuracy']:.2f}"
        # The FedMHO paper's Table 3 for this setting, where the method has a published number.
        assert row[2] == "-" if not paper else float(row[2]) in paper
    # Chance is 10%: the classifiers' methods learn from 3,000 digits in a few epochs.
    for name in ("fedavg", "ensemble", "fedmho", "fedmho-md", "fedmho-sd"):
        acc = next(r["accuracy"] for r in results["results"] if r["method"] == name)
        assert acc > 0.25, (name, acc)
    for picture in results["pictures"]:
        assert (cwd / picture).stat().st_size > 1000  # the PNGs it names are there


def test_the_way_on_names_real_files_and_commands_that_run(demo, cli):
    cwd, run = demo
    out = cwd / "runs" / "demo"
    lines = [line.strip() for line in run.stdout.splitlines()]
    commands = [line for line in lines if line.startswith("edgefl ")]
    assert len(commands) == 3
    for line in commands:
        parses(line)
    flat = " ".join(run.stdout.split())
    assert "uploads: runs/demo/uploads/ (10 client .onnx files)" in flat
    assert len(list((out / "uploads").glob("client-*.onnx"))) == 10
    # The first command, as printed, gives the accuracy the report recorded for that model.
    words = shlex.split(commands[0])
    assert words[1] == "eval"
    model = cwd / words[2]
    report = json.loads(model.with_suffix(".json").read_text())
    result = cli(*words[1:2], str(model), *words[3:], "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["accuracy"] == pytest.approx(report["accuracy"])


def test_json_puts_only_the_results_on_stdout(demo):
    """`demo --json` (the one command that lacked it): stdout parses as the run's results,
    everything told to a person goes to stderr. Run again on the finished run, it resumes."""
    cwd, _ = demo
    env = os.environ | {"COLUMNS": "80", "NO_COLOR": "1"}
    run = subprocess.run(
        [EDGEFL, "demo", "--quick", "--out", "runs/demo", "--jobs", "1", "--json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    printed = json.loads(run.stdout)
    recorded = json.loads((cwd / "runs" / "demo" / "results.json").read_text())
    assert [r["method"] for r in printed["results"]] == list(DEFAULT_METHODS)
    assert [r["accuracy"] for r in printed["results"]] == [
        r["accuracy"] for r in recorded["results"]
    ]
    assert "What each device can afford" in run.stderr
    assert "Where everything is, and what to try next" in run.stderr
    bad = subprocess.run(
        [EDGEFL, "demo", "--jobs", "0", "--json"], cwd=cwd, capture_output=True, text=True
    )
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"].startswith("--jobs")
