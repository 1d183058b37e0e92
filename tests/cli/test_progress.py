"""Progress on long work: plain lines with rate and ETA on stderr when nobody watches a terminal,
never on stdout (JSON stays clean), nothing with --quiet; real processes, as a log would see them."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import pytest
from fed_fixtures import build_federation

from edgefl.progress import LineReporter, describe, printable

CLI = [
    sys.executable,
    "-c",
    "import sys; from edgefl.cli import main; sys.argv[0]='edgefl'; main()",
]


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_line_reporter_is_periodic_and_always_shows_the_end():
    out, clock = io.StringIO(), FakeClock()
    rep = LineReporter(out, every=5.0, clock=clock)
    rep("epoch", 0, 10)  # the start: no line, the clock starts
    for done in range(1, 10):
        clock.t += 1.0
        rep("epoch", done, 10, f"loss {1 / done:.2f}")
    clock.t += 1.0
    rep("epoch", 10, 10, "loss 0.10")
    lines = out.getvalue().splitlines()
    # The first step, then one 5 s later, then the last: not one line per epoch.
    assert lines == [
        "epoch 1/10 (1.00/s, about 9 s left): loss 1.00",
        "epoch 6/10 (1.00/s, about 4 s left): loss 0.17",
        "epoch 10/10 done: loss 0.10",
    ]


def test_describe_formats_long_etas_and_fast_rates():
    assert (
        describe("steps", 50, 7250, 0.5, 14400.0) == "steps 50/7250 (0.50/s, about 4 h 00 min left)"
    )
    assert describe("ingest", 3, 10, 250.0, 90.0) == "ingest 3/10 (250/s, about 1 min 30 s left)"


def test_control_characters_from_an_upload_are_shown_escaped():
    out = io.StringIO()
    LineReporter(out).message("rejected evil\x1b[2J\x07.onnx\rx")
    assert out.getvalue() == "rejected evil\\x1b[2J\\x07.onnx\\x0dx\n"
    assert printable("tab\tstays") == "tab\tstays"


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    return build_federation(tmp_path_factory.mktemp("fed"))


def _fuse(federation, out, *extra):
    return subprocess.run(
        [
            *CLI,
            "server",
            "fuse",
            str(federation),
            "--method",
            "fedmho,fedavg",
            "--out-dir",
            str(out),
            "--synthetic",
            "200",
            "--epochs",
            "3",
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_fuse_piped_shows_progress_on_stderr_and_only_json_on_stdout(federation, tmp_path):
    r = _fuse(federation, tmp_path / "g")
    assert r.returncode == 0, r.stderr
    reports = json.loads(r.stdout)  # nothing but the JSON
    assert set(reports) == {"fedmho", "fedavg"}
    err = r.stderr
    assert "Traceback" not in err
    assert re.search(r"^ingest upload 4/4 done$", err, re.M), err
    # The forked worker's epochs reach the parent's stderr, named by method.
    assert re.search(r"^fedmho epoch 3/3 done: loss \d", err, re.M), err
    assert "fedavg: 2 upload(s) used" in err


def test_fuse_quiet_prints_nothing_on_stderr(federation, tmp_path):
    r = _fuse(federation, tmp_path / "g", "--quiet")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert set(json.loads(r.stdout)) == {"fedmho", "fedavg"}


def test_client_train_piped_shows_its_epochs(tmp_path):
    r = subprocess.run(
        [
            *CLI,
            "client",
            "train",
            "--profile",
            "wristband",
            "--dataset",
            "digits",
            "--num-clients",
            "4",
            "--epochs",
            "2",
            "--model",
            "scnn:width=8",
            "--out",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["role"] == "classifier"
    assert re.search(r"^training epoch 2/2 done: loss \d", r.stderr, re.M), r.stderr


def test_simulate_json_reports_clients_and_methods_on_stderr(tmp_path):
    r = subprocess.run(
        [
            *CLI,
            "simulate",
            "--dataset",
            "digits",
            "--clients",
            "3",
            "--mix",
            "smartphone:3",
            "--classifier-epochs",
            "1",
            "--methods",
            "fedavg,ensemble",
            "--jobs",
            "1",
            "--out",
            str(tmp_path / "run"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    assert {row["method"] for row in json.loads(r.stdout)["results"]} == {"fedavg", "ensemble"}
    assert re.search(r"^clients trained 3/3 done", r.stderr, re.M), r.stderr
    assert re.search(r"^methods fused 2/2 done", r.stderr, re.M), r.stderr


def test_chance_level_is_named_with_its_likely_cause():
    from edgefl.chance import classifier_warnings, client_warning, global_warning, near_chance

    assert near_chance(0.10, 10) and near_chance(0.149, 10) and not near_chance(0.15, 10)
    assert not near_chance(None, 10) and not near_chance(float("nan"), 10)
    weak = global_warning("fedavg", 0.1, 10, [0.237, 0.406])
    assert weak.startswith("fedavg: 10.00% is at or near chance (10% for 10 classes)")
    assert "classifiers it used are weak themselves (23.7-40.6%" in weak
    assert "did not learn from these uploads" in global_warning("dense", 0.11, 10, [0.95, 0.9])
    assert "did not learn" in global_warning("fedcvae-ens", 0.11, 10, [])  # decoders only
    assert "(1,234 training samples)" in client_warning("client-001", 0.1, 10, 1234)
    # the samples it trained on, not its label counts (which hold its validation samples too)
    (said,) = classifier_warnings(
        [
            {
                "role": "classifier",
                "client_id": "c",
                "label_counts": [14] * 9 + [11],
                "training": {"val_accuracy": 0.1, "samples": 123},
            }
        ]
    )
    assert "(123 training samples)" in said, said
    # Under DP-SGD the noise is the first suspect, not the epochs.
    plan = {"epsilon": 0.05, "noise_multiplier": 91.2}
    (said,) = classifier_warnings(
        [
            {
                "role": "classifier",
                "client_id": "c",
                "label_counts": [14] * 10,
                "training": {"val_accuracy": 0.1, "samples": 123},
                "privacy": {"dp_sgd": plan},
            }
        ]
    )
    assert "likely cause: DP-SGD's noise at epsilon 0.05 (noise multiplier 91.2" in said, said
    assert "more --epochs" not in said, said


def test_a_global_model_at_chance_is_warned_about_in_the_report(federation, tmp_path):
    # One epoch on 10 synthetic digits leaves FedCVAE-ENS's fresh classifier at chance.
    r = subprocess.run(
        [
            *CLI,
            "server",
            "fuse",
            str(federation),
            "--method",
            "fedcvae-ens",
            "--out",
            str(tmp_path / "g.onnx"),
            "--synthetic",
            "10",
            "--epochs",
            "1",
            "--eval",
            "digits",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "g.json").read_text())
    if report["accuracy"] < 0.15:
        assert report["warnings"] and "fedcvae-ens: " in report["warnings"][0]
        assert "warning fedcvae-ens:" in " ".join(r.stderr.split())  # --quiet: on stderr
    else:  # not at chance after all: then nothing may be said
        assert "warnings" not in report and "warning" not in r.stdout + r.stderr
