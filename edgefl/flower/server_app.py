"""The server side of a deployment (`flwr run` on a SuperLink): one round, then the same
validated ingest and fusion as `edgefl server fuse`. Replies land in a private quarantine folder
(mode 0700, removed afterwards), never among trusted files; only the global models, their
reports and `federation.json` (who answered, who was refused and why, who never answered) are
written to `out-dir`, each atomically.

Run config (`[tool.flwr.app.config]` in the app's pyproject.toml, or `flwr run --run-config`):
methods, out-dir, eval, device, min-nodes, wait-nodes-s, require-nodes (refuse the round when
fewer than min-nodes connected in time, rather than run it with those that did), deadline-s,
max-upload-mib,
resident-mib (as `server fuse --resident-mib`), max-epsilon (as `server fuse --max-epsilon`;
0: none), and the clients' shared settings (dataset, partition, num-clients, seed, epochs,
public-size, subset, dp, label-counts: as `client train --dp` and `--label-counts`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import exporters
from edgefl.bounds import Range
from edgefl.client.privacy import check_request
from edgefl.data.datasets import check_data_dir
from edgefl.data.public import load_public
from edgefl.errors import ConfigError, EdgeflError
from edgefl.flower import wire
from edgefl.flower.collect import Collected, collect, wait_for_nodes
from edgefl.fusion import DEFAULT_METHODS, METHODS
from edgefl.fusion.config import PublicSetConfig
from edgefl.outputs import check_writable
from edgefl.server.fuse import fuse_methods, refused_report
from edgefl.server.ingest import DEFAULT_RESIDENT_MIB, MAX_EPSILON, resident_limit
from edgefl.server.plan import check_inputs, plan, resolve_device

POSITIVE = Range(0, low_open=True)
DEFAULTS: dict[str, Any] = {
    "methods": ",".join(DEFAULT_METHODS),
    "out-dir": "global",
    "eval": "",
    "device": "auto",
    "min-nodes": 1,
    "wait-nodes-s": 60.0,
    "require-nodes": False,  # True: fewer than min-nodes in time refuses the round
    "deadline-s": 3600.0,
    "max-upload-mib": exporters.DEFAULT_MAX_UPLOAD_BYTES // (1 << 20),
    "resident-mib": DEFAULT_RESIDENT_MIB,
    "dataset": "mnist",
    "partition": "dirichlet:0.5",
    "num-clients": 0,  # 0: as many as nodes connected
    "seed": 0,
    "epochs": 0,  # 0: each profile's own
    "public-size": 0,
    "subset": 0,  # 0: the whole train split; N: every client partitions the same N samples
    "public": "",  # e.g. "mnist:public": sent to predictions nodes, read by FedOL/FedDF
    "data-dir": "",  # where the server reads datasets (eval, the public set)
    "dp": "",  # every client's --dp (EPSILON[,delta=D][,clip=C][,batch=B]); "": plain training
    "label-counts": "exact",  # every client's --label-counts: exact | absent | noised[:EPS]
    "max-epsilon": 0.0,  # as `server fuse --max-epsilon`; 0: no limit
}
# Run-config keys that become every client's settings (ClientJob fields).
CLIENT_KEYS = {
    "dataset": "dataset",
    "partition": "partition",
    "num-clients": "num_clients",
    "seed": "seed",
    "epochs": "epochs",
    "public-size": "public_size",
    "subset": "subset",
    "dp": "dp",
    "label-counts": "label_counts",
}


def settings_from(config: dict[str, Any], nodes: int) -> dict[str, Any]:
    client = {CLIENT_KEYS[k]: config[k] for k in CLIENT_KEYS}
    client["num_clients"] = client["num_clients"] or nodes
    client["epochs"] = client["epochs"] or None
    client["subset"] = client["subset"] or None
    client["dp"] = client["dp"] or None
    client["partition_seed"] = client["fed_seed"] = client["seed"]
    return {"client": client}


def _enough_nodes(grid, config: dict[str, Any], log) -> list[int]:
    """The nodes the round runs with: those connected once min-nodes joined or wait-nodes-s
    passed; fewer than min-nodes is said, and refused with require-nodes (before any training)."""
    want, wait_s = int(config["min-nodes"]), float(config["wait-nodes-s"])
    required = _flag(config["require-nodes"])  # a bad value is said before the wait
    nodes = wait_for_nodes(grid, want, wait_s, log)
    if not nodes:
        raise ConfigError("no SuperNode connected", hint="start SuperNodes, or raise wait-nodes-s")
    if len(nodes) >= want:
        return nodes
    short = f"only {len(nodes)} of min-nodes={want} SuperNodes connected in {wait_s:g} s"
    if required:
        raise ConfigError(
            f"{short}; require-nodes is set, so the round does not start",
            hint="start the missing SuperNodes, raise wait-nodes-s, or set require-nodes = "
            "false to run the round with the nodes that connected",
        )
    log(f"warning: {short}: the round runs with them (require-nodes = true refuses instead)")
    return nodes


def _flag(value) -> bool:
    """A run-config boolean: TOML's true/false, or the strings --run-config may carry."""
    if isinstance(value, str):
        if value.strip().lower() not in ("true", "false", "1", "0"):
            raise ConfigError(
                f"require-nodes must be true or false, got {value!r}",
                hint="e.g. flwr run . --run-config 'require-nodes=true'",
            )
        return value.strip().lower() in ("true", "1")
    return bool(value)


