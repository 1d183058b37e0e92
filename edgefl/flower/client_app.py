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
import torch

from edgefl.client.run import ClientJob, run_client
from edgefl.errors import ConfigError

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
}
_JOB_FIELDS = {f.name for f in fields(ClientJob)}


def node_job(settings: dict[str, Any], node_config: dict[str, Any]) -> ClientJob | None:
    """This node's job, or None when a resumed simulation already holds its upload.
    Simulation: the server's table of jobs, this node's by its partition id. Deployment: the
    server's shared settings, completed by the node's own config."""
    pid = node_config.get("partition-id")
    if "jobs" in settings:  # simulation: the same ClientJob the local engine would run
        if not isinstance(pid, int) or not 0 <= pid < len(settings["jobs"]):
            raise ConfigError(f"node has partition-id {pid!r}, outside the run's clients")
        if pid in settings.get("done", []):
            return None
        return _job(settings["jobs"][pid], "the server's job table")
    job = dict(settings.get("client", {}))
    for key, value in node_config.items():
        if key in NODE_KEYS:
            job[NODE_KEYS[key]] = value
    if "profile" not in job:
        raise ConfigError("this SuperNode has no device profile",
                          hint='start it with --node-config "profile=\\"wristband\\" '
                               'partition-id=0 num-partitions=3"')  # fmt: skip
    return _job(job, "the run's settings and --node-config")


def _job(values: dict[str, Any], where: str) -> ClientJob:
    unknown = sorted(set(values) - _JOB_FIELDS)
    if unknown:
        raise ConfigError(f"{where} name unknown client settings: {', '.join(unknown)}")
    return ClientJob(**values)


def train_node(job: ClientJob) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Train, export into a private folder, return (files by role, summary). Single-threaded
    as a device (and as the local engine's workers), so the weights match bit for bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory(prefix="edgefl-node-") as tmp:
            kept = str(Path(tmp) / "model") if job.keep_model else None
            result = run_client(replace(job, out_dir=str(Path(tmp) / "upload"), keep_model=kept))
            files = {"upload": result.path.read_bytes()}
            if kept:
                files["model"] = (Path(kept) / result.path.name).read_bytes()
            summary = result.as_dict() | {"client_index": job.client_index}
    finally:
        torch.set_num_threads(threads)
    return files, summary


def handle(msg, context):
    """The ClientApp's `train` handler."""
    from flwr.app import Message

    from edgefl.flower import wire

    settings, public = wire.read_request(msg.content)
    job = node_job(settings, dict(context.node_config))
    if job is None:
        return Message(wire.reply({}, {}, skipped=True), reply_to=msg)
    if job.kind == "predictions" and public is not None:
        with tempfile.TemporaryDirectory(prefix="edgefl-public-") as tmp:
            path = Path(tmp) / "public.npz"  # the server's set, as a user's public .npz
            np.savez(path, x=public)
            files, summary = train_node(replace(job, public=str(path)))
    else:
        files, summary = train_node(job)
    return Message(wire.reply(files, summary), reply_to=msg)


def make_client_app():
    from flwr.clientapp import ClientApp

    app = ClientApp()
    app.train()(handle)
    return app
