"""Client export benchmark: what each zoo model costs to export, ship and run on a CPU.

    python bench/bench_export.py [--models cnn,mlp] [--out bench/results/export.json] [--quick]

Per model on MNIST's shape (1x28x28, 10 classes), with untrained init_model weights (latency and
size do not depend on the values): export time, artifact size fp32 and int8, onnxruntime vs torch
latency at batch 1 and 64 (both on 2 threads), and the peak RSS of an onnxruntime-only process
(examples/on_device_infer.py, the script a device would run). Writes JSON and a markdown table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

import exporters
from edgefl.client.run import export_model, model_metadata
from edgefl.models.cost import costs
from edgefl.models.zoo import ZOO, make_spec, role_of
from edgefl.training import init_model

ROOT = Path(__file__).resolve().parents[1]
ON_DEVICE = ROOT / "examples" / "on_device_infer.py"
SHAPE, CLASSES = (1, 28, 28), 10
THREADS = 2  # torch and onnxruntime alike, so the comparison is runtime against runtime
BATCHES = (1, 64)


def metadata(spec) -> dict:
    """The keys run_client stamps (placeholder training values: the weights are untrained)."""
    return model_metadata(
        spec,
        class_names=[str(i) for i in range(spec.num_classes)],
        label_counts=[1] * spec.num_classes,
        client_id=f"bench-{spec.name}",
        profile=None,
    )


def inputs(spec, batch: int, latent: int | None, rng: np.random.Generator) -> list[np.ndarray]:
    if latent is None:
        return [rng.random((batch, *spec.input_shape), dtype=np.float32)]
    labels = rng.integers(0, spec.num_classes, batch)
    z = rng.standard_normal((batch, latent)).astype(np.float32)
    return [z, np.eye(spec.num_classes, dtype=np.float32)[labels]]


def time_ms(fns: dict, runs: int, warmup: int = 2) -> dict[str, dict[str, float]]:
    """Per callable: median (what the table shows) and min of `runs` calls, in ms.

    The callables take turns within each round, so a burst of load on a shared machine slows
    all of them alike instead of whichever happened to be measured at the time.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {tag: [] for tag in fns}
    for _ in range(runs):
        for tag, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[tag].append(1000 * (time.perf_counter() - t0))
    return {
        tag: {"median": float(np.median(t)), "min": float(np.min(t))} for tag, t in times.items()
    }


