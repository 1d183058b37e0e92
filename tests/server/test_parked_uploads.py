"""Uploads parked on the server's disk after their checks (issue 36, `server fuse --resident-mib`):
a method reads each verified module back as it uses it, one at a time where it can, and every
global model is the one the uploads held in memory give; the parked folder goes with the run;
a bad budget or a disk without room is one message before the ingest."""

from __future__ import annotations

import json
import tempfile
import weakref
from pathlib import Path

import pytest
import torch
from fed_fixtures import CLASSIFIERS, DECODERS, build_federation

import exporters
from edgefl.artifacts import upload as upload_mod
from edgefl.fusion.averaging import average_classifiers
from edgefl.fusion.samples import decode
from edgefl.fusion.teachers import mean_teacher_logits
from edgefl.server import ingest as ingest_mod
from edgefl.server.ingest import ingest, parking

METHODS = "fedavg,fedmho-md,fedcvae-ens,ensemble"


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    return build_federation(tmp_path_factory.mktemp("fed"))


@pytest.fixture
def temp(tmp_path, monkeypatch):
    """The system temporary folder, as the server sees it: a fresh one per test."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _fuse(cli, federation, out: Path, *extra: str) -> dict:
    r = cli(
        "server",
        "fuse",
        str(federation),
        "--method",
        METHODS,
        "--out-dir",
        str(out),
        "--epochs",
        "1",
        "--opt",
        "robust=screen",
        "--eval",
        "digits",
        "--json",
        "--quiet",
        *extra,
    )
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_parked_uploads_give_the_same_global_models_and_leave_nothing(
    cli, federation, tmp_path, temp
):
    held = _fuse(cli, federation, tmp_path / "held")
    parked = _fuse(cli, federation, tmp_path / "parked", "--resident-mib", "0")
    uploads = len(CLASSIFIERS) + len(DECODERS)
    for method in METHODS.split(","):
        assert held[method]["uploads_parked"] == 0
        assert parked[method]["uploads_parked"] == uploads
        assert parked[method]["screened"] == held[method]["screened"]
        assert parked[method]["accuracy"] == held[method]["accuracy"], method
        a, b = (
            exporters.read_artifact(tmp_path / d / f"{method}.onnx").model
            for d in ("held", "parked")
        )
        assert exporters.weights_hash(a) == exporters.weights_hash(b), method
    assert list(temp.iterdir()) == []  # the parked folder went with the run


def test_a_parked_module_is_read_back_on_use_not_held(federation, tmp_path):
    held = {u.name: u for u in ingest(federation, max_upload_bytes=1 << 30).uploads}
    with parking(federation, 0) as folder:
        found = ingest(federation, max_upload_bytes=1 << 30, park_in=folder)
        assert len([p for p in folder.iterdir() if p.name != ingest_mod.HELD]) == len(held)
        x = torch.rand(5, 1, 8, 8)
        for u in found.uploads:
            assert u.resident is None and u.rebuilt and u.parked.parent == folder
            assert u.module is not u.module  # read at each access...
            with u.loaded():
                assert u.module is u.module  # ...but once for a block
            if u.kind == "classifier":
                torch.testing.assert_close(u.module(x), held[u.name].module(x), rtol=0, atol=0)
    assert not folder.exists()


def test_streaming_methods_hold_one_parked_module_at_a_time(federation, monkeypatch):
    """FedAvg's average, a teacher pass and a decoder's draws read one upload at a time: a
    module read back is alive, or its weights are (FedAvg reads state dicts), for one upload
    at a time."""
    holders: dict[int, int] = {}  # load -> its module and weight tensors still alive
    most = [0]

    def hold(load: int, obj) -> None:
        holders[load] = holders.get(load, 0) + 1
        weakref.finalize(obj, release, load)
        most[0] = max(most[0], len(holders))

    def release(load: int) -> None:
        holders[load] -= 1
        if not holders[load]:
            del holders[load]

    unparked, loads = upload_mod._unparked, weakref.WeakKeyDictionary()

    def counted(u):
        module = unparked(u)
        loads[module] = len(loads) + id(u)
        hold(loads[module], module)
        return module

    weights = torch.nn.Module.state_dict

    def state_dict(module, *a, **k):  # on the class: a patched instance would be a cycle
        sd = weights(module, *a, **k)
        if module in loads:
            for t in sd.values():
                hold(loads[module], t)
        return sd

    monkeypatch.setattr(torch.nn.Module, "state_dict", state_dict)
    monkeypatch.setattr(upload_mod, "_unparked", counted)
    with parking(federation, 0) as folder:
        found = ingest(federation, max_upload_bytes=1 << 30, park_in=folder)
        classifiers = found.of_kind("classifier")
        average_classifiers(classifiers, "fedavg")
        mean_teacher_logits(classifiers, torch.rand(20, 1, 8, 8), torch.device("cpu"))
        for d in found.of_kind("decoder"):
            decode(d, torch.arange(10).numpy().repeat(3), torch.Generator(), "cpu", batch=4)
    assert most[0] == 1 and not holders


def _fedavg(cli, federation, out: Path, resident_mib: str):
    return cli(
        "server",
        "fuse",
        str(federation),
        "--method",
        "fedavg",
        "--out",
        str(out),
        "--resident-mib",
        resident_mib,
    )


def test_a_negative_budget_is_one_message(cli, federation, tmp_path):
    r = _fedavg(cli, federation, tmp_path / "g.onnx", "-1")
    assert r.exit_code == 2
    assert "--resident-mib must be >= 0" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "g.onnx").exists()


def test_a_disk_without_room_is_refused_before_the_ingest(
    cli, federation, tmp_path, temp, monkeypatch
):
    class Full:
        free = 1024

    monkeypatch.setattr(ingest_mod.shutil, "disk_usage", lambda path: Full)
    monkeypatch.setattr(ingest_mod, "ingest", lambda *a, **k: pytest.fail("ingested anyway"))
    out = tmp_path / "g.onnx"
    r = _fedavg(cli, federation, out, "0")
    assert r.exit_code == 2, r.output
    said = " ".join(r.output.split())  # as one line, whatever the terminal's width
    assert f"in {temp}, which has 0.0 MiB free" in said and "point TMPDIR at a disk" in said
    assert "Traceback" not in r.output and not out.exists() and list(temp.iterdir()) == []


def test_a_dead_runs_parked_folder_is_swept_by_the_next_run_and_a_live_ones_is_not(
    federation, temp
):
    """A run's HELD lock (flock) lives as long as its process: a SIGKILLed run's folder goes at
    the next run's parking, a live run's stays, as does anything that is not a parked folder of
    ours (no HELD file, a link, a file)."""
    import os
    import subprocess
    import sys

    holder = (
        "import sys, time\n"
        "from edgefl.server.ingest import _park_folder\n"
        "folder, fd = _park_folder()\n"
        "print(folder, flush=True)\n"
        "time.sleep(60)\n"
    )
    env = dict(os.environ, TMPDIR=str(temp))
    procs = [
        subprocess.Popen([sys.executable, "-c", holder], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    live, dead = (Path(p.stdout.readline().strip()) for p in procs)
    assert live.is_dir() and dead.is_dir(), (live, dead)
    procs[1].kill()
    procs[1].wait()
    (dead / "client-000.pt").write_bytes(b"weights")
    making = temp / f"{ingest_mod.PARKED_PREFIX}making"
    making.mkdir()  # a folder whose HELD file is not there yet
    elsewhere = temp / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ingest_mod.HELD).write_text("")  # lockable, but only reachable by a link
    (temp / f"{ingest_mod.PARKED_PREFIX}link").symlink_to(elsewhere)
    (temp / f"{ingest_mod.PARKED_PREFIX}file").write_text("")
    try:
        with parking(federation, resident_mib=0) as folder:
            left = [p.name for p in temp.iterdir()]
            assert folder.name in left and live.name in left and dead.name not in left
            assert (folder / ingest_mod.HELD).exists()
    finally:
        procs[0].kill()
        procs[0].wait()
    assert (elsewhere / ingest_mod.HELD).exists() and making.exists()
    ours = sorted(p.name for p in temp.glob(f"{ingest_mod.PARKED_PREFIX}*"))
    assert ours == sorted(
        [live.name, making.name, *(f"{ingest_mod.PARKED_PREFIX}{k}" for k in ("link", "file"))]
    )