def _run_number(config: dict[str, Any], key: str) -> float:
    """A number of the run config, or one message naming its key (`float('abc')` was a
    traceback after every node had trained)."""
    try:
        return float(config[key])
    except (TypeError, ValueError):
        raise ConfigError(
            f"run config {key} must be a number, got {config[key]!r}",
            hint=f"e.g. {key} = {DEFAULTS[key]}",
        ) from None


def _checked(config: dict[str, Any]) -> tuple[list[str], Path, int]:
    """Every run-config setting refused before any node trains -> (methods, out-dir, the
    largest upload in bytes)."""
    methods = [m.strip() for m in str(config["methods"]).split(",") if m.strip()]
    out_dir = Path(config["out-dir"])
    for m in methods:  # refuse a bad name or folder before any node trains
        METHODS.get(m)
    check_writable(out_dir, "out-dir", "global", folder_ok=True)
    max_bytes = int(_run_number(config, "max-upload-mib") * (1 << 20))
    resident_limit(int(_run_number(config, "resident-mib")), "run config resident-mib")
    check_request(str(config["dp"]) or None, str(config["label-counts"]))  # before any training
    max_epsilon = _run_number(config, "max-epsilon")  # refused at fusion, after every node trained
    if max_epsilon:
        MAX_EPSILON.check(
            "run config max-epsilon", max_epsilon, hint="e.g. max-epsilon = 8 (0: no limit)"
        )
    for key in ("deadline-s", "max-upload-mib"):
        POSITIVE.check(f"run config {key}", _run_number(config, key), hint=f"e.g. {key} = "
                       f"{DEFAULTS[key]}")  # fmt: skip
    resolve_device(str(config["device"]), "run config device")
    _check_node_settings(config)
    # The server reads data-dir for eval and the public set only; the nodes their own.
    check_data_dir(
        config["data-dir"] or None,
        {"eval": config["eval"] or None, "public": config["public"] or None},
        "eval or public",
        'drop data-dir from the run config, or set eval (e.g. eval = "mnist:test"); each '
        "SuperNode reads its dataset from its own --node-config data-dir",
        flag="run config data-dir",
    )
    if config["eval"]:  # a name, a split and readable files: the eval runs after the fusion
        check_inputs([], str(config["eval"]), config["data-dir"] or None, "run config eval")
    return methods, out_dir, max_bytes


def _check_node_settings(config: dict[str, Any]) -> None:
    """What every node would refuse (an unknown dataset, a bad partition, epochs -3), refused
    once here, before any node trains: each node checks it again as a device does."""
    from edgefl.client.job import ClientJob
    from edgefl.data.datasets import looks_like_path
    from edgefl.data.partition import parse_scheme
    from edgefl.data.registry import DATASETS

    client = settings_from(config, nodes=1)["client"]
    try:
        if not looks_like_path(str(client["dataset"])):  # a node's own .npz is the node's
            DATASETS.get(str(client["dataset"]))
        parse_scheme(str(client["partition"]))
        ClientJob(profile="smartphone", **client)
    except EdgeflError as exc:  # said with the run config's keys, not client train's flags
        raise ConfigError(
            f"run config: {_keys(exc.message)}", hint=_keys(exc.hint or "") or None
        ) from None


# client train's flags for the run config's keys (every node's settings)
_FLAG_KEYS = {"--partition-seed": "seed", "--fed-seed": "seed"} | {
    f"--{key}": key for key in CLIENT_KEYS
}


def _keys(text: str) -> str:
    for flag, key in _FLAG_KEYS.items():
        text = re.sub(rf"{re.escape(flag)}(?![\w-])", key, text)
    return text


