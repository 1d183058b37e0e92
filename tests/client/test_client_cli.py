"""`edgefl client ...`, `edgefl infer` and examples/on_device_infer.py, end to end on digits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgefl.client.run import ClientJob, run_client

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "on_device_infer.py"
TRAIN = (
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
)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """A small classifier and a small decoder artifact, trained on digits through the library."""
    out = tmp_path_factory.mktemp("uploads")
    common = dict(profile="wristband", dataset="digits", out_dir=str(out), num_clients=4, epochs=1)
    clf = run_client(ClientJob(**common, model="scnn:width=8", client_id="clf"))
    dec = run_client(ClientJob(**common, model="cvae-mlp:hidden=16", client_id="dec"))
    return clf.path, dec.path


def _flat(text: str) -> str:
    # rich wraps long messages (tmp paths are long): compare with whitespace collapsed.
    return " ".join(text.split())


def test_train_end_to_end_with_clean_output(tmp_path):
    # A subprocess, not CliRunner: torch's exporter logs through handlers bound to the real
    # stderr, which only a separate process shows faithfully (and only on its first export).
    code = "import sys; from edgefl.cli import main; main(sys.argv[1:])"
    proc = subprocess.run(
        [sys.executable, "-c", code, *TRAIN, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert (tmp_path / "client-000.onnx").is_file()
    assert "upload:" in output and "local val" in output  # accuracy or loss: planner picks role
    for chatter in (
        "torch.onnx",
        "[torch.onnx]",
        "Applied",
        "torchvision",
        "Warning",
        "onnxscript",
    ):
        assert chatter not in output, output


def test_train_json(cli, tmp_path):
    r = cli(*TRAIN, "--model", "mlp", "--out", str(tmp_path), "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["upload_bytes"] == (tmp_path / "client-000.onnx").stat().st_size
    assert summary["role"] == "classifier" and summary["training"]["epochs"] == 2


def test_train_refuses_model_that_does_not_fit(cli, tmp_path):
    r = cli(*TRAIN, "--model", "vgg9", "--out", str(tmp_path))
    assert r.exit_code == 2 and "does not fit" in _flat(r.output) and "--force" in r.output
    assert "Traceback" not in r.output and not list(tmp_path.iterdir())


def test_train_that_diverges_is_one_message_and_no_upload(cli, tmp_path):
    """A decoder whose weights went NaN (the lr far too high): torch's BCE would refuse its
    output deep inside (on a GPU, assert on the device); edgefl stops and names the lr."""
    r = cli(*TRAIN, "--model", "cvae-mlp:hidden=16", "--lr", "1e4", "--out", str(tmp_path))
    assert r.exit_code == 2, r.output
    assert "training diverged" in r.output and "lr 10000" in r.output and "--lr" in r.output
    assert "Traceback" not in r.output and not list(tmp_path.glob("*.onnx"))


def test_sample(cli, artifacts, tmp_path):
    clf, dec = artifacts
    png = tmp_path / "grid.png"
    r = cli("client", "sample", str(dec), "--per-class", "2", "--out", str(png))
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = cli("client", "sample", str(clf), "--out", str(tmp_path / "no.png"))
    assert r.exit_code == 2 and "not a decoder" in _flat(r.output) and "Traceback" not in r.output
    # Its own picture is replaced by a rerun; nothing else is: not an upload (the decoder
    # itself), not the user's file, not a name that is not .png.
    r = cli("client", "sample", str(dec), "--per-class", "1", "--out", str(png))
    assert r.exit_code == 0, r.output
    upload = dec.read_bytes()
    (tmp_path / "thesis.png").write_text("mine")
    for out, said in (
        (dec, "its name should end in .png"),
        (tmp_path / "grid.pdf", "its name should end in .png"),
        (tmp_path / "thesis.png", "already holds a file edgefl did not draw"),
    ):
        r = cli("client", "sample", str(dec), "--out", str(out))
        assert r.exit_code == 2 and said in _flat(r.output) and "fix:" in r.output, r.output
    assert dec.read_bytes() == upload and (tmp_path / "thesis.png").read_text() == "mine"
    assert not (tmp_path / "grid.pdf").exists()
    (tmp_path / "notes.txt").write_text("not a model")
    for args, said in (
        ([str(tmp_path / "notes.txt")], "is not a readable edgefl artifact"),
        ([str(dec), "--seed", "-1"], "--seed must be an integer in 0.."),
        # 300 draws a row were squeezed into the picture's width, illegible
        ([str(dec), "--per-class", "300"], "fix: e.g. --per-class 32 (an integer in 1..32)"),
    ):
        r = cli("client", "sample", *args, "--out", str(tmp_path / "x.png"))
        assert r.exit_code == 2 and said in _flat(r.output) and "Traceback" not in r.output
    r = cli("client", "sample", str(dec), "--per-class", "1", "--out", str(png), "--json")
    assert r.exit_code == 0 and json.loads(r.stdout) == {
        "path": str(png), "per_class": 1, "classes": 10, "seed": 0
    }, r.output  # fmt: skip


def test_sample_title_draws_the_client_id_as_written(tmp_path):
    """An id is the upload's text: `$x^{2}$` is drawn as those characters, not as mathtext."""
    from edgefl.client.sample import sample_figure

    dec = run_client(
        ClientJob(
            profile="wristband",
            dataset="digits",
            out_dir=str(tmp_path),
            num_clients=4,
            epochs=1,
            model="cvae-mlp:hidden=8",
            client_id="a$x^{2}$",
        )
    ).path
    fig = sample_figure(str(dec), per_class=1)
    title = " ".join(ax.get_title() for ax in fig.axes)
    assert "a\\$x^{2}\\$" in title, title  # escaped: drawn as typed


