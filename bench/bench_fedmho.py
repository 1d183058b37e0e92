"""FedMHO's MNIST table (paper Table 3) reproduced with `edgefl simulate`.

For each partition x seed x setting (paper prototypes / budget-true models) it runs a 10-client
federation (5 smartphones, 5 wristbands) through the real client and server code paths, then
writes bench/results/fedmho.{json,md}: mean +- std per method beside the paper, and wall time
per stage. Runs are resumable (each lands in runs/bench-fedmho/<setting>-<partition>-s<seed>).

    python bench/bench_fedmho.py --partitions dirichlet:0.5,dirichlet:0.3,dirichlet:0.1 \\
        --seeds 0,1,2 --settings paper,budget --jobs 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import onnxruntime
import torch

from edgefl.cli.server_cmd import _parse_opts
from edgefl.fusion import paper_reference
from edgefl.server.fuse import FuseJob, run_fuse
from edgefl.simulate.run import SimJob, simulate

METHODS = ("fedavg", "ensemble", "fedcvae-ens", "fedmho", "fedmho-md", "fedmho-sd")
FEDMHOS = ("fedmho", "fedmho-md", "fedmho-sd")


def job_for(setting: str, partition: str, seed: int, args) -> SimJob:
    fuse = {m: fedmho_options(args.fuse) for m in FEDMHOS}
    fuse["fedcvae-ens"] = {"epochs": args.cvae_fuse_epochs, "synthetic": 6000}
    return SimJob(
        dataset="mnist", clients=10, partition=partition, mix="smartphone:5,wristband:5",
        methods=METHODS, seed=seed, jobs=args.jobs, device=args.device,
        train_device=args.train_device,
        out=f"{args.runs}/{setting}-{partition.replace(':', '')}-s{seed}",
        paper_models=setting == "paper", paper_classifier=args.paper_classifier,
        max_classifier_macs=args.max_classifier_macs,
        classifier_epochs=args.classifier_epochs, generator_epochs=args.generator_epochs,
        classifier_lr=args.classifier_lr, generator_lr=args.generator_lr, fuse_options=fuse,
    )  # fmt: skip


def fedmho_options(text: str) -> dict:
    """'lr=1e-4,epochs=20' -> FedMHO config overrides (empty: the paper's defaults)."""
    return {"synthetic": 6000} | _parse_opts([kv for kv in text.split(",") if kv])


def alt_fuse(run_dir: str, seed: int, text: str) -> list[dict]:
    """Re-fuse the same uploads with another FedMHO configuration (sensitivity rows)."""
    rows = []
    for m in FEDMHOS:
        rep = run_fuse(FuseJob(
            uploads=f"{run_dir}/uploads", method=m, out=f"{run_dir}/global-alt/{m}.onnx",
            options=fedmho_options(text) | {"seed": seed}, eval="mnist:test", device="auto",
        ))  # fmt: skip
        rows.append({"method": f"{m} [{text}]", "accuracy": rep["accuracy"],
                     "fuse_seconds": rep["total_seconds"]})  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", default="dirichlet:0.5,dirichlet:0.3,dirichlet:0.1")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--settings", default="paper,budget")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--device", default="auto", help="fusion device")
    ap.add_argument("--train-device", default="cpu", help="client training: cpu | cuda | auto")
    ap.add_argument("--paper-classifier", default="cnn")
    ap.add_argument("--max-classifier-macs", type=int, default=2_000_000)
    ap.add_argument("--classifier-epochs", type=int, default=10)
    ap.add_argument("--generator-epochs", type=int, default=30)  # FedMHO: 30 on MNIST
    ap.add_argument("--classifier-lr", type=float, default=None, help="default: the client's")
    ap.add_argument("--generator-lr", type=float, default=None, help="default: the client's")
    ap.add_argument("--fuse", default="", help="FedMHO options, e.g. lr=1e-4,epochs=20 "
                    "(default: the paper's, FedMHOConfig)")  # fmt: skip
    ap.add_argument(
        "--alt-fuse",
        default="lr=1e-4,epochs=20",
        help="a second FedMHO configuration fused on the same uploads ('' = none)",
    )
    ap.add_argument("--cvae-fuse-epochs", type=int, default=20)
    ap.add_argument("--runs", default="runs/bench-fedmho")
    ap.add_argument("--out", default="bench/results/fedmho")
    args = ap.parse_args()

    rows = []
    for partition in args.partitions.split(","):
        for setting in args.settings.split(","):
            for seed in map(int, args.seeds.split(",")):
                t = time.perf_counter()
                job = job_for(setting, partition, seed, args)
                res = simulate(job, log=print)
                if args.alt_fuse:
                    res["results"] += alt_fuse(job.out, seed, args.alt_fuse)
                print(f"{setting} {partition} seed {seed}: {time.perf_counter() - t:.0f} s")
                rows.append({"setting": setting, "partition": partition, "seed": seed,
                             "results": res["results"], "seconds": res["seconds"],
                             "clients": [{k: c[k] for k in ("client_id", "profile", "role",
                                                            "model", "upload_bytes")}
                                         | {"train_seconds": c["training"].get("seconds"),
                                            "reused": c.get("reused", False)}
                                         for c in res["clients"]]})  # fmt: skip
                write(args, rows)  # after every run: an interrupted benchmark keeps its rows