def run_round(grid, run_config: dict[str, Any], log=print) -> dict[str, Any]:
    """The ServerApp's whole work; returns what it wrote to out-dir/federation.json."""
    config = DEFAULTS | {k: v for k, v in run_config.items() if k in DEFAULTS}
    methods, out_dir, max_bytes = _checked(config)
    nodes = _enough_nodes(grid, config, log)
    public = _public(config)
    got = collect(
        grid,
        nodes,
        settings_from(config, len(nodes)),
        public=public,
        deadline_s=float(config["deadline-s"]),
        max_bytes=max_bytes,
        log=log,
    )
    quarantine = Path(tempfile.mkdtemp(prefix="edgefl-quarantine-"))  # mode 0700
    try:
        names = land(got, quarantine)
        reports = _fuse(methods, quarantine, out_dir, config, log) if names else {}
    finally:
        shutil.rmtree(quarantine, ignore_errors=True)
    personalized = _second_messages(grid, methods, reports, names, config, log)
    summary = {
        "nodes": nodes,
        "min_nodes": int(config["min-nodes"]),  # fewer nodes: the round ran short of it
        "answered": {str(n): names.get(n) for n in got.replies},
        "refused": {str(n): why for n, why in got.refused.items()},
        "missing": got.missing,
        "personalized": personalized,
        "collect_seconds": got.seconds,
        "methods": {
            m: {k: r.get(k) for k in ("accuracy", "global_model", "used", "rejected", "error")}
            for m, r in reports.items()
        },
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    exporters.atomic_write_text(out_dir / "federation.json", json.dumps(summary, indent=2))
    return summary


def serve(grid, run_config: dict[str, Any], log=print) -> dict[str, Any]:
    """`run_round`, and when it stops on a user error (a bad method name, an unwritable folder,
    no node), that error and its fix in out-dir/federation.json as well as in the log: `flwr run`
    exits 0 whatever the ServerApp did, and the SuperLink's log is not the operator's screen.
    The error is raised again, so that Flower marks the run failed."""
    try:
        return run_round(grid, run_config, log)
    except EdgeflError as exc:
        log(f"edgefl: error: {exc.message}" + (f" ({exc.hint})" if exc.hint else ""))
        out = Path(str(run_config.get("out-dir", DEFAULTS["out-dir"])))
        failed = {
            "error": exc.message,
            "hint": exc.hint,
            "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        }
        try:
            out.mkdir(parents=True, exist_ok=True)
            exporters.atomic_write_text(out / "federation.json", json.dumps(failed, indent=2))
        except OSError:
            pass  # out-dir itself is what failed: the log line is all there can be
        raise


def land(got: Collected, folder: Path) -> dict[int, str]:
    """Write each checked upload into the quarantine as <client id>.onnx (a node's chosen id
    only if it is a plain, unused file name) -> node id -> file name."""
    names: dict[int, str] = {}
    for node, rep in sorted(got.replies.items()):
        if rep.skipped or "upload" not in rep.files:
            continue
        name = wire.safe_client_id(rep.summary.get("client_id"), f"node-{node}")
        if f"{name}.onnx" in names.values():
            name = f"node-{node}"
        fd = os.open(folder / f"{name}.onnx", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(rep.files["upload"])
        names[node] = f"{name}.onnx"
    return names


def _public(config) -> np.ndarray | None:
    if not config["public"]:
        return None
    return load_public(
        config["public"],
        public_size=int(config["public-size"]),
        seed=int(config["seed"]),
        subset=int(config["subset"]) or None,
        data_dir=config["data-dir"] or None,
        partition=str(config["partition"]),
    )


def _options(name: str, config) -> dict[str, Any]:
    """A method that reads public data reads the set the server sent (the same carve)."""
    if not METHODS.get(name).public_data or not config["public"]:
        return {}
    return PublicSetConfig.carved(
        config["public"],
        int(config["public-size"]),
        int(config["seed"]),
        int(config["subset"]) or None,
        str(config["partition"]),
    )


def _fuse(methods, quarantine: Path, out_dir: Path, config, log) -> dict[str, dict]:
    plans = [
        plan(m, _options(m, config), out_dir / f"{m}.onnx", str(quarantine), out_flag="out-dir")
        for m in methods
    ]
    try:
        # One method at a time in this process: it holds Flower's network threads, and fork
        # after those is unsafe.
        return fuse_methods(
            plans,
            str(quarantine),
            device=config["device"],
            eval=config["eval"] or None,
            data_dir=config["data-dir"] or None,
            jobs=1,
            keep_going=True,
            log=log,
            resident_mib=int(config["resident-mib"]),
            max_epsilon=float(config["max-epsilon"]) or None,
        )
    except EdgeflError as exc:  # e.g. every upload rejected: reported, the round still recorded
        log(f"fusion refused: {exc.message}")
        return {m: refused_report(m, exc) for m in methods}


def _second_messages(grid, methods, reports, names: dict[int, str], config, log) -> dict[str, dict]:
    """A method judged per client (FedGH) sends its global output back to the nodes whose
    uploads it used; each applies it to the model it kept. -> method -> node -> outcome."""
    done: dict[str, dict] = {}
    for m in methods:
        method, rep = METHODS.get(m), reports.get(m, {})
        if method.judged != "per-client" or "error" in rep or not rep.get("used"):
            continue
        # Used client ids -> the files they landed as (a clashing id lands as node-<id>.onnx).
        used = {a["file"] for a in rep["accepted"] if a["client_id"] in rep["used"]}
        nodes = sorted(n for n, name in names.items() if name in used)
        output = Path(rep["global_model"]).read_bytes()
        log(f"{m}: sending its {method.personalize} to {len(nodes)} node(s)")
        back = collect(
            grid,
            nodes,
            {"personalize": method.personalize},
            files={"global": output},
            deadline_s=float(config["deadline-s"]),
            max_bytes=1 << 20,
            log=log,
        )
        done[m] = {
            str(n): (
                "personalized"
                if n in back.replies
                else back.refused.get(n, "no reply within the deadline")
            )
            for n in nodes
        }
    return done


def make_server_app():
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def main(grid, context) -> None:
        serve(grid, dict(context.run_config))

    return app