@pytest.mark.parametrize(
    "args, said",
    [
        (["--client-id", "../evil"], "the id must be one plain name"),
        (["--client-id", "a/b"], "the id must be one plain name"),
        (["--client-id", ""], "the id must be one plain name"),
        # a file name other tools would print raw (edgefl escapes it, ls and shells do not)
        (["--client-id", "a\x1b[31mred\x07"], "no control characters"),
        (["--search", "pso"], "the search chooses the architecture"),
        (["--role", "generator"], "--role generator with --model cnn, a classifier"),
        (["--public-size", "1437"], "--public-size 1437 leaves 0 training sample(s) for 4"),
        (["--lr", "1e39"], "--lr must be in (0, 1000000]"),
        (["--seed", "99999999999999999999"], "--seed must be an integer in 0.."),
        (["--particles", "3"], "--particles applies with --search only"),  # was passed over
        (["--candidate-epochs", "3"], "--candidate-epochs applies with --search only"),
    ],
)
def test_train_refuses_flags_it_would_ignore_or_misread(cli, tmp_path, args, said):
    r = cli(*TRAIN, "--model", "cnn", "--out", str(tmp_path / "up"), *args)
    assert r.exit_code == 2 and said in _flat(r.output) and "fix:" in r.output, r.output
    assert not (tmp_path / "up").exists() and not (tmp_path / "evil.onnx").exists()


def test_force_without_a_named_model_is_refused(cli, tmp_path):
    """The planner's pick always fits: --force did nothing, without a word."""
    r = cli(*TRAIN, "--force", "--out", str(tmp_path / "up"))
    assert r.exit_code == 2 and "--force applies with --model or --spec only" in _flat(r.output)
    predict = ("client", "predict", "--profile", "smartphone", "--dataset", "digits")
    r = cli(*predict, "--public", "digits:public", "--force", "--out", str(tmp_path / "up"))
    assert r.exit_code == 2 and "--force applies with --model" in _flat(r.output), r.output
    assert not (tmp_path / "up").exists()


