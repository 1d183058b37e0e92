"""Issue 34 item 1: a run ends by saying where its uploads and global models went and what to
run next (commands that parse as printed); a resumed run keeps the timings the run that did
the work recorded, and says it reused them, instead of "clients 0 s, fusion 0 s"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_lines import parses

from edgefl.cli.simulate_cmd import print_results, print_way_on
from edgefl.simulate.job import SimJob
from edgefl.simulate.render import seconds_text
from edgefl.simulate.run import simulate


def tiny(out: Path) -> SimJob:
    return SimJob(
        dataset="digits",
        clients=4,
        mix="smartphone:2,wristband:2",
        partition="dirichlet:1.0",
        out=str(out),
        paper_models=True,
        classifier_epochs=2,
        generator_epochs=2,
        methods=("fedavg",),
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    first = simulate(tiny(out))
    recorded = json.loads((out / "results.json").read_text())["seconds"]
    again = simulate(tiny(out))
    return out, first, recorded, again


def test_a_resumed_run_keeps_the_recorded_timings(runs):
    out, first, recorded, again = runs
    assert "reused" not in first["seconds"]
    s = again["seconds"]
    assert s["reused"] == ["clients", "fusion"]
    assert s["clients"] == pytest.approx(recorded["clients"])
    assert s["fusion"] == pytest.approx(recorded["fusion"])
    assert s["clients"] > 0 and s["this_run"] < s["total"]
    # what is written keeps them too, and says so
    assert json.loads((out / "results.json").read_text())["seconds"]["reused"]
    assert "reused its outputs" in (out / "results.md").read_text()


def test_the_summary_says_the_timings_were_reused(runs, capsys):
    _, _, recorded, again = runs
    print_results(again)
    text = " ".join(capsys.readouterr().out.split())
    assert "clients and fusion as recorded by the run that did the work" in text
    shown = (
        f"clients {seconds_text(recorded['clients'])}, fusion {seconds_text(recorded['fusion'])}"
    )
    assert shown in text and "clients 0 s, fusion 0 s" not in text


def test_the_run_ends_with_where_everything_is_and_what_next(runs, capsys):
    out, *_, again = runs
    print_way_on(again)
    text = capsys.readouterr().out
    flat = " ".join(text.split())
    assert f"uploads: {out / 'uploads'}/ (4 client .onnx files)" in flat
    assert f"global models: {out / 'global'}/*.onnx (1: fedavg" in flat
    commands = [line.strip() for line in text.splitlines() if line.strip().startswith("edgefl ")]
    assert len(commands) == 3
    assert any(f"eval {out / 'global' / 'fedavg.onnx'}" in c for c in commands)
    for line in commands:
        parses(line)
