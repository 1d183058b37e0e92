"""README's "A tour" runs as written, step by step (issue 34 item 2): the bash block is read from
README.md, so a tour line that stops working fails here. Each step runs in a scratch folder (the
tour writes under runs/tour) with the flags below appended to keep the whole tour near a minute
on 2 cores; the flags are the commands' own, so a step that cannot take them fails too.

Shortened (flags appended; a later flag wins over the README's):
- client train / predict / prototypes: --epochs 1 (the README's steps train 10-30 epochs)
- server fuse: --epochs 1 (its methods' distillation epochs; fedavg ignores it)
- search: --particles 2 --generations 0 --fitness-samples 512 (the README's 3 x (1 + 1))
- deploy: --eval-samples 200

Skipped (listed in SKIPPED, with the reason): `edgefl simulate` and `edgefl reproduce` (minutes
even when shortened; tests/test_simulate.py and tests/test_reproduce.py run them small), and
`deploy --target tflite-micro` where onnx2tf/TensorFlow are not installed.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SHORTEN = {
    ("client", "train"): ["--epochs", "1"],
    ("client", "predict"): ["--epochs", "1"],
    ("client", "prototypes"): ["--epochs", "1"],
    ("server", "fuse"): ["--epochs", "1"],
    ("search",): ["--particles", "2", "--generations", "0", "--fitness-samples", "512"],
    ("deploy",): ["--eval-samples", "200"],
}
SKIPPED = {
    ("simulate",): "minutes even when shortened; tests/test_simulate.py runs it small",
    ("reproduce",): "a paper's whole table; tests/test_reproduce.py runs it small",
}
TFLITE = all(importlib.util.find_spec(m) for m in ("onnx2tf", "tensorflow"))


def tour_commands(readme: str) -> list[list[str]]:
    """The commands of README's "A tour" bash block: continuations joined, comments dropped."""
    section = readme.split("## A tour", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README's tour has no ```bash block"
    text = block.group(1).replace("\\\n", " ")
    return [words for line in text.splitlines() if (words := shlex.split(line, comments=True))]


COMMANDS = tour_commands((ROOT / "README.md").read_text(encoding="utf-8"))


def _key(words: list[str]) -> tuple[str, ...]:
    args = words[1:] if words[0] == "edgefl" else words
    for n in (2, 1):
        if tuple(args[:n]) in SHORTEN or tuple(args[:n]) in SKIPPED:
            return tuple(args[:n])
    return ()


def test_the_tour_is_what_this_test_reads():
    assert len(COMMANDS) >= 15, COMMANDS
    assert all(c[0] in ("edgefl", "python") for c in COMMANDS), COMMANDS
    written = [w for c in COMMANDS for w in c if w.startswith("runs/")]
    assert all(w.startswith("runs/tour") for w in written if "tour" in w), written


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """The tour's working folder: it writes runs/tour here; examples/ as in a checkout."""
    folder = tmp_path_factory.mktemp("tour")
    (folder / "examples").symlink_to(ROOT / "examples")
    return folder


@pytest.mark.parametrize("step", range(len(COMMANDS)), ids=[" ".join(c[:3])[:40] for c in COMMANDS])
def test_tour_step(step, scratch, monkeypatch, runner):
    words = COMMANDS[step]
    key = _key(words)
    if key in SKIPPED:
        pytest.skip(f"{' '.join(key)}: {SKIPPED[key]}")
    if "tflite-micro" in words and not TFLITE:
        pytest.skip("deploy --target tflite-micro needs onnx2tf and TensorFlow")
    monkeypatch.chdir(scratch)
    if words[0] == "python":
        proc = subprocess.run(
            [sys.executable, *words[1:]], capture_output=True, text=True, timeout=120, cwd=scratch
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return
    from edgefl.cli import app

    args = words[1:] + SHORTEN.get(key, [])
    r = runner.invoke(app, args)
    assert r.exit_code == 0, f"$ {shlex.join(words)}\n{r.output}"
    assert "Traceback" not in r.output and "error:" not in r.output, r.output
