"""README's "A tour" runs as written, step by step (issue 34 item 2), and each step gives the user
what it says (issue 55 item 3): the bash block is read from README.md, so a tour line that stops
working fails here. Each step runs in a scratch folder (the tour writes under runs/tour), in order,
with the flags below appended to keep the whole tour near two minutes on 2 cores; the flags are
the commands' own, so a step that cannot take them fails too. After each step, its check in
CHECKS reads what the step left: the files it wrote (ONNX files load in onnxruntime, JSON
reports parse and hold the keys the printed lines promise, pictures are PNGs) and the lines it
printed, against the files and against numbers computed here independently.

Shortened (flags appended; each replaces the README's value of its flag):
- client train / predict / prototypes: --epochs 1 (the README's steps train 10-30 epochs)
- server fuse: --epochs 1 (its methods' distillation epochs; fedavg ignores it)
- search: --particles 2 --generations 0 --fitness-samples 512 (the README's 3 x (1 + 1))
- deploy: --eval-samples 200
- simulate: 3,000 MNIST digits (--subset), 1 local epoch, 1 fusion epoch over 600 synthetic
  samples, --jobs 1 (in this process: workers would each import torch again; --jobs never
  changes a result, tests/simulate/test_simulate.py checks that)
- reproduce: --budget smoke --methods fedmho --jobs 1: one cell of the README's table, the
  table's own reduced budget (`edgefl reproduce` lists it)

Skipped: `deploy --target tflite-micro` where onnx2tf/TensorFlow are not installed.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_lines import overridden
from reported import onnx_accuracy

ROOT = Path(__file__).resolve().parents[2]

SHORTEN = {
    ("client", "train"): ["--epochs", "1"],
    ("client", "predict"): ["--epochs", "1"],
    ("client", "prototypes"): ["--epochs", "1"],
    ("server", "fuse"): ["--epochs", "1"],
    ("search",): ["--particles", "2", "--generations", "0", "--fitness-samples", "512"],
    ("deploy",): ["--eval-samples", "200"],
    ("simulate",): [
        "--subset",
        "3000",
        "--classifier-epochs",
        "1",
        "--generator-epochs",
        "1",
        "--fuse-opt",
        "all:epochs=1",
        "--fuse-opt",
        "all:synthetic=600",
        "--jobs",
        "1",
    ],
    ("reproduce",): ["--budget", "smoke", "--methods", "fedmho", "--jobs", "1"],
}
TFLITE = all(importlib.util.find_spec(m) for m in ("onnx2tf", "tensorflow"))
PNG = b"\x89PNG\r\n\x1a\n"


def tour_commands(readme: str) -> list[list[str]]:
    """The commands of README's "A tour" bash block: continuations joined, comments dropped."""
    section = readme.split("## A tour", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README's tour has no ```bash block"
    text = block.group(1).replace("\\\n", " ")
    return [words for line in text.splitlines() if (words := shlex.split(line, comments=True))]


README = (ROOT / "README.md").read_text(encoding="utf-8")
COMMANDS = tour_commands(README)


def _key(words: list[str]) -> tuple[str, ...]:
    args = words[1:] if words[0] == "edgefl" else words
    for n in (2, 1):
        if tuple(args[:n]) in SHORTEN:
            return tuple(args[:n])
    return ()


def _command(words: list[str]) -> tuple[str, ...]:
    """The step's command, the key of its check: ("client", "train"), ("python", script)."""
    if words[0] == "python":
        return ("python", words[1])
    sub = words[1:3] if words[1] in ("client", "server", "data", "profile") else words[1:2]
    return tuple(sub)


def _option(words: list[str], flag: str) -> str:
    return words[words.index(flag) + 1]


def _flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps lines wherever the width ends


def _ort(path: Path):
    """An onnxruntime session on the file (the file loads) and its edgefl metadata."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session, json.loads(session.get_modelmeta().custom_metadata_map["edgefl"])


def _mnist(split: str = "test"):
    from edgefl.data import load_dataset

    return load_dataset(f"mnist:{split}")


def _logits(path: Path, x: np.ndarray) -> np.ndarray:
    session, _ = _ort(path)
    name = session.get_inputs()[0].name
    return np.concatenate(
        [session.run(None, {name: x[i : i + 1000]})[0] for i in range(0, len(x), 1000)]
    )


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG


# --- each step's check: (scratch folder, the step's words, its printed output) ---------------


def check_profile_list(folder, words, out):
    from device_profiles import list_profiles, load_profile
    from edgefl.cli.common import fmt_bytes

    for name in list_profiles():
        p = load_profile(name)
        rows = [ln for ln in out.splitlines() if re.search(rf"\b{re.escape(name)}\b", ln)]
        assert any(fmt_bytes(p.ram_bytes) in r and p.optimizer in r for r in rows), (name, out)


def check_models(folder, words, out):
    """Every zoo model has a row with its MACs, and says it fits exactly when it does (the
    same command's --json, which the row must agree with)."""
    from typer.testing import CliRunner

    from edgefl.cli import app

    listed = json.loads(CliRunner().invoke(app, [*words[1:], "--json"]).stdout)
    assert {m["name"] for m in listed} >= {"vgg9", "cnn", "cvae-small", "cvae-mlp"}
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip()}
    for m in listed:
        row = rows.get(m["name"])
        assert row is not None, (m["name"], out)
        assert f"{m['macs']:,}" in row, (m["name"], row)
        assert (" yes" in row) == m["fits"], (m["name"], m["fits"], row)


def check_client_plan(folder, words, out):
    """The lines README shows under the tour (`$ edgefl client plan ...`) are what it prints."""
    block = README.split("$ edgefl client plan --profile wristband --dataset mnist\n", 1)[1]
    shown = block.split("```", 1)[0].splitlines()
    printed = _flat(out)
    for line in shown:
        for part in line.split("(...)"):  # the README elides the reasons
            assert _flat(part) in printed, (part, out)


def check_data_partition(folder, words, out):
    assert _is_png(folder / _option(words, "--plot"))
    n = int(_option(words, "--num-clients"))
    rows = [
        [int(c.replace(",", "")) for c in re.findall(r"[\d,]+", ln)]
        for ln in out.splitlines()
        if re.match(r"^│\s+\d+\s+│", ln)
    ]
    assert [r[0] for r in rows] == list(range(n)), out
    assert all(sum(r[1:-1]) == r[-1] for r in rows), rows  # each client's classes add up
    total = sum(r[-1] for r in rows)
    assert total == len(_mnist("train").y) == 60_000
    assert f"{total:,} of {total:,} samples assigned" in out


def check_client_train(folder, words, out):
    profile, index = _option(words, "--profile"), int(_option(words, "--client-index"))
    cid = f"client-{index:03d}"
    path = folder / _option(words, "--out") / f"{cid}.onnx"
    session, meta = _ort(path)
    assert (meta["client_id"], meta["profile"]) == (cid, profile), meta
    assert f"wrote {path.relative_to(folder)} ({path.stat().st_size:,} bytes)" in _flat(out)
    if "--model" in words:  # the phone's classifier: it classifies MNIST as its report says
        assert meta["kind"] == "classifier" and meta["spec"]["name"] == _option(words, "--model")
        test = _mnist()
        acc = float((_logits(path, test.x).argmax(1) == test.y).mean())
        assert 0.3 < acc <= 1, acc  # one epoch on one non-IID shard, above chance (0.1)
        (val,) = re.findall(r"local val accuracy ([\d.]+)%", out)
        assert 0 <= float(val) <= 100
    else:  # the wristband's decoder: one image per class, pixels in [0, 1]
        assert meta["kind"] == "decoder" and "generator" in out
        c, z = meta["num_classes"], meta["latent_dim"]
        feed = {"z": np.zeros((c, z), np.float32), "label": np.eye(c, dtype=np.float32)}
        images = session.run(None, feed)[0]
        assert images.reshape(c, -1).shape[1] == int(np.prod(meta["input_shape"]))
        assert images.min() >= 0 and images.max() <= 1


def check_client_sample(folder, words, out):
    from PIL import Image

    path = folder / _option(words, "--out")
    assert _is_png(path) and f"wrote {path.relative_to(folder)}" in out
    with Image.open(path) as img:
        assert min(img.size) >= 28 * 2  # a grid of 28x28 samples


def check_on_device_infer(folder, words, out):
    _, meta = _ort(folder / words[2])
    assert f"model: {words[2]} ({meta['kind']}, {meta['client_id']})" in out, out
    assert f"output: float32 [1, {meta['num_classes']}]" in out
    assert re.search(r"latency: median [\d.]+ ms", out) and "peak RSS:" in out


def check_server_methods(folder, words, out):
    from edgefl.fusion import METHODS

    for name in METHODS.names():
        assert re.search(rf"(^|\s){re.escape(name)}\s", out, re.M), (name, out)


def _fused(path: Path, method: str) -> dict:
    """The global model loads in onnxruntime; its JSON report beside it says what it is."""
    session, meta = _ort(path)
    assert meta["kind"] == "global"
    report = json.loads(path.with_suffix(".json").read_text())
    assert report["method"] == method and Path(report["global_model"]).name == path.name, report
    assert report["used"], report
    return report


def check_server_fuse(folder, words, out):
    uploads = folder / words[3]
    methods = _option(words, "--method").split(",")
    if "--out" in words:
        (method,) = methods
        path = folder / _option(words, "--out")
        report = _fused(path, method)
        report_path = path.with_suffix(".json").relative_to(folder)
        assert f"report: {report_path}" in _flat(out)
        assert set(report["used"]) == {p.stem for p in uploads.glob("*.onnx")}, report["used"]
        if "--eval" in words:  # the accuracy printed and reported is the file's own
            assert report["eval"]["samples"] == 10_000
            mine = onnx_accuracy(path, _option(words, "--eval"))
            assert report["accuracy"] == pytest.approx(mine, abs=1e-4)
            assert f"accuracy on {_option(words, '--eval')}: {100 * mine:.2f}%" in out
        return
    for method in methods:  # --out-dir: one model and report per method, each row naming it
        path = folder / _option(words, "--out-dir") / f"{method}.onnx"
        _fused(path, method)
        assert any(method in ln and str(path.relative_to(folder)) in ln for ln in out.splitlines())


def check_eval(folder, words, out):
    path = folder / words[2]
    test = _mnist()
    pred = _logits(path, test.x).argmax(1)
    assert f"top-1 {100 * (pred == test.y).mean():.2f}%" in out, out
    for c in range(10):  # each class's row: the share of that class predicted right
        share = (pred[test.y == c] == c).mean()
        assert re.search(rf"│ {c}\s+│\s+{100 * share:.2f}% │", out), (c, share, out)
    assert _is_png(folder / _option(words, "--plot"))


def check_deploy(folder, words, out):
    band = folder / _option(words, "--out")
    sidecar = json.loads(next(band.glob("*.json")).read_text())
    assert sidecar["target"] == "tflite-micro" and sidecar["profile"]["name"] == "wristband"
    files = {k: band / v for k, v in sidecar["files"].items()}
    flatbuffer = files["tflite"].read_bytes()
    assert flatbuffer[4:8] == b"TFL3"  # a TFLite flatbuffer
    # The firmware's C array holds the same bytes.
    array = re.findall(r"0x([0-9a-f]{2})", files["c_source"].read_text())
    assert bytes(int(b, 16) for b in array) == flatbuffer
    for path in files.values():  # each file printed with its size
        assert f"{path.relative_to(folder)} {path.stat().st_size:,} bytes" in _flat(out)
    costs = sidecar["costs"]
    assert f"memory: {costs['arena_bytes']:,} bytes" in out
    assert f"flash: {costs['flash_bytes']:,} bytes" in out
    deployed, source = map(float, re.search(r"([\d.]+)% deployed vs ([\d.]+)% fp32", out).groups())
    assert 0 <= deployed <= 100 and 0 <= source <= 100 and abs(deployed - source) < 10


def check_search(folder, words, out):
    spec, _ = json.JSONDecoder().raw_decode(_flat(out).split("spec: ", 1)[1])
    assert spec["name"] == "nas-cnn" and spec["input_shape"] == [1, 28, 28]
    (best,) = re.findall(r"best architecture \(wristband\): (\S+)", out)
    (acc,) = re.findall(r"val accuracy ([\d.]+)%", out)
    assert 0 <= float(acc) <= 100 and best in out.split("Candidates", 1)[1]


def check_client_predict(folder, words, out):
    import exporters

    art = exporters.read_artifact(folder / _option(words, "--out") / "client-000.onnx")
    assert art.metadata["kind"] == "predictions"
    assert art.input_names == []  # a table: the graph holds the outputs themselves
    probs = art.run()
    assert probs.shape == (5000, 10) and np.allclose(probs.sum(1), 1, atol=1e-4)
    assert "5,000 x 10 float32 softmax outputs on mnist:public" in out


def check_client_prototypes(folder, words, out):
    import exporters

    art = exporters.read_artifact(folder / _option(words, "--out") / "client-000.onnx")
    assert art.metadata["kind"] == "prototypes"
    kept = folder / _option(words, "--keep-model") / "client-000.onnx"
    _, meta = _ort(kept)
    assert meta["kind"] == "classifier"
    assert f"own model kept at {kept.relative_to(folder)}" in _flat(out)


def check_apply_header(folder, words, out):
    path = folder / _option(words, "--out")
    test = _mnist()
    logits = _logits(path, test.x[:100])
    assert logits.shape == (100, 10) and np.isfinite(logits).all()
    assert f"personalized model: {path.relative_to(folder)}" in _flat(out)


def check_simulate(folder, words, out):
    from edgefl.fusion import DEFAULT_METHODS
    from edgefl.simulate.render import accuracy_text

    run = folder / _option(words, "--out")
    results = json.loads((run / "results.json").read_text())
    job = results["job"]
    assert (job["dataset"], job["clients"], job["partition"], job["mix"]) == (
        "mnist",
        10,
        "dirichlet:0.5",
        "smartphone:5,wristband:5",
    )
    assert [c["client_id"] for c in results["clients"]] == [f"client-{i:03d}" for i in range(10)]
    rows = {r["method"]: r for r in results["results"]}
    assert list(rows) == list(DEFAULT_METHODS)
    md = (run / "results.md").read_text()
    for method, r in rows.items():  # each number is its global model's, on MNIST's test split
        assert r["accuracy"] == pytest.approx(
            onnx_accuracy(run / "global" / f"{method}.onnx", "mnist:test"), abs=2e-3
        )
        row = [ln for ln in out.splitlines() if f"│ {method} " in ln and accuracy_text(r) in ln]
        assert row, (method, out)
        assert f"| {method} |" in md
    assert f"results in {run.relative_to(folder)}/results.md" in _flat(out)
    assert results["pictures"] and all(_is_png(folder / p) for p in results["pictures"])
    assert all((folder / f).is_file() for f in results["files"])


def check_reproduce(folder, words, out):
    from edgefl.fusion import paper_reference

    table = folder / _option(words, "--out")
    summary = json.loads((table / "table.json").read_text())
    assert summary["table"] == words[2] and summary["budget"]["name"] == "smoke"
    (row,) = summary["rows"]
    cell = row["partitions"]["dirichlet:0.5"]
    (record,) = summary["cells"]
    scored = 100 * onnx_accuracy(Path(record["dir"]) / "global" / "fedmho.onnx", "mnist:test")
    assert 0 <= cell["mean"] <= 100 and cell["mean"] == pytest.approx(scored, abs=0.01)
    assert cell["paper"] == paper_reference("mnist", "dirichlet:0.5", 10)["fedmho"] == 93.45
    shown = f"{cell['mean']:.2f} +- 0.00 (n=1) | 93.45 | {cell['gap']:+.2f}"
    assert f"| fedmho | fedmho | {shown} |" in (table / "table.md").read_text()
    assert shown.replace("|", "│") in _flat(out), out
    assert _is_png(table / "table.png")


CHECKS = {
    ("profile", "list"): check_profile_list,
    ("models",): check_models,
    ("client", "plan"): check_client_plan,
    ("data", "partition"): check_data_partition,
    ("client", "train"): check_client_train,
    ("client", "sample"): check_client_sample,
    ("python", "examples/on_device_infer.py"): check_on_device_infer,
    ("server", "methods"): check_server_methods,
    ("server", "fuse"): check_server_fuse,
    ("eval",): check_eval,
    ("deploy",): check_deploy,
    ("search",): check_search,
    ("client", "predict"): check_client_predict,
    ("client", "prototypes"): check_client_prototypes,
    ("client", "apply-header"): check_apply_header,
    ("simulate",): check_simulate,
    ("reproduce",): check_reproduce,
}


def test_the_tour_is_what_this_test_reads():
    assert len(COMMANDS) >= 15, COMMANDS
    assert all(c[0] in ("edgefl", "python") for c in COMMANDS), COMMANDS
    written = [w for c in COMMANDS for w in c if w.startswith("runs/")]
    assert all(w.startswith("runs/tour") for w in written if "tour" in w), written
    # Every step is checked for what it gives the user, not only for its exit code.
    assert {_command(c) for c in COMMANDS} <= set(CHECKS), {_command(c) for c in COMMANDS}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """The tour's working folder: it writes runs/tour here; examples/ as in a checkout."""
    folder = tmp_path_factory.mktemp("tour")
    (folder / "examples").symlink_to(ROOT / "examples")
    return folder


@pytest.mark.parametrize("step", range(len(COMMANDS)), ids=[" ".join(c[:3])[:40] for c in COMMANDS])
def test_tour_step(step, scratch, monkeypatch, runner):
    words = COMMANDS[step]
    if "tflite-micro" in words and not TFLITE:
        pytest.skip("deploy --target tflite-micro needs onnx2tf and TensorFlow")
    monkeypatch.chdir(scratch)
    if words[0] == "python":
        proc = subprocess.run(
            [sys.executable, *words[1:]], capture_output=True, text=True, timeout=120, cwd=scratch
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        output = proc.stdout
    else:
        from edgefl.cli import app

        args = overridden(words[1:], SHORTEN.get(_key(words), []))
        r = runner.invoke(app, args)
        assert r.exit_code == 0, f"$ {shlex.join(words)}\n{r.output}"
        output = r.output
    assert "Traceback" not in output and "error:" not in output, output
    CHECKS[_command(words)](scratch, words, output)
