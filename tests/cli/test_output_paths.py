"""Every output flag of the CLI, given a path no file can be made at: one message naming the flag,
exit 2, no traceback, nothing written, and no data read or work started first (issue 19)."""

from __future__ import annotations

import os

import pytest

import edgefl.data.datasets

# {blocked} is a regular file, so nothing can be created under it; {junk} is a file whose bytes
# are not ONNX, so a command that read it before its outputs would fail on the input instead.
COMMANDS = {
    "client train": [
        "client",
        "train",
        "--profile",
        "wristband",
        "--dataset",
        "digits",
        "--num-clients",
        "2",
        "--client-index",
        "0",
        "--out",
        "{blocked}/up",
    ],
    "client sample": ["client", "sample", "{junk}", "--out", "{blocked}/s.png"],
    "client apply-header": [
        "client",
        "apply-header",
        "{junk}",
        "{junk}",
        "--out",
        "{blocked}/p.onnx",
    ],
    "data partition": [
        "data",
        "partition",
        "--dataset",
        "digits",
        "--num-clients",
        "2",
        "--plot",
        "{blocked}/h.png",
    ],
    "eval": ["eval", "{junk}", "--dataset", "digits", "--plot", "{blocked}/c.png"],
    "infer": ["infer", "{junk}", "--input", "{junk}", "--out", "{blocked}/g.npy"],
    "search": [
        "search",
        "--profile",
        "wristband",
        "--dataset",
        "digits",
        "--save",
        "{blocked}/s.json",
    ],
    "server fuse --out": [
        "server",
        "fuse",
        "{uploads}",
        "--method",
        "fedavg",
        "--out",
        "{blocked}/g.onnx",
    ],
    "server fuse --report": [
        "server",
        "fuse",
        "{uploads}",
        "--method",
        "fedavg",
        "--report",
        "{blocked}/r.json",
    ],
    "server fuse --out-dir": [
        "server",
        "fuse",
        "{uploads}",
        "--method",
        "fedavg,ensemble",
        "--out-dir",
        "{blocked}/o",
    ],
    "simulate": [
        "simulate",
        "--dataset",
        "digits",
        "--clients",
        "2",
        "--mix",
        "smartphone:2",
        "--out",
        "{blocked}/sim",
    ],
    "demo": ["demo", "--out", "{blocked}/demo"],
    "reproduce": ["reproduce", "fedmho-table3", "--out", "{blocked}/t3"],
}


@pytest.fixture
def no_data(monkeypatch):
    """Reading a registered dataset fails the test: a command must not read data (minutes of
    work) before it has checked where its results go. Patched where every load_dataset call
    goes through, not at each module's binding (a module first imported during the test would
    keep the stand-in after it)."""

    def refuse(*a, **k):
        raise AssertionError("data was read before the output path was checked")

    monkeypatch.setattr(edgefl.data.datasets, "_load_registered", refuse)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_output_flag_refuses_an_impossible_path_first(name, cli, tmp_path, no_data):
    blocked = tmp_path / "notes.txt"
    blocked.write_text("a file, not a folder\n")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not onnx")
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    (uploads / "a.onnx").write_bytes(b"not onnx")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    args = [a.format(blocked=blocked, junk=junk, uploads=uploads) for a in COMMANDS[name]]
    r = cli(*args)
    text = " ".join(r.output.split())
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output and not isinstance(r.exception, AssertionError)
    flag = next(
        a
        for a in COMMANDS[name]
        if a.startswith("--") and "{blocked}" in COMMANDS[name][COMMANDS[name].index(a) + 1]
    )
    assert f"{flag} " in text and "cannot be written" in text, text
    assert "fix:" in text, text
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before, "a refused command wrote or changed files"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_a_folder_no_file_can_be_made_in_is_refused(cli, no_data):
    # Root may "access" /proc, yet nothing can be created there.
    r = cli("data", "partition", "--dataset", "digits", "--plot", "/proc/h.png")
    assert r.exit_code == 2 and "cannot be written" in " ".join(r.output.split()), r.output
