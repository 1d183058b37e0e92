"""Methods that upload no weights or use public data, on MNIST, through the real client/server code.

Part A (global accuracy on MNIST test, upload bytes per client): 10 clients (FedMHO CNN) per
Dirichlet partition, a 5,000-sample public split carved out of the train data before
partitioning. Each client trains ONCE (`ClientJob(kind="predictions", keep_model=...)`): its
softmax outputs on the public set are the FedOL upload, the very same trained model (kept) is the
classifier upload of FedDF and of the ensemble. "local" = mean test accuracy of the 10 client
models alone.

Part B (FedGH's metric): 5 clients, client k trains fedgh-cnn{k} (500-d representation) and
uploads its class-mean representations; the server trains the header; each client splices it in.
Accuracy = mean over clients on each client's local test split (the held-out 10% of its shard,
never trained on), personalized vs the same model before the splice ("standalone").

    python bench/bench_public.py            # the reduced setting recorded in bench/results
"""

from __future__ import annotations

from edgefl.threads import share_cores_politely

# What the edgefl CLI does first: thread settings before numpy and torch load, and MKL's
# fork-safe allocator before this script forks (docs/development.md).
share_cores_politely()

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime
import torch

import exporters
from edgefl.client.privacy import spent
from edgefl.client.run import ClientJob, client_shard, run_client
from edgefl.client.weightless import apply_header
from edgefl.data import load_dataset, train_val_split
from edgefl.data.public import load_public
from edgefl.evaluate import evaluate_artifact
from edgefl.server.fuse import FuseJob, run_fuse


def part_a(partition: str, args, log) -> dict:
    root = Path(args.runs) / f"a-{partition.replace(':', '')}"
    pred, cls = root / "pred", root / "cls"
    clients, t = [], time.perf_counter()
    for i in range(10):
        if not (pred / f"client-{i:03d}.onnx").exists():  # resumable
            run_client(
                ClientJob(
                    profile="smartphone",
                    dataset="mnist",
                    partition=partition,
                    num_clients=10,
                    client_index=i,
                    public_size=5000,
                    model="cnn",
                    epochs=args.client_epochs,
                    kind="predictions",
                    public="mnist:public",
                    out_dir=str(pred),
                    keep_model=str(cls),
                ),
                on_status=log,
            )
        art = exporters.read_artifact(cls / f"client-{i:03d}.onnx")
        clients.append(
            {
                "client_id": art.client_id,
                "samples": int(sum(art.metadata["label_counts"])),
                "classes_held": int(sum(c > 0 for c in art.metadata["label_counts"])),
                "local_test_accuracy": evaluate_artifact(art, "mnist", "test").accuracy,
                "classifier_bytes": art.size_bytes,
                "predictions_bytes": (pred / f"client-{i:03d}.onnx").stat().st_size,
            }
        )
    client_seconds = time.perf_counter() - t
    # The predictions are the kept model's softmax on the public set (one training, two uploads).
    x = load_public("mnist:public", public_size=5000, seed=0)
    p = exporters.read_constant_outputs(exporters.read_artifact(pred / "client-000.onnx").model)
    logits = exporters.read_artifact(cls / "client-000.onnx").run(x)
    soft = np.exp(logits - logits.max(1, keepdims=True))
    parity = float(np.abs(soft / soft.sum(1, keepdims=True) - p["predictions"]).max())
    with tempfile.TemporaryDirectory() as tmp:  # what --fp16 would upload
        meta = {
            k: v
            for k, v in exporters.read_artifact(pred / "client-000.onnx").metadata.items()
            if k not in ("schema_version", "weights_sha256")
        }
        fp16 = exporters.write_constant_artifact(
            Path(tmp) / "h.onnx", {"predictions": p["predictions"].astype(np.float16)}, meta
        ).size_bytes

    public = {"public": "mnist:public", "public_size": 5000}
    runs = {
        "ensemble": (cls, {}),
        "feddf": (cls, public | {"student": args.student, "epochs": args.feddf_epochs}),
        "fedol": (pred, public | {"student": args.student, "epochs": args.fedol_epochs}),
    }
    results = []
    for method, (uploads, opts) in runs.items():
        t = time.perf_counter()
        rep = run_fuse(
            FuseJob(
                uploads=str(uploads),
                method=method,
                out=str(root / f"{method}.onnx"),
                options=opts,
                eval="mnist:test",
            ),
            log=log,
        )
        kind = "predictions_bytes" if method == "fedol" else "classifier_bytes"
        results.append(
            {
                "method": method,
                "accuracy": rep["accuracy"],
                "config": rep["config"],
                "upload_bytes_per_client": statistics.mean(c[kind] for c in clients),
                "fuse_seconds": time.perf_counter() - t,
            }
        )
        log(f"{partition} {method}: {100 * rep['accuracy']:.2f}%")
    return {
        "partition": partition,
        "clients": clients,
        "client_seconds": client_seconds,
        "local_mean_accuracy": statistics.mean(c["local_test_accuracy"] for c in clients),
        "predictions_vs_kept_model_max_abs_diff": parity,
        "predictions_fp16_bytes": fp16,
        "results": results,
    }


