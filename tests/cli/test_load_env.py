"""edgefl's thread pools wait without spinning (fast on cores shared with other processes)."""

import os
import subprocess
import sys

import pytest

from exporters.read import SPINNING_KEYS, session_options

# libgomp prints its effective settings at load time; GOMP_SPINCOUNT is what the policy decides.
# The settings the `edgefl` command makes at start (edgefl.threads), then torch.
_PROBE = (
    "from edgefl.threads import share_cores_politely; share_cores_politely(); "
    "import torch; torch.ones(64, 64).sum()"
)


def _gomp_settings(**env: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env=clean | {"OMP_DISPLAY_ENV": "VERBOSE"} | env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    settings = {}
    for line in out.stderr.splitlines():
        key, sep, value = line.strip().partition(" = ")
        if sep:
            settings[key] = value.strip("'")
    return settings


def test_torch_openmp_waits_passively_by_default():
    settings = _gomp_settings()
    assert settings["OMP_WAIT_POLICY"] == "PASSIVE"
    assert settings["GOMP_SPINCOUNT"] == "0"  # unset, libgomp spins 300000 times per wait


def test_user_wait_policy_wins():
    settings = _gomp_settings(OMP_WAIT_POLICY="ACTIVE")
    assert settings["OMP_WAIT_POLICY"] == "ACTIVE"
    assert settings["GOMP_SPINCOUNT"] != "0"


@pytest.mark.parametrize("key", SPINNING_KEYS)
def test_onnxruntime_sessions_do_not_spin(key, monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert session_options().get_session_config_entry(key) == "0"
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert session_options().get_session_config_entry(key) == "0"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's explicit choice, for both pools
    assert session_options().get_session_config_entry(key) == "1"


# The command's start-up settings with /proc/loadavg reporting RUNNING runnable tasks; print the
# thread cap they set.
_CAP_PROBE = """
import builtins, io, os, sys
real_open = builtins.open
def fake_open(path, *args, **kwargs):
    if path == "/proc/loadavg":
        return io.StringIO("2.00 2.00 2.00 %s/200 12345")
    return real_open(path, *args, **kwargs)
builtins.open = fake_open
from edgefl.threads import share_cores_politely
share_cores_politely()
print(os.environ.get("OMP_NUM_THREADS"))
"""


def _thread_cap(running: int, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    code = _CAP_PROBE % running
    out = subprocess.run(
        [sys.executable, "-c", code], env=clean | env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing to cap")
def test_threads_capped_to_free_cores():
    assert _thread_cap(1) == "None"  # only edgefl runs: torch's default, every usable core
    assert _thread_cap(1 + 2 * os.cpu_count()) == "1"  # every core taken by others
    assert _thread_cap(1 + 2 * os.cpu_count(), OMP_NUM_THREADS="3") == "3"  # the user's wins
