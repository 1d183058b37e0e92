"""Forked workers (`edgefl.server.workers`, the many-method path of `server fuse` and
`simulate`): a worker killed mid-task costs that task only, an exception waits for the running
tasks and is raised, and lines come back to the server in order."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from edgefl.server.workers import Died, run_forked

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork start method")


def _lines():
    seen: list = []
    return seen, seen.append, lambda *args: seen.append(args)


def test_results_by_task_and_lines_relayed():
    seen, log, progress = _lines()

    def work(task, log, progress):
        log(f"task {task} in {os.getpid()}")
        progress("steps", 1, 1)
        return task * task

    done = run_forked([3, 1, 2, 0], work, 2, log, progress)
    assert done == {0: 0, 1: 1, 2: 4, 3: 9}
    pids = {line.split()[-1] for line in seen if isinstance(line, str)}
    assert len(pids) == 2 and str(os.getpid()) not in pids  # two forked workers did the work
    assert seen.count(("steps", 1, 1)) == 4


def test_a_killed_worker_costs_its_task_only():
    """Killed as the out-of-memory killer would (SIGKILL): a multiprocessing.Pool waited
    forever for the lost task; here the task is Died and a fresh worker takes the rest."""
    seen, log, progress = _lines()

    def work(task, log, progress):
        if task == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return task

    start = time.monotonic()
    done = run_forked([0, 1, 2, 3, 4], work, 2, log, progress)
    assert time.monotonic() - start < 60
    assert isinstance(done[1], Died) and done[1].exitcode == -signal.SIGKILL
    assert "SIGKILL" in done[1].why and "out of memory" in done[1].why
    assert {k: v for k, v in done.items() if k != 1} == {0: 0, 2: 2, 3: 3, 4: 4}


def test_an_exception_lets_the_running_tasks_finish_then_is_raised(tmp_path):
    def work(task, log, progress):
        if task == 0:
            raise KeyboardInterrupt  # e.g. what a test injects; a real worker ignores SIGINT
        time.sleep(0.5)
        (tmp_path / f"{task}.done").write_text("whole")
        return task

    with pytest.raises(KeyboardInterrupt):
        run_forked([0, 1, 2, 3], work, 2, print, print)
    # Task 1 was running beside task 0 and finished; 2 and 3 never started.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1.done"]


def test_an_exception_that_does_not_pickle_arrives_as_text():
    class Odd(Exception):
        def __reduce__(self):
            raise TypeError("no")

    def work(task, log, progress):
        raise Odd("the detail")

    with pytest.raises(RuntimeError, match=r"(?s)in a forked worker.*Odd: the detail"):
        run_forked([0], work, 1, print, print)


HOOK = """
import os, signal, sys
import edgefl.server.fuse as _f
_fuse = _f.fuse_one
def _hooked(p, *args, **kwargs):
    if p.method.name == "fedmho":  # as the out-of-memory killer would, mid-fusion
        os.kill(os.getpid(), signal.SIGKILL)
    return _fuse(p, *args, **kwargs)
_f.fuse_one = _hooked
from edgefl.cli import main
sys.argv = ["edgefl", *{argv!r}]
main()
"""


def test_server_fuse_goes_on_when_a_methods_worker_is_killed(tmp_path):
    import json
    import subprocess

    from fed_fixtures import build_federation

    federation = build_federation(tmp_path / "fed")
    out = tmp_path / "global"
    argv = ["server", "fuse", str(federation), "--method", "fedavg,fedmho", "--jobs", "2"]
    argv += ["--opt", "fedmho:epochs=1", "--out-dir", str(out), "--json", "--quiet"]
    done = subprocess.run(
        [sys.executable, "-c", HOOK.format(argv=argv)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reports = json.loads(done.stdout)
    assert "error" not in reports["fedavg"] and (out / "fedavg.onnx").is_file()
    assert "worker process died by signal SIGKILL" in reports["fedmho"]["error"]
    assert not (out / "fedmho.onnx").exists()
    assert sorted(p.name for p in out.iterdir()) == ["fedavg.json", "fedavg.onnx"]


SIGNAL_AT_FORK = """
import os, signal, sys, threading, time
from edgefl.cli import Terminated, _terminated
from edgefl.server.workers import run_forked

signal.signal(signal.SIGTERM, _terminated)
# Another thread, as a server has: the kernel may hand it the signal (a thread mask, the first
# fix, lost it then in a loaded run).
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
armed = [True]
def _at_fork():  # the signal lands while the parent runs its after-fork handlers
    if armed:
        armed.clear()
        os.kill(os.getpid(), signal.SIGTERM)
os.register_at_fork(after_in_parent=_at_fork)

def work(task, log, progress):
    time.sleep(0.2)
    return task

try:
    run_forked([0, 1, 2], work, 2, print, print)
except Terminated:
    sys.exit(143)
sys.exit(0)
"""


def test_a_signal_during_a_fork_is_not_lost():
    """A SIGTERM whose handler ran inside the parent's after-fork handlers (logging's lock
    release) was swallowed there ("Exception ignored") and the run finished with exit 0."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", SIGNAL_AT_FORK], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 143, (done.returncode, done.stderr[-2000:])
    assert "Exception ignored" not in done.stderr


def test_the_cores_go_to_the_methods_that_train(cli, tmp_path, monkeypatch, request):
    """An average beside one method that trains does not halve that method's cores: it still
    fuses in a forked worker (a kill costs its task only), with every core's thread; two
    methods that train share the cores."""
    import torch
    from fed_fixtures import build_federation

    import edgefl.server.fuse as fuse

    federation = build_federation(tmp_path / "fed")
    seen = tmp_path / "threads"
    real = fuse.fuse_one

    def noted(p, *args, **kwargs):  # runs in the worker: the fork inherits the patch
        with seen.open("a") as f:
            f.write(f"{p.method.name} {torch.get_num_threads()} {os.getpid()}\n")
        return real(p, *args, **kwargs)

    monkeypatch.setattr(fuse, "fuse_one", noted)
    cores = os.cpu_count() or 1
    before = torch.get_num_threads()  # the suite runs one thread (conftest); a server, all
    torch.set_num_threads(cores)
    request.addfinalizer(lambda: torch.set_num_threads(before))

    def threads(methods: str) -> dict[str, int]:
        seen.unlink(missing_ok=True)
        out = tmp_path / methods.replace(",", "-")
        argv = ["server", "fuse", str(federation), "--method", methods, "--jobs", "2"]
        fast = [
            a
            for m in methods.split(",")
            if m.startswith("fedmho")
            for a in ("--opt", f"{m}:epochs=1")
        ]
        r = cli(*argv, *fast, "--out-dir", str(out), "--quiet")
        assert r.exit_code == 0, r.output
        rows = [line.split() for line in seen.read_text().splitlines()]
        assert all(int(pid) != os.getpid() for _, _, pid in rows)  # every one in a worker
        return {name: int(n) for name, n, _ in rows}

    assert threads("fedavg,fedmho")["fedmho"] == cores
    assert threads("ensemble,fedavg,fedmho-md")["fedmho-md"] == cores
    assert threads("fedmho,fedmho-md") == {
        "fedmho": max(1, cores // 2),
        "fedmho-md": max(1, cores // 2),
    }
