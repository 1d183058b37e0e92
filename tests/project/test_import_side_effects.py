"""Importing edgefl changes nothing in the process (environment, files read, sleeps): a library
someone imports into a notebook must not. The CLI sets its thread settings explicitly at start
(edgefl.threads.share_cores_politely), and installed fusion methods are looked up when a method
is first looked up by name, not when edgefl.fusion is imported."""

import os
import subprocess
import sys

import pytest

# Records every file opened and every entry-point scan while the library is imported.
_PROBE = """
import os, sys
opened = []
sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == "open" else None)
import importlib.metadata as md
scans = []
_entry_points = md.entry_points
md.entry_points = lambda **kw: scans.append(kw) or _entry_points(**kw)
before = dict(os.environ)
import edgefl, edgefl.fusion, edgefl.data, edgefl.models.zoo, edgefl.models.spec
after = dict(os.environ)
print("env", sorted(set(after.items()) ^ set(before.items())))
print("loadavg", [p for p in opened if p == "/proc/loadavg"])
print("scans", [kw for kw in scans if kw.get("group") == "edgefl.methods"])  # torch scans its own
"""


def _probe() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "MKL_"))}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return dict(line.split(" ", 1) for line in out.stdout.splitlines())


def test_importing_the_library_changes_nothing_in_the_process():
    seen = _probe()
    assert seen["env"] == "[]"  # no OMP_NUM_THREADS, OMP_WAIT_POLICY, MKL_DISABLE_FAST_MM
    assert seen["loadavg"] == "[]"  # /proc/loadavg is read by the CLI, not on import
    assert seen["scans"] == "[]"  # installed plugins are found at the first lookup


# What a process that runs edgefl's work has set before torch loads (edgefl.threads).
_STARTED = """
import os, sys
import {module}
print("torch" in sys.modules, os.environ.get("OMP_WAIT_POLICY"), os.environ.get("MKL_DISABLE_FAST_MM"))
"""


@pytest.mark.parametrize("module", ["edgefl.cli", "edgefl.flower.apps"])
def test_the_command_and_the_flower_app_set_thread_settings_at_start(module):
    """The console script `edgefl` imports edgefl.cli before it calls main(); Flower loads
    edgefl.flower.apps in the processes it starts for the app. Neither has torch loaded yet."""
    if module == "edgefl.flower.apps":
        pytest.importorskip("flwr")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "MKL_"))}
    out = subprocess.run(
        [sys.executable, "-c", _STARTED.format(module=module)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    torch_loaded, policy, fast_mm = out.stdout.split()
    assert (policy, fast_mm) == ("PASSIVE", "1")
    if module == "edgefl.cli":
        assert torch_loaded == "False"  # the settings precede torch whatever the command
