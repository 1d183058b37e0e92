"""`edgefl server fuse` stopped by SIGINT, SIGTERM or SIGKILL at each stage of its run: the
uploads stay byte-identical, no output is left half-written or stray, no process of the run
outlives it, and a rerun of the same command writes the weights of a run never interrupted.

Each stage is reached deterministically: the stopped runs are the real CLI in a subprocess with
a test-only hook prepended that, at the chosen point, prints a marker on stderr and sleeps; the
test signals the process once it reads the marker. Reruns and the reference are the plain CLI.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fed_fixtures import build_federation, copy_uploads, snapshot

import exporters
from edgefl.server.ingest import PARKED_PREFIX

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc; signals as on Linux")

ROOT = Path(__file__).resolve().parents[2]
CLI = "import sys; from edgefl.cli import main; sys.argv[0] = 'edgefl'; main()\n"
EPOCHS = 3
MARKER = "@@paused"

# Prepended to CLI for the stopped runs. EDGEFL_TEST_PAUSE picks the point:
#   progress:TASK DONE  after the reporter is told that step (main thread: ingest, epochs)
#   write:NAME          once the output NAME is written whole into the run's staging folder
#                       (.atomic-*.tmp beside the target), before anything is published
#   fuse:METHOD         as METHOD (or any, with *) starts fusing: in its forked worker when
#                       several methods run
# It only waits there (bounded, so a lost signal ends the run rather than hanging the test).
HOOK = """
import os, signal, sys, time
# Ctrl-C as at a terminal, even when the tests run as a background job (SIGINT ignored there,
# and Python keeps an ignored SIGINT ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)
_at = os.environ["EDGEFL_TEST_PAUSE"]

def _pause():
    sys.stderr.write("@@paused " + _at + "\\n")
    sys.stderr.flush()
    time.sleep(30)

if _at.startswith("progress:"):
    import edgefl.progress as _p
    _call = _p.LineReporter.__call__
    def _hooked(self, task, done, total, note=""):
        _call(self, task, done, total, note)
        if _at == f"progress:{task} {done}":
            _pause()
    _p.LineReporter.__call__ = _hooked
elif _at.startswith("write:"):
    _replace = os.replace
    def _hooked(src, dst):
        _replace(src, dst)
        staging = os.path.basename(os.path.dirname(os.fspath(dst)))
        if os.path.basename(dst) == _at[6:] and staging.startswith(".atomic-"):
            _pause()
    os.replace = _hooked
elif _at.startswith("fuse:"):
    import edgefl.server.fuse as _f
    _fuse = _f.fuse_one
    def _hooked(p, *args, **kwargs):
        if _at[5:] in ("*", p.method.name):
            _pause()
        return _fuse(p, *args, **kwargs)
    _f.fuse_one = _hooked
"""

# --jobs 2: two forked method workers whatever the machine's core count.
MANY = ["--method", "fedavg,fedmho", "--opt", f"fedmho:epochs={EPOCHS}", "--jobs", "2"]
ONE = ["--method", "fedmho", "--epochs", str(EPOCHS)]
# The stopped runs and their reruns park every checked upload on disk (in the test's own
# TMPDIR): their folder must go with the run, and the rerun's weights equal the reference's,
# made with the uploads held in memory.
PARK = ["--resident-mib", "0"]
PARKED = f"{PARKED_PREFIX}*"


@pytest.fixture(scope="session")
def federation(tmp_path_factory):
    return build_federation(tmp_path_factory.mktemp("fed"))


@pytest.fixture(scope="module")
def uploads(federation, tmp_path_factory) -> Path:
    return copy_uploads(federation, tmp_path_factory.mktemp("stopped") / "uploads")


@pytest.fixture(scope="module")
def reference(uploads, tmp_path_factory) -> Path:
    """Both methods' outputs from a run never interrupted (fedmho's weights equal the one-method
    run's: same seed, one torch thread in either)."""
    out = tmp_path_factory.mktemp("reference")
    done = _run_plain([*MANY, "--out-dir", str(out)], uploads)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _argv(args: list[str], uploads: Path) -> list[str]:
    return ["server", "fuse", str(uploads), *args, "--quiet"]


