"""`server fuse` with several methods forks one worker per method. An onnxruntime session made in
the server before the fork and left in a reference cycle must never be destroyed in a worker:
its destructor waits for the server's runtime threads, which a fork does not copy, and the worker
(and the run) would hang forever. Seen in the suite on 2026-11-28 once export stopped allocating
enough to trigger a collection in the server first.

The real CLI runs in a subprocess with a hook prepended that leaves such a session as garbage
(automatic collection off, so nothing collects it by chance) and makes each forked worker
collect garbage as it starts, which a worker's allocations would do at some point anyway.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from fed_fixtures import CLASSIFIERS, build_federation

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork start method")

HOOK = """
import gc
import exporters
import edgefl.server.workers as _f

_art = exporters.read_artifact({upload!r})
_art.session()  # onnxruntime's session with its threads, in this (the server's) process
_cycle = [_art]
_cycle.append(_cycle)
del _art, _cycle
gc.disable()
_start = _f._worker_start

def _collecting(parent):
    _start(parent)
    gc.collect()

_f._worker_start = _collecting
import sys
from edgefl.cli import main
sys.argv = ["edgefl", *{argv!r}]
main()
"""


@pytest.fixture(scope="session")
def federation(tmp_path_factory):
    return build_federation(tmp_path_factory.mktemp("fed"))


def test_forked_workers_never_destroy_the_servers_sessions(federation, tmp_path):
    out = tmp_path / "global"
    argv = ["server", "fuse", str(federation), "--method", "fedavg,ensemble", "--jobs", "2"]
    argv += ["--out-dir", str(out), "--quiet"]
    code = HOOK.format(upload=str(federation / f"{CLASSIFIERS[0]}.onnx"), argv=argv)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=180
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a forked fusion worker hung destroying the server's onnxruntime session")
    assert done.returncode == 0, done.stderr[-3000:]
    assert {p.name for p in out.glob("*.onnx")} == {"fedavg.onnx", "ensemble.onnx"}
