"""One run's outputs are one unit (issue 33): a fuse's global model and report are locked for
the run that writes them, staged, and published together once complete; the report names its
model's SHA-256; every check that can fail does so before the uploads are read and leaves the
previous outputs byte-identical; no name length ends in a traceback."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fed_fixtures import build_decoder_only, build_federation, build_mixed_federation, snapshot
from typer.testing import CliRunner

import edgefl.data.datasets
import edgefl.outputs
import exporters.atomic
from edgefl.cli import app
from edgefl.errors import ConfigError
from edgefl.outputs import Staging, lock_outputs
from edgefl.server.fuse import FuseJob, run_fuse

ROOT = Path(__file__).resolve().parents[2]
CLI = "import sys; from edgefl.cli import main; sys.argv[0] = 'edgefl'; main()\n"
# Prepended to CLI: the run waits as fusion starts (the outputs locked, the uploads read) until
# the file named by EDGEFL_TEST_GO exists, so that a second run meets the lock for certain.
HOLD = """
import os, sys, time
import edgefl.server.fuse as _f
_fuse = _f.fuse_one
def _held(*args, **kwargs):
    sys.stderr.write("@@holding\\n")
    sys.stderr.flush()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.environ["EDGEFL_TEST_GO"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _fuse(*args, **kwargs)
_f.fuse_one = _held
"""


@pytest.fixture(scope="session")
def federation(tmp_path_factory):
    return build_federation(tmp_path_factory.mktemp("fed"))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cli(*args, code: int):
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == code, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return " ".join(r.output.split())


def assert_pair(model: Path, report: Path, method: str) -> dict:
    """The report on disk describes the model beside it, byte for byte."""
    rep = json.loads(report.read_text())
    assert rep["method"] == method
    assert rep["global_sha256"] == sha256(model)
    assert rep["global_bytes"] == model.stat().st_size
    return rep


@pytest.fixture(scope="module")
def previous(federation, tmp_path_factory) -> Path:
    """A folder holding a finished fedavg run's g.onnx and g.json: what a later failing run
    must leave byte-identical (copy it per test)."""
    out = tmp_path_factory.mktemp("previous")
    run_fuse(
        FuseJob(uploads=str(federation), method="fedavg", out=str(out / "g.onnx"), device="cpu")
    )
    assert sorted(os.listdir(out)) == ["g.json", "g.onnx"]
    assert_pair(out / "g.onnx", out / "g.json", "fedavg")
    return out


@pytest.fixture
def out(previous, tmp_path) -> Path:
    folder = tmp_path / "out"
    folder.mkdir()
    for name in os.listdir(previous):
        (folder / name).write_bytes((previous / name).read_bytes())
    return folder


@pytest.fixture
def no_data(monkeypatch):
    """Reading a registered dataset fails the test: the checks come before any data."""

    def refuse(*a, **k):
        raise AssertionError("data was read before the run's inputs were checked")

    monkeypatch.setattr(edgefl.data.datasets, "_load_registered", refuse)


@pytest.fixture
def no_ingest(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the uploads were read before the run's checks")

    monkeypatch.setattr("edgefl.server.fuse.ingest", refuse)


# --- two real processes on one --out ---------------------------------------------------------


def _spawn(args: list[str], env: dict | None = None, prefix: str = "") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", prefix + CLI, *map(str, args)],
        cwd=ROOT,
        env=dict(os.environ, **(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_second_run_on_held_outputs_is_refused_naming_the_holder(federation, out, tmp_path):
    go = tmp_path / "go"
    fuse = [
        "server",
        "fuse",
        federation,
        "--out",
        out / "g.onnx",
        "--device",
        "cpu",
        "--quiet",
        "--overwrite",
    ]  # another method replaces the previous fedavg pair
    first = _spawn(
        [*fuse, "--method", "fedmho", "--epochs", "1"], {"EDGEFL_TEST_GO": str(go)}, prefix=HOLD
    )
    try:
        while "@@holding" not in first.stderr.readline():  # it holds the lock, has ingested
            assert first.poll() is None, first.stderr.read()
        before = snapshot(out)
        second = _spawn([*fuse, "--method", "fedavg"])
        err = " ".join(second.communicate(timeout=120)[1].split())
        assert second.returncode == 2, err
        assert f"being written by another run (pid {first.pid}, started " in err, err
        assert f"kill {first.pid}" in err and "Traceback" not in err, err
        assert snapshot(out) == before  # the refused run touched nothing
    finally:
        go.touch()
        _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert sorted(os.listdir(out)) == ["g.json", "g.onnx"]  # no lock or staging left
    assert_pair(out / "g.onnx", out / "g.json", "fedmho")


def test_two_runs_started_together_leave_a_pair_that_belongs_together(federation, out):
    fuse = [
        "server",
        "fuse",
        federation,
        "--out",
        out / "g.onnx",
        "--device",
        "cpu",
        "--quiet",
        "--overwrite",
    ]  # two methods, one --out: each replaces the other's
    runs = {
        "fedavg": _spawn([*fuse, "--method", "fedavg"]),
        "fedmho": _spawn([*fuse, "--method", "fedmho", "--epochs", "1"]),
    }
    done = {m: (p.wait(timeout=180), p.stderr.read()) for m, p in runs.items()}
    codes = sorted(code for code, _ in done.values())
    # One holds the outputs, the other is refused at once; if one finished before the other
    # even started, both ran in turn. Either way, never two at once.
    assert codes in ([0, 2], [0, 0]), done
    for method, (code, err) in done.items():
        if code == 2:
            other = runs["fedmho" if method == "fedavg" else "fedavg"]
            said = " ".join(err.split())
            # The holder is named once it has written who it is; in the instant between its
            # lock and that line, the refusal says a run is just starting (both are refusals).
            assert f"another run (pid {other.pid}" in said or "just starting" in said, err
    rep = json.loads((out / "g.json").read_text())
    assert_pair(out / "g.onnx", out / "g.json", rep["method"])
    assert done[rep["method"]][0] == 0
    assert sorted(os.listdir(out)) == ["g.json", "g.onnx"]


# --- each check that can fail: before the uploads, previous outputs byte-identical ----------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--eval", "mnst:test"], "--eval 'mnst:test': unknown dataset 'mnst'; did you mean"),
        (["--eval", "digits:tst"], "--eval 'digits:tst': unknown split 'tst'"),
        (["--eval", "digits:public"], "unknown split 'public'"),
        (["--method", "feddf", "--public", "mnst:public"], "feddf --public 'mnst:public'"),
        (["--method", "feddf", "--public", "digits:pub"], "unknown split 'pub'"),
        (["--out", "{out}/" + "a" * 252 + ".onnx"], "a name of 257 bytes, longer than the 255"),
        (["--report", "{out}/" + "r" * 252 + ".json"], "--report"),
        (["--out", "{out}/g.onnx", "--report", "{out}"], "is a directory"),
        (["--out", "{out}/g.onnx", "--report", "{out}/g.onnx"], "the global model's own path"),
    ],
    ids=[
        "eval-name",
        "eval-split",
        "eval-public-split",
        "public-name",
        "public-split",
        "out-too-long",
        "report-too-long",
        "report-is-folder",
        "report-is-model",
    ],
)
def test_a_failing_check_leaves_previous_outputs_identical(
    args, message, federation, out, no_data, no_ingest
):
    args = [a.format(out=out) for a in args]
    if "--method" not in args:
        args += ["--method", "fedavg"]
    if "--out" not in args:
        args += ["--out", out / "g.onnx"]
    before = snapshot(out)
    text = cli("server", "fuse", federation, *args, "--device", "cpu", code=2)
    assert message in text and "fix:" in text, text
    assert snapshot(out) == before


def test_held_outputs_refuse_before_any_upload_is_read(federation, out, no_ingest):
    before = snapshot(out)
    with lock_outputs([out / "g.json"]):  # one file of the set is enough
        text = cli(
            "server", "fuse", federation, "--method", "fedavg", "--out", out / "g.onnx", code=2
        )
        assert f"g.json is being written by another run (pid {os.getpid()}, started" in text
        assert "fix: wait for that run to finish" in text
    assert snapshot(out) == before  # the lock file went with its holder


def test_a_failing_fusion_leaves_previous_outputs_identical(out, tmp_path_factory):
    decoders = build_decoder_only(tmp_path_factory.mktemp("dec"))
    before = snapshot(out)
    text = cli(
        "server",
        "fuse",
        decoders,
        "--method",
        "fedavg",
        "--out",
        out / "g.onnx",
        "--device",
        "cpu",
        code=2,
    )
    assert "classifier" in text
    assert snapshot(out) == before


def test_a_failing_evaluation_leaves_previous_outputs_identical(federation, out, monkeypatch):
    """The model is exported and evaluated before anything is published: the old code had
    replaced the model and deleted its report by then."""
    from edgefl.errors import ArtifactError

    seen = []

    def fails(art, *a, **k):
        seen.append(art.path)
        raise ArtifactError("model expects inputs (1, 8, 8), dataset has (1, 28, 28)")

    monkeypatch.setattr("edgefl.evaluate.evaluate_artifact", fails)
    before = snapshot(out)
    text = cli(
        "server",
        "fuse",
        federation,
        "--method",
        "fedavg",
        "--out",
        out / "g.onnx",
        "--eval",
        "digits",
        "--device",
        "cpu",
        code=2,
    )
    assert "model expects inputs" in text
    assert seen and Path(seen[0]).parent.parent == out  # the staged model, beside the target
    assert snapshot(out) == before


def test_a_failing_export_leaves_previous_outputs_identical(federation, out, monkeypatch):
    def fails(*a, **k):
        raise exporters.ExportError("parity check failed")

    monkeypatch.setattr(exporters, "export_onnx", fails)
    before = snapshot(out)
    text = cli(
        "server",
        "fuse",
        federation,
        "--method",
        "fedavg",
        "--out",
        out / "g.onnx",
        "--device",
        "cpu",
        code=2,
    )
    assert "exporting the global model failed" in text
    assert snapshot(out) == before


def test_ctrl_c_while_publishing_waits_for_the_whole_pair(federation, out, monkeypatch):
    """SIGINT between the renames that publish the model and the report acts after both."""
    calls, real = [], os.replace

    def replace(src, dst):
        if Path(dst).parent == out:  # publishing: staging folder -> target
            if not calls:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)  # the interrupt would land here, were it not deferred
            calls.append(Path(dst).name)
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    # Ctrl-C as at a terminal, even when the tests run as a background job (SIGINT ignored).
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_fuse(
                FuseJob(
                    uploads=str(federation),
                    method="fedmho",
                    out=str(out / "g.onnx"),
                    options={"epochs": 1},
                    device="cpu",
                    overwrite=True,
                )
            )
    finally:
        signal.signal(signal.SIGINT, old)
    assert calls == ["g.onnx", "g.json"]  # the report last, once its model is in place
    assert sorted(os.listdir(out)) == ["g.json", "g.onnx"]
    assert_pair(out / "g.onnx", out / "g.json", "fedmho")


# --- several methods into one --out-dir -------------------------------------------------------


def test_out_dir_each_method_a_pair_and_one_lock_for_the_set(federation, tmp_path, no_ingest):
    folder = tmp_path / "d"
    with lock_outputs([folder / "ensemble.json"]):
        text = cli(
            "server", "fuse", federation, "--method", "fedavg,ensemble", "--out-dir", folder, code=2
        )
    assert "ensemble.json is being written by another run" in text
    # fedavg's outputs were not started either: the folder made for the locks went with them
    assert not folder.exists()


def test_out_dir_a_refused_method_keeps_its_previous_pair(tmp_path, tmp_path_factory):
    mixed = build_mixed_federation(tmp_path_factory.mktemp("mixed"))
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "fedgh.onnx").write_bytes(b"previous fedgh model")
    (folder / "fedgh.json").write_text('{"previous": true}')
    before = snapshot(folder)
    # --overwrite: the previous pair stands for another run's fedgh (not an edgefl file here);
    # even when replacing is allowed, a refused method replaces nothing.
    cli(
        "server",
        "fuse",
        mixed,
        "--method",
        "fedgh,ensemble",
        "--out-dir",
        folder,
        "--device",
        "cpu",
        "--jobs",
        "2",
        "--overwrite",
        code=0,
    )
    # fedgh finds no prototypes among these uploads: refused, its previous pair untouched.
    # (This was fedavg over two architectures; fedavg now averages one and sets the other aside.)
    assert {n: before[n] for n in ("fedgh.onnx", "fedgh.json")} == {
        n: snapshot(folder)[n] for n in ("fedgh.onnx", "fedgh.json")
    }
    assert_pair(folder / "ensemble.onnx", folder / "ensemble.json", "ensemble")
    assert sorted(os.listdir(folder)) == sorted(["ensemble.json", "ensemble.onnx", *before])


# --- names of any legal length ----------------------------------------------------------------


def test_a_240_character_out_name_is_written(federation, tmp_path):
    target = tmp_path / ("g" * 235 + ".onnx")
    cli(
        "server",
        "fuse",
        federation,
        "--method",
        "fedavg",
        "--out",
        target,
        "--device",
        "cpu",
        code=0,
    )
    assert_pair(target, target.with_suffix(".json"), "fedavg")
    assert sorted(os.listdir(tmp_path)) == sorted([target.name, target.with_suffix(".json").name])


def test_a_255_byte_name_is_written_atomically(tmp_path):
    # A temporary name built from the target's ran past the limit; a dead writer's leftovers
    # (file or staging folder) are still cleaned, a live one's kept.
    dead = _dead_pid()
    stale = [tmp_path / f".atomic-{dead}-abc123.tmp", tmp_path / f".atomic-{dead}-xyz789.tmp"]
    stale[0].write_bytes(b"half")
    stale[1].mkdir()
    (stale[1] / "g.onnx").write_bytes(b"staged")
    live = tmp_path / f".atomic-{os.getpid()}-live00.tmp"
    live.write_bytes(b"being written")
    target = tmp_path / ("é" * 125 + ".json")  # 255 bytes, 130 characters
    exporters.atomic.atomic_write_text(target, "{}")
    assert target.read_text() == "{}"
    assert sorted(os.listdir(tmp_path)) == sorted([target.name, live.name])


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("length, code", [(240, 0), (252, 2)])
def test_long_client_id_is_written_or_refused_before_training(length, code, tmp_path, monkeypatch):
    if code == 2:  # refused before the data is even read
        monkeypatch.setattr(edgefl.data.datasets, "_load_registered", _refuse)
    client = "c" * length
    text = cli(
        "client",
        "train",
        "--profile",
        "wristband",
        "--dataset",
        "digits",
        "--num-clients",
        "4",
        "--epochs",
        "1",
        "--client-id",
        client,
        "--out",
        tmp_path / "up",
        "--quiet",
        code=code,
    )
    if code == 0:
        assert os.listdir(tmp_path / "up") == [f"{client}.onnx"]
    else:
        assert "--client-id is 252 bytes long" in text and "fix: use a shorter id" in text
        assert not (tmp_path / "up").exists()


def _refuse(*a, **k):
    raise AssertionError("data was read before --client-id was checked")


# --- the lock itself --------------------------------------------------------------------------


def test_lock_refuses_a_second_holder_and_goes_with_the_first(tmp_path):
    target = tmp_path / "g.onnx"
    with lock_outputs([target]):
        (lock,) = [p for p in tmp_path.iterdir() if p.name.startswith(".edgefl-lock-")]
        holder = json.loads(lock.read_text())
        assert holder["pid"] == os.getpid() and holder["started"].endswith("UTC")
        other = lock_outputs([tmp_path / "other.onnx", target])
        with pytest.raises(ConfigError, match="being written by another run"), other:
            pass
        assert not (tmp_path / "other.onnx").exists()
    assert os.listdir(tmp_path) == []  # released, and its file removed
    with lock_outputs([target]):  # free again
        pass


def test_lock_after_a_killed_holder_is_free(tmp_path):
    """flock dies with its holder: a SIGKILLed run's lock file does not block the next run."""
    target = tmp_path / "g.onnx"
    code = (
        "import sys, time; from edgefl.outputs import lock_outputs\n"
        f"with lock_outputs([{str(target)!r}]):\n"
        "    print('held', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    with pytest.raises(ConfigError, match=f"pid {proc.pid}"), lock_outputs([target]):
        pass
    proc.kill()
    proc.wait()
    with lock_outputs([target]):
        pass
    assert os.listdir(tmp_path) == []


def test_staging_publishes_every_staged_file_the_report_last(tmp_path, monkeypatch):
    """What a method writes beside its staged model (a picture) goes with it; a report in
    another folder is staged there (a rename never crosses folders); a replaced file keeps
    its mode; nothing reaches a target before publish."""
    model, report = tmp_path / "g.onnx", tmp_path / "r" / "g.json"
    model.write_bytes(b"old")
    os.chmod(model, 0o640)
    moved, real = [], os.replace
    monkeypatch.setattr(os, "replace", lambda s, d: (moved.append(Path(d)), real(s, d)))
    with Staging() as stage:
        staged = stage.path(model)
        staged.write_bytes(b"new")
        picture = staged.with_suffix(".png")
        picture.write_bytes(b"png")
        assert stage.final(picture) == tmp_path / "g.png"
        stage.path(report).write_text("{}")
        assert model.read_bytes() == b"old" and not report.exists()
        stage.publish(last=report)
    assert moved[-1] == report and sorted(moved[:-1]) == [model, tmp_path / "g.png"]
    assert model.read_bytes() == b"new" and model.stat().st_mode & 0o777 == 0o640
    assert sorted(os.listdir(tmp_path)) == ["g.onnx", "g.png", "r"]
    assert os.listdir(tmp_path / "r") == ["g.json"]


def test_staging_left_without_publish_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), Staging() as stage:
        stage.path(tmp_path / "g.onnx").write_bytes(b"half a run")
        raise RuntimeError("the evaluation failed")
    assert os.listdir(tmp_path) == []