def _run_plain(args: list[str], uploads: Path, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CLI, *_argv(args, uploads)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


def _stop_at(
    pause: str, sig: signal.Signals, args: list[str], uploads: Path, logs: Path, env: dict
):
    """Run until the hook's marker, send `sig` to the server process (not its group: `kill PID`,
    an OOM kill), wait for it; (returncode, stderr, its session id)."""
    err = logs / "stderr.txt"
    # Files, not pipes: a process that outlives the server must not block the test's reads.
    # No --quiet: the progress hook wraps the line reporter.
    argv = [a for a in _argv(args, uploads) if a != "--quiet"]
    with open(err, "wb") as e, open(logs / "stdout.txt", "wb") as o:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOOK + CLI, *argv],
            cwd=ROOT,
            env=dict(env, EDGEFL_TEST_PAUSE=pause),
            stdout=o,
            stderr=e,
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    while MARKER not in err.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            _kill_session(proc.pid)
            proc.wait()
            pytest.fail(f"never reached {pause} (exit {proc.returncode}):\n{err.read_text()}")
        time.sleep(0.05)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    return proc.returncode, err.read_text(errors="replace"), proc.pid


def _alive_in_session(sid: int) -> list[int]:
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[3]) == sid and fields[0] != "Z":  # fields: state, ppid, pgrp, session
            alive.append(int(entry))
    return alive


