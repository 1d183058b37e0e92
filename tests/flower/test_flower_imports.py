"""Flower's simulation package loads without TensorFlow (`edgefl.flower.load_simulation`), in
the driver and, through Ray's worker setup hook, in every actor: with the deploy extra
installed, TensorFlow cost each of them ~4.5 s of CPU and ~600 MB resident that the engine's
memory plan does not count."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys

import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")

from edgefl.flower import load_simulation  # noqa: E402
from edgefl.flower.engine import _ray_init_args  # noqa: E402
from edgefl.flower.resources import Group  # noqa: E402

PROBE = """
import importlib.util, json, sys
from edgefl.flower import load_simulation
load_simulation()
from flwr.simulation.ray_transport import utils
print(json.dumps({
    "simulation": "flwr.simulation" in sys.modules,
    "tensorflow_loaded": "tensorflow" in sys.modules,
    "flower_sees_tensorflow": utils.TF is not None,
    "tensorflow_findable": importlib.util.find_spec("tensorflow") is not None,
}))
"""


def test_flowers_simulation_loads_without_tensorflow_which_stays_importable():
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    installed = importlib.util.find_spec("tensorflow") is not None
    assert seen == {
        "simulation": True,
        "tensorflow_loaded": False,
        "flower_sees_tensorflow": False,
        "tensorflow_findable": installed,  # hidden only while Flower loaded, not removed
    }


def test_each_ray_actor_runs_the_same_loader_before_it_loads_flower():
    args = _ray_init_args(Group(clients=(0, 1, 2), num_cpus=1, num_gpus=0.0, at_once=2))
    module, _, name = args["runtime_env"]["worker_process_setup_hook"].rpartition(".")
    assert getattr(importlib.import_module(module), name) is load_simulation
    assert args["num_cpus"] == 2  # at_once clients' worth of cores bounds Flower's pool
