"""Large uploads over a real Flower deployment (issue 17): a SuperLink with TLS and SuperNode
authentication, N SuperNodes as processes on the loopback address, each training the paper's
VGG-9 (a 264 MiB upload) on its share of an MNIST subset, `flwr run` submitting edgefl's app.

Measures the round's wall time (from `flwr run` to federation.json), what the server received
and fused, and the peak resident memory of the SuperLink's and each SuperNode's process tree.
The deployment harness (certificates, node keys, processes) is the one tests/flower/test_flower_deploy.py
uses. Writes OUT.json and OUT.md.

    python bench/bench_flower_deploy.py --out bench/results/flower_deploy_vgg9   # ~3 min, 2 CPUs
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
from bench_flower import tree_rss


def harness():
    spec = importlib.util.spec_from_file_location(
        "deploy", ROOT / "tests/flower/test_flower_deploy.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--model", default="vgg9")
    ap.add_argument("--subset", type=int, default=600)
    ap.add_argument("--out", default=str(ROOT / "bench/results/flower_deploy_vgg9"))
    args = ap.parse_args()
    h = harness()
    d = Path(tempfile.mkdtemp(prefix="bench-deploy-"))
    procs = h.Procs(d)
    peaks: dict[str, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for name, p in list(procs.running.items()):
                peaks[name] = max(peaks.get(name, 0), tree_rss(p.pid))
            time.sleep(0.5)

    try:
        port, env = h.start_superlink(procs, d)
        names = [f"phone-{i}" for i in range(args.nodes)]
        for name in names:
            h._node_key(d / f"{name}.key")
            subprocess.run(
                [str(BIN / "flwr"), "supernode", "register", f"{d / name}.key.pub", "tls"],
                env=env,
                check=True,
                capture_output=True,
                timeout=120,
            )
        for i, name in enumerate(names):
            procs.start(
                name,
                [
                    "flower-supernode",
                    "--superlink",
                    f"127.0.0.1:{port}",
                    "--root-certificates",
                    "ca.crt",
                    "--auth-supernode-private-key",
                    f"{name}.key",
                    "--port",
                    str(h._port()),
                    "--node-config",
                    f'profile="smartphone" partition-id={i} '
                    f'num-partitions={args.nodes} client-id="{name}" model="{args.model}"',
                ],
            )
        threading.Thread(target=sample, daemon=True).start()
        out = d / "global"
        config = (
            f'methods="fedavg" out-dir="{out}" dataset="mnist" subset={args.subset} '
            f"epochs=1 min-nodes={args.nodes} wait-nodes-s=120.0 deadline-s=1200.0 "
            'eval="mnist:test"'
        )
        start = time.monotonic()
        run = subprocess.run(
            [
                str(BIN / "flwr"),
                "run",
                str(ROOT / "flower_app"),
                "tls",
                "--stream",
                "--run-config",
                config,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        wall = time.monotonic() - start
        fed = out / "federation.json"
        if not fed.exists():
            sys.exit(f"no federation.json:\n{run.stdout[-3000:]}\n{procs.log('link')[-3000:]}")
        report = json.loads(fed.read_text())
        fedavg = json.loads((out / "fedavg.json").read_text())
    finally:
        stop.set()
        procs.stop_all()
        shutil.rmtree(d, ignore_errors=True)  # two 264 MiB models and the certificates
    row = {
        "nodes": args.nodes,
        "model": args.model,
        "subset": args.subset,
        "accepted": {a["file"]: a["model"] for a in fedavg.get("accepted", [])},
        "answered": report["answered"],
        "refused": report["refused"],
        "missing": report["missing"],
        "round_wall_s": round(wall, 1),
        "collect_s": round(report["collect_seconds"], 1),
        "fedavg_accuracy": report["methods"]["fedavg"]["accuracy"],
        "global_bytes": fedavg.get("global_bytes"),
        "peak_rss_bytes": peaks,
    }
    meta = {
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "command": "python bench/bench_flower_deploy.py " + " ".join(sys.argv[1:]),
        "flwr": metadata.version("flwr"),
    }
    Path(f"{args.out}.json").write_text(json.dumps({"meta": meta, "row": row}, indent=2))
    Path(f"{args.out}.md").write_text(markdown(row, meta))
    print(markdown(row, meta))


def markdown(row: dict, meta: dict) -> str:
    gib = {k: f"{v / 2**30:.2f} GiB" for k, v in row["peak_rss_bytes"].items()}
    return (
        "# Large uploads over a real Flower deployment (bench/bench_flower_deploy.py)\n\n"
        f"{meta['date_utc']}, {meta['machine']}; `{meta['command']}`; flwr {meta['flwr']}.\n"
        f"A SuperLink with TLS (a CA made for the run) and SuperNode authentication, "
        f"{row['nodes']} registered SuperNodes on 127.0.0.1, each a smartphone training "
        f"`{row['model']}` for 1 epoch on its Dir(0.5) share of a {row['subset']}-digit "
        "MNIST subset, then fedavg, evaluated on MNIST's test split.\n\n"
        "| what | value |\n|---|---|\n"
        f"| answered | {', '.join(row['answered'].values())} |\n"
        f"| accepted by the server's ingest | "
        f"{', '.join(f'{k} ({v})' for k, v in row['accepted'].items())} |\n"
        f"| refused / missing | {len(row['refused'])} / {len(row['missing'])} |\n"
        f"| round wall time (flwr run to federation.json) | {row['round_wall_s']} s |\n"
        f"| collect (message out to last reply checked) | {row['collect_s']} s |\n"
        f"| fedavg global model | {row['global_bytes'] / 2**20:.2f} MiB, accuracy "
        f"{row['fedavg_accuracy']} |\n"
        + "".join(f"| peak RSS {k} (process tree) | {v} |\n" for k, v in gib.items())
    )


if __name__ == "__main__":
    main()