def _kill_session(sid: int) -> None:
    for pid in _alive_in_session(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _survivors(sid: int, grace: float = 10.0) -> list[int]:
    """Processes of the stopped run still alive `grace` seconds after the server process ended
    (forked method workers exit on their own once they notice, if they do). Generous: this
    file runs beside other tests, and a loaded core stretches how soon a worker notices; an
    orphan that lives on (the failure) is alive after any grace."""
    deadline = time.monotonic() + grace
    while (alive := _alive_in_session(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def _output_problems(
    out: Path, expected: dict[str, str], ref: Path, tolerate_temp: bool, complete: bool
) -> list[str]:
    """What is wrong in the output folder: `expected` maps each output's stem to its method.
    Every output present must be whole and from a whole run (weights equal the reference);
    with `complete`, all must be present. A temp file is tolerated only after a SIGKILL."""
    problems = []
    names = set(os.listdir(out)) if out.exists() else set()
    outputs = {f"{stem}{ext}" for stem in expected for ext in (".onnx", ".json")}
    # A dead run's staging folder or temp file, and its output locks (flock dies with it).
    temp = re.compile(r"^\.(atomic-\d+-\w+\.tmp|edgefl-lock-[0-9a-f]{16})$")
    for name in sorted(names - outputs):
        if not (tolerate_temp and temp.match(name)):
            problems.append(f"stray file {name} in the output folder")
    for stem, method in expected.items():
        model, report = out / f"{stem}.onnx", out / f"{stem}.json"
        if complete and not (model.exists() and report.exists()):
            problems.append(f"{stem}: the rerun did not write both {model.name} and {report.name}")
        if model.exists():
            try:
                art = exporters.validate_upload(model)
            except exporters.UploadRejected as exc:
                problems.append(f"{model.name} is not a whole model: {exc.reason}")
            else:
                want = exporters.weights_hash(exporters.read_artifact(ref / f"{method}.onnx").model)
                if exporters.weights_hash(art.model) != want:
                    problems.append(f"{model.name}: weights differ from an uninterrupted run")
        if report.exists():
            try:
                rep = json.loads(report.read_text())
            except (ValueError, UnicodeDecodeError) as exc:
                problems.append(f"{report.name} is not whole JSON: {exc}")
                continue
            if rep.get("method") != method:
                problems.append(f"{report.name} reports method {rep.get('method')!r}")
            if not model.exists() or rep.get("global_sha256") != _sha256(model):
                problems.append(f"{report.name} describes a model other than {model.name}")
    return problems


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def case(case_id: str, sig: signal.Signals, pause: str, previous: bool = False):
    """`previous`: a complete earlier run's outputs are already in the output folder."""
    return pytest.param(sig, pause, previous, id=case_id)


CASES = [
    case("ingest-INT", signal.SIGINT, "progress:ingest upload 1"),
    case("train-KILL", signal.SIGKILL, "progress:fedmho epoch 1"),
    # Over a previous run's outputs: the old model must survive whole, or be replaced whole.
    case("model-write-INT", signal.SIGINT, "write:g.onnx", previous=True),
    # The new model and its report are staged, not yet published.
    case("report-write-TERM", signal.SIGTERM, "write:g.json"),
]


@pytest.mark.parametrize("sig, pause, previous", CASES)
def test_one_method_stopped(sig, pause, previous, uploads, reference, tmp_path):
    out = tmp_path / "out"
    if previous:
        out.mkdir()
        shutil.copyfile(reference / "fedmho.onnx", out / "g.onnx")
        shutil.copyfile(reference / "fedmho.json", out / "g.json")
    args = [*ONE, "--out", str(out / "g.onnx")]
    _check_stop_and_rerun(pause, sig, args, out, {"g": "fedmho"}, uploads, reference, tmp_path)


def test_many_methods_server_terminated(uploads, reference, tmp_path):
    """Two methods in forked workers; the server process alone gets SIGTERM (`kill PID`, docker
    stop) while they fuse. Both workers wait at the start of fusion, so nothing they would
    write later can be caught half-way by the test's own clean-up."""
    out = tmp_path / "out"
    expected = {"fedavg": "fedavg", "fedmho": "fedmho"}
    _check_stop_and_rerun(
        "fuse:*",
        signal.SIGTERM,
        [*MANY, "--out-dir", str(out)],
        out,
        expected,
        uploads,
        reference,
        tmp_path,
    )


def _check_stop_and_rerun(pause, sig, args, out, expected, uploads, reference, tmp_path):
    """Stop the run at `pause` with `sig`, check what it left, rerun it, check again; every
    problem found is listed in one failure."""
    before = snapshot(uploads)
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = dict(os.environ, TMPDIR=str(temp))
    args = [*args, *PARK]
    rc, err, sid = _stop_at(pause, sig, args, uploads, tmp_path, env)
    problems = []
    if sig == signal.SIGINT and (rc != 130 or "interrupted" not in err):
        problems.append(f"SIGINT: exit {rc}, not 130 with the 'interrupted' line")
    if sig == signal.SIGTERM and (rc != 143 or "terminated" not in err):
        problems.append(f"SIGTERM: exit {rc}, not 143 with the 'terminated' line")
    if rc == 0:
        problems.append(f"{sig.name} at {pause}: the run still exited 0")
    if alive := _survivors(sid):
        problems.append(f"processes {alive} of the stopped run still alive after the server")
    _kill_session(sid)  # whatever survived must not write during the rerun
    if snapshot(uploads) != before:
        problems.append("the stopped run changed the upload folder")
    after_stop = set(temp.glob(PARKED))  # a SIGKILL leaves its folder: nothing can run then
    if sig != signal.SIGKILL and after_stop:
        problems.append(f"the stopped run left its parked uploads: {sorted(after_stop)}")
    if sig == signal.SIGKILL and not after_stop:
        problems.append("the SIGKILLed run parked nothing: the rerun's sweep is not tested")
    problems += [
        f"after the stop: {p}"
        for p in _output_problems(out, expected, reference, sig == signal.SIGKILL, False)
    ]

    rerun = _run_plain(args, uploads, env)
    if rerun.returncode != 0:
        problems.append(f"rerun exited {rerun.returncode}: {rerun.stderr[-2000:]}")
    problems += [
        f"after the rerun: {p}" for p in _output_problems(out, expected, reference, False, True)
    ]
    if snapshot(uploads) != before:
        problems.append("the rerun changed the upload folder")
    if left := set(temp.glob(PARKED)):  # its own, or the killed run's: a dead run's is swept
        problems.append(f"the rerun left parked uploads: {sorted(left)}")
    for stem in expected:
        with contextlib.suppress(OSError, ValueError):
            if not json.loads((out / f"{stem}.json").read_text()).get("uploads_parked"):
                problems.append(f"the rerun's {stem}.json says no upload was parked")
    assert not problems, "\n".join(problems) + f"\n--- stopped run's stderr:\n{err[-3000:]}"