def write(args, rows: list[dict]) -> None:
    meta = {
        "command": "python " + " ".join(sys.argv),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.system()}",
        "torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
        "args": vars(args),
    }  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": rows}, indent=2))
    out.with_suffix(".md").write_text(markdown(meta, rows))


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# FedMHO MNIST benchmark ({meta['date_utc']} UTC)", "",
             f"Command: `{meta['command']}`  ", f"Machine: {meta['machine']}, torch "
             f"{meta['torch']}, onnxruntime {meta['onnxruntime']}", ""]  # fmt: skip
    for setting in dict.fromkeys(r["setting"] for r in rows):
        a = meta["args"]
        lines += [f"## Setting: {setting}", "",
                  f"Local epochs: classifiers {a['classifier_epochs']}, CVAEs "
                  f"{a['generator_epochs']}. FedMHO global training: "
                  f"{a['fuse'] or 'the paper defaults (Adam lr 1e-5, 10 epochs)'}; rows "
                  "marked [...] re-fuse the same uploads with that configuration.", ""]  # fmt: skip
        parts = list(dict.fromkeys(r["partition"] for r in rows if r["setting"] == setting))
        lines.append("| method | " + " | ".join(f"{p} edgefl | {p} paper" for p in parts) + " |")
        lines.append("|---|" + "---:|---:|" * len(parts))
        names = list(dict.fromkeys(x["method"] for r in rows if r["setting"] == setting
                                   for x in r["results"]))  # fmt: skip
        for m in names:
            cells = []
            for p in parts:
                accs = [100 * x["accuracy"] for r in rows if r["setting"] == setting
                        and r["partition"] == p for x in r["results"]
                        if x["method"] == m and x["accuracy"] is not None]  # fmt: skip
                paper = paper_reference("mnist", p, 10).get(m)
                if accs:
                    sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
                    cells.append(f"{statistics.mean(accs):.2f} +- {sd:.2f} (n={len(accs)})")
                else:
                    cells.append("-")
                cells.append("-" if paper is None else f"{paper:.2f}")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += ["Wall time per run: the whole simulate (training, all six fusions and "
                  "evaluation; the [...] rows not included); client training in s (sum over "
                  "the 10 clients, each single-threaded, 2 at a time; from each upload's "
                  "metadata); fusion s per method", ""]  # fmt: skip
        for r in rows:
            if r["setting"] != setting:
                continue
            fuse = ", ".join(f"{x['method']} {x['fuse_seconds']:.0f}" for x in r["results"])
            train = sum(c.get("train_seconds") or 0 for c in r["clients"])
            reused = " (uploads from an earlier run)" if all(
                c.get("reused") for c in r["clients"]) else ""  # fmt: skip
            lines.append(f"- {r['partition']} seed {r['seed']}: whole simulate "
                         f"{r['seconds']['total']:.0f} s wall; clients {train:.0f}{reused}; "
                         f"{fuse}")  # fmt: skip
        models = sorted({f"{c['profile']}: {c['model']}" for r in rows if r["setting"] == setting
                         for c in r["clients"]})  # fmt: skip
        lines += ["", "Client models: " + "; ".join(models), ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
