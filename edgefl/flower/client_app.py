"""The device side: one `train` message in, one reply out. The node trains and exports exactly as
`edgefl client train` does (`run_client`), in a private temporary folder, and replies with the
artifact's bytes. What it trains comes from the server's settings and, in a deployment, from its
own `--node-config` (its profile, its data, its index), which the server never sees.
"""

from __future__ import annotations

import tempfile
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgefl.client.job import ClientJob, SimSettings
from edgefl.client.run import run_client
from edgefl.errors import ConfigError
from edgefl.training import one_thread

# --node-config keys a SuperNode may set, and the ClientJob field each one fills.
NODE_KEYS = {
    "profile": "profile",
    "partition-id": "client_index",
    "num-partitions": "num_clients",
    "data-dir": "data_dir",
    "dataset": "dataset",
    "model": "model",
    "client-id": "client_id",
    "epochs": "epochs",
    "kind": "kind",  # model (default) | predictions (labels the server's public set)
    # | prototypes (FedGH); then the device keeps its own model here for the header to come
    "keep-model": "keep_model",
}
_JOB_FIELDS = {f.name for f in fields(ClientJob)}
_SIM_FIELDS = {f.name for f in fields(SimSettings)}


def node_job(settings: dict[str, Any], node_config: dict[str, Any]) -> ClientJob:
    """This node's job. Simulation: the server sends each node the very ClientJob the local
    engine would run. Deployment: the server's shared settings, completed by the node's own
    config."""
    if "job" in settings:  # simulation
        if "profile" in node_config:  # a deployed node (it names its device): no server's job
            raise ConfigError(
                "the server sent a simulation's whole job to a deployed SuperNode (its "
                "--node-config names a profile); a device trains on the run's settings only",
                hint="run simulations with `edgefl simulate --engine flower`; a deployed run's "
                "ServerApp sends its settings, never a job",
            )
        return _job(settings["job"], "the server's job", simulated=True)
    job = dict(settings.get("client", {}))
    for key, value in node_config.items():
        if key in NODE_KEYS:
            job[NODE_KEYS[key]] = value
    if "profile" not in job:
        raise ConfigError(
            "this SuperNode has no device profile",
            hint='start it with --node-config "profile=\\"wristband\\" '
            'partition-id=0 num-partitions=3"',
        )
    return _job(job, "the run's settings and --node-config", simulated=False)


def _job(values: dict[str, Any], where: str, simulated: bool) -> ClientJob:
    # A deployed node is a device: no server may set its attack, GPU or label-noise seed (a
    # seed the server knows would let it subtract the noise from the released counts).
    unknown = sorted(set(values) - (_JOB_FIELDS if simulated else _JOB_FIELDS - {"sim"}))
    if unknown:
        raise ConfigError(
            f"{where} name unknown client settings: {', '.join(unknown)}",
            hint="use the settings flower_app/pyproject.toml lists (docs/flower.md)",
        )
    if simulated:  # the engine's job, as asdict wrote it
        sim = values.get("sim", {})
        bad = sorted(set(sim) - _SIM_FIELDS) if isinstance(sim, dict) else ["sim"]
        if bad:
            raise ConfigError(
                f"{where} names unknown simulation settings: {', '.join(bad)}",
                hint="use the settings flower_app/pyproject.toml lists (docs/flower.md)",
            )
        values = values | {"sim": SimSettings(**sim)}
    return ClientJob(**values)


def train_node(job: ClientJob, send_kept: bool = True) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Train, export into a private folder, return (files by role, summary). Single-threaded
    as a device (and as the local engine's workers), so the weights match bit for bit. A kept
    model is sent along in a simulation (`send_kept`); a real device keeps it where it said."""
    with one_thread(), tempfile.TemporaryDirectory(prefix="edgefl-node-") as tmp:
        kept = job.keep_model
        if kept and send_kept:
            kept = str(Path(tmp) / "model")
        result = run_client(replace(job, out_dir=str(Path(tmp) / "upload"), keep_model=kept))
        files = {"upload": result.path.read_bytes()}
        if kept and send_kept:
            files["model"] = (Path(kept) / result.path.name).read_bytes()
        summary = result.as_dict() | {"client_index": job.client_index}
    return files, summary


def handle(msg, context):
    """The ClientApp's `train` handler."""
    from flwr.app import Message

    from edgefl.flower import wire

    settings, public = wire.read_request(msg.content)
    node = dict(context.node_config)
    if "personalize" in settings:  # the second message: a per-client method's global output
        summary = personalize_node(settings, node, wire.request_file(msg.content, "global"))
        return Message(wire.reply({}, summary), reply_to=msg)
    job = node_job(settings, node)
    return Message(wire.reply(*answer(job, public, simulated="job" in settings)), reply_to=msg)


def answer(job: ClientJob, public, simulated: bool) -> tuple[dict[str, bytes], dict[str, Any]]:
    """(files, summary) of this node's upload. A predictions node labels the public set the
    server sent. A kept model travels only in a simulation (which files it where the local
    engine does); a device keeps it: its weights never leave it."""
    if job.kind == "predictions" and public is not None:
        with tempfile.TemporaryDirectory(prefix="edgefl-public-") as tmp:
            path = Path(tmp) / "public.npz"  # the server's set, as a user's public .npz
            np.savez(path, x=public)
            return train_node(replace(job, public=str(path)), send_kept=simulated)
    return train_node(job, send_kept=simulated)


def personalize_node(
    settings: dict[str, Any], node_config: dict[str, Any], output: bytes
) -> dict[str, Any]:
    """Apply the server's output (FedGH: its global header) to the model this device kept when
    it uploaded, and keep the personalized model beside it."""
    from edgefl.client.weightless import personalize

    keep = node_config.get("keep-model")
    client_id = node_config.get("client-id") or f"client-{node_config.get('partition-id', 0):03d}"
    if not keep:
        raise ConfigError(
            "this SuperNode kept no model to personalize",
            hint="start it with --node-config '... keep-model=\"/data/model\"'",
        )
    mine = Path(keep) / f"{client_id}.onnx"
    out = Path(keep) / f"{client_id}.personalized.onnx"
    with tempfile.TemporaryDirectory(prefix="edgefl-global-") as tmp:
        received = Path(tmp) / "global.onnx"
        received.write_bytes(output)
        info = personalize(str(settings["personalize"]), str(mine), str(received), str(out))
    return {"acknowledged": True, "personalized": str(out), "size_bytes": info.get("size_bytes")}


def make_client_app():
    from flwr.clientapp import ClientApp

    app = ClientApp()
    app.train()(handle)
    return app