def test_keep_model_that_is_a_file_is_refused_before_training(cli, tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    args = ("client", "predict", "--profile", "smartphone", "--dataset", "digits")
    r = cli(
        *args,
        "--model",
        "cnn",
        "--epochs",
        "1",
        "--public",
        "digits:public",
        "--out",
        str(tmp_path / "up"),
        "--keep-model",
        str(tmp_path / "notes.txt"),
    )
    assert r.exit_code == 2 and "--keep-model" in _flat(r.output) and "is a file" in r.output
    assert (tmp_path / "notes.txt").read_text() == "keep me" and not (tmp_path / "up").exists()


def test_infer_classifier(cli, artifacts, tmp_path):
    clf, _ = artifacts
    x = np.random.default_rng(0).random((3, 1, 8, 8), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    r = cli("infer", str(clf), "--input", str(tmp_path / "x.npy"), "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    probs = np.array(got["probabilities"])
    assert probs.shape == (3, 10) and np.allclose(probs.sum(1), 1, atol=1e-6)
    assert got["predictions"] == [str(i) for i in probs.argmax(1)]
    # One uint8 sample (C, H, W): scaled by 1/255 and batched.
    np.save(tmp_path / "one.npy", (x[0] * 255).astype(np.uint8))
    r = cli("infer", str(clf), "--input", str(tmp_path / "one.npy"))
    assert r.exit_code == 0 and r.output.startswith("0: ") and "(p=" in r.output
    # A classifier draws nothing: --seed and --overwrite were passed over without a word.
    for flag in (["--seed", "5"], ["--overwrite"]):
        r = cli("infer", str(clf), "--input", str(tmp_path / "one.npy"), *flag)
        said = _flat(r.output)
        assert r.exit_code == 2 and f"{flag[0]} applies with a decoder artifact only" in said


def _ort_probabilities(path: Path, x: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """An independent reading: onnxruntime and numpy on the file, no edgefl code between."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = json.loads(session.get_modelmeta().custom_metadata_map["edgefl"])["class_names"]
    (feed,) = session.get_inputs()
    logits = session.run(None, {feed.name: x})[0].astype(np.float64)
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True), names


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A classifier trained long enough to tell digits apart (a one-epoch wristband shard's
    says one class to every input, which no comparison of predictions can fault)."""
    job = ClientJob(
        profile="smartphone",
        dataset="digits",
        out_dir=str(tmp_path_factory.mktemp("classifier")),
        num_clients=1,
        partition="iid",
        epochs=3,
        model="scnn:width=8",
    )
    return run_client(job).path


def test_infer_agrees_with_onnxruntime_run_directly(cli, classifier, tmp_path):
    """What `edgefl infer` prints and returns is what onnxruntime computes on the same file and
    inputs: real digits, more than one of infer's 256-row chunks, float and uint8 input."""
    from edgefl.data import load_dataset

    clf = classifier
    x = np.asarray(load_dataset("digits", "test").x[:300], dtype=np.float32)  # (300, 1, 8, 8)
    want, names = _ort_probabilities(clf, x)
    assert len(set(want.argmax(1).tolist())) > 3  # a test that can tell classes apart
    np.save(tmp_path / "x.npy", x)
    r = cli("infer", str(clf), "--input", str(tmp_path / "x.npy"), "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    np.testing.assert_allclose(np.array(got["probabilities"]), want, atol=1e-5)
    assert got["predictions"] == [names[k] for k in want.argmax(1)]
    # The human lines: one per sample, its top class and that class's probability.
    r = cli("infer", str(clf), "--input", str(tmp_path / "x.npy"))
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines == [
        f"{i}: {names[k]} (p={want[i, k]:.3f})" for i, k in enumerate(want.argmax(1))
    ], lines[:5]
    # uint8 pixels are x / 255 to the model: the same as onnxruntime on the scaled floats.
    pixels = (x[:40] * 255).round().astype(np.uint8)
    np.save(tmp_path / "u8.npy", pixels)
    r = cli("infer", str(clf), "--input", str(tmp_path / "u8.npy"), "--json")
    assert r.exit_code == 0, r.output
    want8, _ = _ort_probabilities(clf, pixels.astype(np.float32) / 255)
    np.testing.assert_allclose(np.array(json.loads(r.stdout)["probabilities"]), want8, atol=1e-5)


def test_infer_decoder(cli, artifacts, tmp_path):
    _, dec = artifacts
    np.save(tmp_path / "labels.npy", np.array([0, 3, 9]))
    r = cli("infer", str(dec), "--input", str(tmp_path / "labels.npy"))
    assert r.exit_code == 0, r.output
    images = np.load(tmp_path / "labels.generated.npy")
    assert images.shape == (3, 1, 8, 8) and images.min() >= 0 and images.max() <= 1
    out = tmp_path / "gen.npy"
    r = cli("infer", str(dec), "--input", str(tmp_path / "labels.npy"), "--out", str(out), "--json")
    assert r.exit_code == 0 and json.loads(r.stdout) == {"shape": [3, 1, 8, 8], "path": str(out)}


def test_infer_never_replaces_a_file_unasked(cli, artifacts, tmp_path):
    """An upload named as --out became 896 bytes of images, the labels their own images, a
    user's file the default output: a .npy says nothing of who wrote it, so --overwrite."""
    clf, dec = artifacts
    labels = tmp_path / "labels.npy"
    np.save(labels, np.array([0, 3, 9]))
    mine = tmp_path / "labels.generated.npy"
    mine.write_bytes(b"mine")
    upload = tmp_path / "up.onnx"
    upload.write_bytes(clf.read_bytes())
    for args, says in (
        ([], f"{mine} already exists; this run would replace it"),
        (["--out", str(upload)], "its name should end in .npy"),
        (["--out", str(labels)], f"--out {labels} is the --input labels itself"),
        (["--out", str(labels), "--overwrite"], "is the --input labels itself"),
        (["--seed", "-1"], "--seed must be an integer in 0.."),
    ):
        r = cli("infer", str(dec), "--input", str(labels), *args)
        said = " ".join(r.output.split())
        assert r.exit_code == 2 and says in said, said
    assert mine.read_bytes() == b"mine" and upload.read_bytes() == clf.read_bytes()
    assert np.array_equal(np.load(labels), [0, 3, 9])
    r = cli("infer", str(dec), "--input", str(labels), "--overwrite")
    assert r.exit_code == 0 and np.load(mine).shape == (3, 1, 8, 8), r.output


@pytest.mark.parametrize(
    "which, make, expect",
    [
        (
            "clf",
            lambda: np.zeros((2, 3, 8, 8), np.float32),
            "expected images of shape (N, 1, 8, 8)",
        ),
        ("clf", lambda: np.zeros((2, 1, 8, 8), np.int32), "got dtype int32"),
        ("clf", lambda: np.full((1, 1, 8, 8), 2.0, np.float32), "must lie in [0, 1]"),
        ("dec", lambda: np.array([0, 10, -1]), "labels [-1, 10] are outside the valid range 0..9"),
        ("dec", lambda: np.zeros((2, 2), np.int64), "expected integer labels of shape (N,)"),
        ("dec", lambda: np.array([0.5]), "got dtype float64"),
        ("clf", None, "does not exist"),
        ("clf", lambda: b"0.1 0.2 0.3\n", "is not a .npy file"),  # not numpy's pickle message
        ("clf", lambda: np.array([{"x": 1}], dtype=object), "holds Python objects"),
    ],
)
def test_infer_bad_input_exits_2(cli, artifacts, tmp_path, which, make, expect):
    path = tmp_path / "in.npy"
    if make is not None:
        made = make()
        path.write_bytes(made) if isinstance(made, bytes) else np.save(path, made)
    art = artifacts[0] if which == "clf" else artifacts[1]
    r = cli("infer", str(art), "--input", str(path))
    assert r.exit_code == 2 and expect in _flat(r.output) and "Traceback" not in r.output, r.output


def test_infer_bad_artifact_exits_2(cli, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1, 1, 8, 8), np.float32))
    (tmp_path / "junk.onnx").write_bytes(b"not a model\x00\xff")
    for art, expect in (
        ("junk.onnx", "not a readable edgefl artifact"),
        ("gone.onnx", "does not exist"),
    ):
        r = cli("infer", str(tmp_path / art), "--input", str(tmp_path / "x.npy"))
        assert r.exit_code == 2 and expect in _flat(r.output) and "Traceback" not in r.output


def test_on_device_script_needs_only_onnxruntime(artifacts):
    source = EXAMPLE.read_text()
    assert "import torch" not in source and "import edgefl" not in source
    assert "from edgefl" not in source and "from torch" not in source
    for path in artifacts:
        proc = subprocess.run(
            [sys.executable, str(EXAMPLE), str(path), "--batch", "4", "--runs", "5"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert "latency: median" in proc.stdout and "peak RSS:" in proc.stdout
    assert "output: float32 [4, 1, 8, 8]" in proc.stdout  # the decoder's images


def test_on_device_script_classifies_real_digits_from_npy_and_png(artifacts, tmp_path):
    import onnxruntime as ort
    from PIL import Image

    from edgefl.data import load_dataset

    clf = artifacts[0]
    test = load_dataset("digits", "test")
    x = np.asarray(test.x[:6], dtype=np.float32)  # (6, 1, 8, 8) in [0, 1]
    np.save(tmp_path / "six.npy", x)
    want = ort.InferenceSession(str(clf)).run(None, {"input": x})[0].argmax(1)
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), str(clf), str(tmp_path / "six.npy"), "--runs", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    got = [
        int(line.split("class ")[1].split()[0])
        for line in proc.stdout.splitlines()
        if line.startswith("sample ")
    ]
    assert got == want.tolist()
    # The same first digit as a picture, 4x larger, dark on white: resized and --invert-ed back.
    big = (255 * (1 - x[0, 0])).astype(np.uint8).repeat(4, 0).repeat(4, 1)
    Image.fromarray(big).save(tmp_path / "digit.png")
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            str(clf),
            str(tmp_path / "digit.png"),
            "--invert",
            "--runs",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"sample 0: class {want[0]} (" in proc.stdout
    np.save(tmp_path / "bad.npy", np.zeros((3, 5, 5), np.float32))
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), str(clf), str(tmp_path / "bad.npy")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "this model takes N x 1 x 8 x 8" in proc.stderr
    assert "Traceback" not in proc.stderr
