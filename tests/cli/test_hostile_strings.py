"""Text that came from an upload is data (issue 18, item 0): a file name, client id, model name
or kind holding terminal control codes and rich markup is shown escaped and never obeyed, in
every line `server fuse` prints (one method or many, human or JSON) and in simulate's
results.md; the JSON report keeps it exactly. Real processes on real pipes, as an operator's
terminal or log would receive them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

import exporters
from edgefl.simulate.render import results_markdown

EVIL = "\x1b]0;pwned\x07[bold red]boom[/]\r\x1b[2K\u009b31m"
EVIL_FILE = "\x1b[31mred\x07[link=x]f[link].onnx"  # no "/": it is one file name
# What must never reach a terminal from data: C0 controls but newline and tab, DEL, C1.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
EDGEFL = str(Path(sys.executable).parent / "edgefl")


def _edgefl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [EDGEFL, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"},
    )


def _rewrite(path: Path, dest: Path, **meta) -> None:
    model = onnx.load(str(path))
    m = exporters.get_metadata(model)
    for key, value in meta.items():
        if key == "spec_name":
            m["spec"]["name"] = value
        else:
            m[key] = value
    exporters.set_metadata(model, m)
    onnx.save(model, str(dest))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    """A federation with a random-weights classifier under a hostile file name (screened), an
    inverted one with a hostile client id (used repaired, so the robust note quotes it), and
    two uploads whose model name and kind are hostile (rejected, their reasons quote them)."""
    base = tmp_path_factory.mktemp("hostile")
    r = _edgefl(
        "simulate",
        "--dataset",
        "digits",
        "--clients",
        "8",
        "--mix",
        "smartphone:6,wristband:2",
        "--partition",
        "iid",
        "--classifier-epochs",
        "30",
        "--classifier-optimizer",
        "adam",
        "--generator-epochs",
        "30",
        "--generator-optimizer",
        "adam",
        "--methods",
        "ensemble",
        "--attack",
        "random:1,invert:1",
        "--out",
        str(base / "sim"),
        "--quiet",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # --quiet prints what failed: every method here fused (each row's "error" is null)
    assert not [s for s in r.stderr.splitlines() if s.lower().startswith("error")], r.stderr
    src, up = base / "sim" / "uploads", base / "up"
    shutil.copytree(src, up)
    (up / "client-000.onnx").rename(up / EVIL_FILE)
    _rewrite(src / "client-001.onnx", up / "client-001.onnx", client_id=EVIL)
    for i, name, meta in (
        (4, "bad-spec.onnx", {"spec_name": EVIL}),
        (5, "bad-kind.onnx", {"kind": EVIL}),
    ):
        (up / f"client-{i:03d}.onnx").unlink()  # a copy would be refused as a duplicate
        _rewrite(src / f"client-{i:03d}.onnx", up / name, **meta)
    return base


def _clean(text: str) -> None:
    found = sorted({hex(ord(c)) for c in CONTROL.findall(text)})
    assert not found, f"raw control characters reached the output: {found}"


def test_server_fuse_shows_upload_text_escaped_and_keeps_it_in_the_report(hostile):
    up = hostile / "up"
    before = {p.name: p.read_bytes() for p in up.iterdir()}
    for extra in ([], ["--json"]):
        out = hostile / ("one.onnx" if not extra else "one-json.onnx")
        r = _edgefl(
            "server",
            "fuse",
            str(up),
            "--method",
            "ensemble",
            "--robust",
            "screen",
            "--out",
            str(out),
            *extra,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        _clean(r.stdout)
        _clean(r.stderr)
        report = json.loads(out.with_suffix(".json").read_text())
        # The report keeps upload text exactly (JSON escapes it); who was screened and why.
        assert [s["file"] for s in report["screened"]] == [EVIL_FILE]
        assert any(n.startswith(f"{EVIL}: outputs repaired") for n in report["robust_notes"])
        rejected = {x["file"]: x["reason"] for x in report["rejected"]}
        assert set(rejected) == {"bad-spec.onnx", "bad-kind.onnx"}
        if extra:
            assert json.loads(r.stdout)["robust_notes"] == report["robust_notes"]
        else:
            text = " ".join(r.stdout.split())
            # Shown as text: the markup and escape codes are visible, not interpreted.
            assert "screened out \\x1b[31mred\\x07[link=x]f[link].onnx:" in text, text
            assert (
                "robust \\x1b]0;pwned\\x07[bold red]boom[/]\\x0d\\x1b[2K\\x9b31m: outputs "
                "repaired (logits negated)" in text
            ), text
            assert "[bold red]boom[/]" in text.split("rejected bad-kind.onnx")[1], text
    # Many methods at once print another summary: the same holds.
    r = _edgefl(
        "server",
        "fuse",
        str(up),
        "--method",
        "ensemble,fedavg",
        "--robust",
        "screen",
        "--out-dir",
        str(hostile / "many"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    _clean(r.stdout)
    _clean(r.stderr)
    assert "[bold red]boom[/]" in " ".join(r.stdout.split())
    assert r.stderr.count("robust screen (") == 1, r.stderr  # judged once for both methods
    assert {p.name: p.read_bytes() for p in up.iterdir()} == before  # uploads untouched


def test_simulate_markdown_quotes_upload_text_inertly():
    results = {
        "job": {
            "dataset": "digits",
            "clients": 2,
            "partition": "iid",
            "mix": "smartphone:2",
            "seed": 0,
            "paper_models": False,
        },
        "date_utc": "2026-11-24 00:00:00",
        "seconds": {"clients": 1.0, "fusion": 1.0},
        "results": [
            {
                "method": "ensemble",
                "accuracy": 0.9,
                "paper": None,
                "fuse_seconds": 1.0,
                "upload_bytes": 10,
                "screened": [f"{EVIL}: agrees on 0%"],
                "robust_notes": [f"{EVIL}: outputs repaired (logits negated)"],
            }
        ],
        "clients": [],
    }
    md = results_markdown(results)
    _clean(md)
    section = md.split("Robust screen")[1]
    assert "\\[bold red\\]boom\\[/\\]" in section and "[bold red]" not in section
    assert "ensemble: screened out \\\\x1b\\]0;pwned" in section