def part_b(partition: str, args, log) -> dict:
    dp = getattr(args, "fedgh_dp", None)
    root = Path(args.runs) / f"b-{partition.replace(':', '')}{f'-dp{dp}' if dp else ''}"
    up, local = root / "proto", root / "local"
    base = dict(
        profile="smartphone",
        dataset="mnist",
        partition=partition,
        num_clients=5,
        subset=args.fedgh_subset,
        epochs=args.fedgh_epochs,
    )
    # under --dp: the prototypes by the Gaussian mechanism, counts noised (edgefl.client.privacy)
    private = dict(dp=dp, label_counts="noised") if dp else {}
    t = time.perf_counter()
    for i in range(5):
        if not (up / f"client-{i:03d}.onnx").exists():
            run_client(
                ClientJob(
                    **base,
                    client_index=i,
                    model=f"fedgh-cnn{i + 1}",
                    kind="prototypes",
                    out_dir=str(up),
                    keep_model=str(local),
                    **private,
                ),
                on_status=log,
            )
    client_seconds = time.perf_counter() - t
    t = time.perf_counter()
    rep = run_fuse(FuseJob(uploads=str(up), method="fedgh", out=str(root / "header.onnx")), log=log)
    fuse_seconds = time.perf_counter() - t
    data = load_dataset("mnist", "train")
    clients = []
    for i in range(5):
        # The local test split: the 10% of the shard run_client held out (same seeds).
        job = ClientJob(**base, client_index=i)
        _, test_idx = train_val_split(client_shard(job, data), 0.1, seed=job.seed + i)
        x, y = data.x[test_idx], data.y[test_idx]
        own = exporters.read_artifact(local / f"client-{i:03d}.onnx")
        out = root / f"personalized-{i}.onnx"
        apply_header(str(own.path), str(root / "header.onnx"), str(out))
        personal = exporters.read_artifact(out)
        clients.append(
            {
                "client_id": own.client_id,
                "model": f"fedgh-cnn{i + 1}",
                "test_samples": len(y),
                "standalone": float((own.run(x).argmax(1) == y).mean()),
                "personalized": float((personal.run(x).argmax(1) == y).mean()),
                "model_bytes": own.size_bytes,
                "prototypes_bytes": (up / f"client-{i:03d}.onnx").stat().st_size,
                "epsilon": spent(
                    exporters.read_artifact(up / f"client-{i:03d}.onnx").metadata
                ).epsilon,
            }
        )
    return {
        "partition": partition,
        "clients": clients,
        "client_seconds": client_seconds,
        "fuse_seconds": fuse_seconds,
        "header_prototype_accuracy": rep["prototype_accuracy"],
        "header_config": rep["config"],
        "standalone_mean": statistics.mean(c["standalone"] for c in clients),
        "personalized_mean": statistics.mean(c["personalized"] for c in clients),
    }