def ort_session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def on_device_peak_mib(path: Path) -> float | None:
    """Peak RSS of a fresh onnxruntime-only process running the artifact once per run."""
    cmd = [sys.executable, str(ON_DEVICE), str(path), "--batch", "1", "--runs", "5"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    match = re.search(r"peak RSS: ([\d.]+) MiB", proc.stdout)
    return float(match.group(1)) if proc.returncode == 0 and match else None


def bench_model(name: str, runs: dict[int, int], tmp: Path, b64_skip: set[str]) -> dict:
    spec = make_spec(name, SHAPE, CLASSES)
    role = role_of(spec)
    model = init_model(spec, 0).eval()
    module = model if role == "classifier" else model.decoder
    latent = None if role == "classifier" else model.decoder.latent_dim
    fp32, int8 = tmp / f"{name}.onnx", tmp / f"{name}.int8.onnx"

    t0 = time.perf_counter()
    export_model(model, spec, metadata(spec), fp32)
    export_s = time.perf_counter() - t0  # includes the exporter's own ORT-vs-torch parity check
    t0 = time.perf_counter()
    quant = exporters.quantize_int8(fp32, int8)
    quant_s = time.perf_counter() - t0

    c = costs(spec)
    row = {
        "model": name,
        "role": role,
        "params": c.params,
        "macs": c.macs,
        "export_s": export_s,
        "quantize_s": quant_s,
        "fp32_bytes": fp32.stat().st_size,
        "int8_bytes": int8.stat().st_size,
        "int8_max_abs_diff": quant["max_abs_diff"],
        "latency_ms": {},
    }
    rng = np.random.default_rng(0)
    sessions = {"ort_fp32": ort_session(fp32), "ort_int8": ort_session(int8)}
    names = [i.name for i in sessions["ort_fp32"].get_inputs()]
    for batch in BATCHES:
        if batch > 1 and name in b64_skip:
            continue
        arrays = inputs(spec, batch, latent, rng)
        feed = dict(zip(names, arrays, strict=True))
        tensors = [torch.from_numpy(a) for a in arrays]
        fns = {tag: (lambda s=sess, f=feed: s.run(None, f)) for tag, sess in sessions.items()}
        fns["torch"] = lambda t=tensors: module(*t)
        with torch.no_grad():
            row["latency_ms"][str(batch)] = time_ms(fns, runs[batch])
    row["on_device_peak_rss_mib"] = {
        "fp32": on_device_peak_mib(fp32),
        "int8": on_device_peak_mib(int8),
    }
    return row


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnxruntime": ort.__version__,
        "numpy": np.__version__,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def _kib(n: int) -> str:
    return f"{n / 1024:,.1f}"


def _ms(row: dict, batch: int, tag: str) -> str:
    lat = row["latency_ms"].get(str(batch))
    return f"{lat[tag]['median']:.3f}" if lat else "-"


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        "# Client export benchmark",
        "",
        f"- command: `{report['command']}`",
        f"- date (UTC): {report['date_utc']}",
        f"- machine: {m['platform']}, {m['cpu_count']} CPUs ({m['processor']}), "
        f"Python {m['python']}, torch {m['torch']}, onnxruntime {m['onnxruntime']}; "
        f"load average at start {m['load_average_at_start']}",
        f"- input 1x28x28, 10 classes, untrained weights; {THREADS} threads for torch and "
        f"onnxruntime; median of {report['runs']['1']} (batch 1) / {report['runs']['64']} "
        "(batch 64) runs; peak RSS of examples/on_device_infer.py (batch 1, low-memory session)",
        "",
        "| model | role | params | export s | fp32 KiB | int8 KiB | ORT b1 ms | torch b1 ms "
        "| ORT int8 b1 ms | ORT b64 ms | torch b64 ms | ORT int8 b64 ms | peak RSS fp32 / int8 MiB |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in report["results"]:
        rss = r["on_device_peak_rss_mib"]
        rss_text = " / ".join("-" if v is None else f"{v:.0f}" for v in (rss["fp32"], rss["int8"]))
        lines.append(
            f"| {r['model']} | {r['role']} | {r['params']:,} | {r['export_s']:.1f} "
            f"| {_kib(r['fp32_bytes'])} | {_kib(r['int8_bytes'])} "
            f"| {_ms(r, 1, 'ort_fp32')} | {_ms(r, 1, 'torch')} | {_ms(r, 1, 'ort_int8')} "
            f"| {_ms(r, 64, 'ort_fp32')} | {_ms(r, 64, 'torch')} | {_ms(r, 64, 'ort_int8')} "
            f"| {rss_text} |"
        )
    if report["b64_skipped"]:
        lines += ["", f"Batch 64 not measured for: {', '.join(report['b64_skipped'])}."]
    lines += ["", f"Total wall time {report['total_s']:.0f} s.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma list of zoo models (default all)")
    parser.add_argument("--out", default="bench/results/export.json", help="results JSON")
    parser.add_argument("--quick", action="store_true", help="few runs: a smoke test")
    parser.add_argument("--skip-b64", default="", help="comma list of models without batch 64")
    args = parser.parse_args(argv)
    # export seconds are a trace's, not a read of a graph an earlier run kept on disk
    os.environ["EDGEFL_CACHE_DIR"] = "off"

    names = [n.strip() for n in args.models.split(",") if n.strip()] or [e.name for e in ZOO]
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; zoo: {', '.join(e.name for e in ZOO)}")
    b64_skip = {n.strip() for n in args.skip_b64.split(",") if n.strip()}
    runs = {1: 5, 64: 3} if args.quick else {1: 50, 64: 10}
    torch.set_num_threads(THREADS)

    host = machine()  # before the run: the load average then says how busy the machine was
    start = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="edgefl-bench-") as tmp:
        # Warm-up: the first export in a process pays ~3 s of exporter imports and registration.
        warm = make_spec("mlp", SHAPE, CLASSES)
        export_model(init_model(warm, 0), warm, metadata(warm), Path(tmp) / "warmup.onnx")
        for name in names:
            t0 = time.perf_counter()
            results.append(bench_model(name, runs, Path(tmp), b64_skip))
            print(f"{name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    report = {
        "command": shlex.join(["python", "bench/bench_export.py", *(argv or sys.argv[1:])]),
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": host,
        "runs": {str(k): v for k, v in runs.items()},
        "threads": THREADS,
        "input_shape": list(SHAPE),
        "num_classes": CLASSES,
        "b64_skipped": sorted(b64_skip & set(names)),
        "total_s": time.perf_counter() - start,
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    md = out.with_suffix(".md")
    md.write_text(markdown(report))
    print(markdown(report))
    print(f"wrote {out} and {md}", file=sys.stderr)


if __name__ == "__main__":
    main()
