"""Methods from other packages (issue 35): a package that declares an entry point in the group
`edgefl.methods` adds a method to every process edgefl starts (a `server fuse` run here; Flower's
deployed ServerApp is such a process too), with no edit to edgefl. A broken declaration never
stops the built-in methods: asking for it is one message with the fix, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fed_fixtures import build_federation

import exporters

EDGEFL = str(Path(sys.executable).parent / "edgefl")

PLUGIN = """
from dataclasses import replace

from edgefl.fusion import fedavg

METHOD = replace(fedavg.METHOD, name="toy-entry", description="fedavg, installed as a plugin",
                 references=())
NOT_A_METHOD = 3
"""

ENTRY_POINTS = """[edgefl.methods]
toy-entry = edgefl_toy_plugin:METHOD
toy-missing = edgefl_toy_plugin:MISSING
toy-wrong = edgefl_toy_plugin:NOT_A_METHOD
toy-misnamed = edgefl_toy_plugin:METHOD
fedavg = edgefl_toy_plugin:METHOD
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    """An environment where a package `edgefl-toy-plugin` is installed (its module and its
    dist-info on the path, as pip would leave them)."""
    root = tmp_path_factory.mktemp("site")
    (root / "edgefl_toy_plugin.py").write_text(PLUGIN)
    info = root / "edgefl_toy_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: edgefl-toy-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    return os.environ | {"PYTHONPATH": path}


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    return build_federation(tmp_path_factory.mktemp("fed"))


def _run(env, *args):
    return subprocess.run([EDGEFL, *args], env=env, capture_output=True, text=True, timeout=600)


def test_an_installed_method_fuses_in_a_new_process(installed, federation, tmp_path):
    out = tmp_path / "g.onnx"
    r = _run(
        installed, "server", "fuse", str(federation), "--method", "toy-entry", "--out", str(out)
    )
    assert r.returncode == 0, r.stderr
    meta = exporters.read_artifact(out).metadata
    assert meta["method"] == "toy-entry"
    # The same files fused by the built-in it wraps give the same weights.
    ref = tmp_path / "ref.onnx"
    r = _run(installed, "server", "fuse", str(federation), "--method", "fedavg", "--out", str(ref))
    assert r.returncode == 0, r.stderr
    assert exporters.read_artifact(ref).metadata["weights_sha256"] == meta["weights_sha256"]


@pytest.mark.parametrize(
    "name, why",
    [
        ("toy-missing", "AttributeError"),
        ("toy-wrong", "edgefl_toy_plugin:NOT_A_METHOD is of type int, not an edgefl Method"),
        ("toy-misnamed", "is named 'toy-entry', not 'toy-misnamed'"),
    ],
)
def test_a_broken_plugin_is_one_message_and_exit_2(installed, federation, tmp_path, name, why):
    out = tmp_path / "g.onnx"
    r = _run(installed, "server", "fuse", str(federation), "--method", name, "--out", str(out))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    text = " ".join(r.stderr.split())
    assert f"method '{name}' comes from an installed plugin that did not load" in text
    assert why in text
    assert "reinstall or upgrade" in text
    assert not out.exists()


def test_a_plugin_never_replaces_a_built_in(installed):
    code = (
        "from edgefl.fusion import METHODS, fedavg; "
        "print(METHODS.get('fedavg') is fedavg.METHOD, 'toy-entry' in METHODS)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=installed, capture_output=True, text=True, timeout=120
    )
    assert r.stdout.split() == ["True", "True"], r.stderr