def markdown(meta: dict, a_rows: list[dict], b_rows: list[dict]) -> str:
    lines = [
        f"# Public-data and weightless uploads on MNIST ({meta['date_utc']} UTC)",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}, torch "
        f"{meta['torch']} ({meta['torch_threads']} thread), onnxruntime "
        f"{meta['onnxruntime']}. Total {meta['total_seconds'] / 60:.1f} min.",
        "",
        "Reduced to fit ~20 min on a shared 2-core CPU: " + meta["reduction"],
        "",
    ]
    lines += [
        "## FedOL vs FedDF vs ensemble (10 clients, FedMHO CNN, global accuracy on MNIST test)",
        "",
        "| partition | method | accuracy % | upload bytes / client | fuse s |",
        "|---|---|---:|---:|---:|",
    ] * bool(a_rows)  # none with --parts b
    for r in a_rows:
        lines.append(
            f"| {r['partition']} | local (mean of clients alone) | "
            f"{100 * r['local_mean_accuracy']:.2f} | - | - |"
        )
        for x in r["results"]:
            lines.append(
                f"| {r['partition']} | {x['method']} | {100 * x['accuracy']:.2f} | "
                f"{x['upload_bytes_per_client']:,.0f} | {x['fuse_seconds']:.0f} |"
            )
    lines += [
        "",
        "FedOL predictions are float32 (5000 x 10); with `--fp16` the upload is "
        + ", ".join(f"{r['predictions_fp16_bytes']:,} B" for r in a_rows[:1])
        + ". Client training: "
        + ", ".join(f"{r['partition']} {r['client_seconds']:.0f} s" for r in a_rows)
        + ". Predictions vs the kept model's softmax, max |diff|: "
        + ", ".join(f"{r['predictions_vs_kept_model_max_abs_diff']:.1e}" for r in a_rows),
        "",
    ] * bool(a_rows)
    if not b_rows:
        return "\n".join(lines) + "\n"
    dp = meta["args"].get("fedgh_dp")
    lines += [
        "## FedGH vs standalone (5 clients, fedgh-cnn1..5, local test split accuracy"
        + (f", every client under --dp {dp} --label-counts noised)" if dp else ")"),
        "",
        "| partition | client | model | test n | standalone % | FedGH personalized % | "
        "model bytes | prototypes bytes |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in b_rows:
        for c in r["clients"]:
            lines.append(
                f"| {r['partition']} | {c['client_id']} | {c['model']} | "
                f"{c['test_samples']} | {100 * c['standalone']:.2f} | "
                f"{100 * c['personalized']:.2f} | {c['model_bytes']:,} | "
                f"{c['prototypes_bytes']:,} |"
            )
        lines.append(
            f"| {r['partition']} | **mean** | | | {100 * r['standalone_mean']:.2f} | "
            f"{100 * r['personalized_mean']:.2f} | | |"
        )
    lines += [
        "",
        "Header fit on the uploaded class means (accuracy): "
        + ", ".join(
            f"{r['partition']} {100 * r['header_prototype_accuracy']:.0f}%" for r in b_rows
        ),
        "",
    ]
    spent = [c.get("epsilon") for r in b_rows for c in r["clients"]]
    if any(e is not None for e in spent):
        lines += [
            "Each upload's epsilon as the server recomputes it from its record: "
            + ", ".join("not private" if e is None else f"{e:.3f}" for e in spent),
            "",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", default="dirichlet:0.5,dirichlet:0.1")
    ap.add_argument("--client-epochs", type=int, default=2)  # profile default: 10
    ap.add_argument("--student", default="scnn:width=32")  # FedOL's default; FedDF gets the same
    ap.add_argument("--fedol-epochs", type=int, default=1)  # per round, x 10 rounds (paper: 50)
    ap.add_argument("--feddf-epochs", type=int, default=10)  # = FedOL's 10 x 1 passes
    ap.add_argument("--fedgh-subset", type=int, default=30_000)
    ap.add_argument("--fedgh-epochs", type=int, default=3)
    ap.add_argument("--fedgh-dp", default=None, help="e.g. 8: FedGH's clients under --dp 8")
    ap.add_argument("--parts", default="a,b", help="a (FedOL, FedDF), b (FedGH) or both")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", default="runs/bench-public")
    ap.add_argument("--out", default="bench/results/public_mnist")
    args = ap.parse_args()
    # Small models on a shared 2-core box: one torch thread was ~10x faster than two here.
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    parts = args.partitions.split(",")
    chosen = args.parts.split(",")
    a_rows = [part_a(p, args, log) for p in parts] if "a" in chosen else []
    b_rows = [part_b(p, args, log) for p in parts] if "b" in chosen else []
    meta = {
        "command": "python " + " ".join(sys.argv),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": f"{platform.machine()} {os.cpu_count()} cores (shared), {platform.system()}",
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "onnxruntime": onnxruntime.__version__,
        "args": vars(args),
        "reduction": (
            f"clients train {args.client_epochs} epochs (profile: 10; FedOL paper: 50); FedOL "
            f"10 rounds x {args.fedol_epochs} epoch (paper: 50 per round); FedDF "
            f"{args.feddf_epochs} epochs with FedOL's student {args.student}; FedGH clients on a "
            f"{args.fedgh_subset:,}-sample subset of MNIST train, {args.fedgh_epochs} epochs; "
            "one seed (0), one-shot (FedGH's paper runs many rounds)."
        ),
        "total_seconds": time.perf_counter() - start,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "part_a": a_rows, "part_b": b_rows}
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2))
    out.with_suffix(".md").write_text(markdown(meta, a_rows, b_rows))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
