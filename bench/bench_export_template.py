"""Exports of one architecture in one process: a fresh trace each time against the graph kept
from the first export (exporters/export.py `_TEMPLATES`), what a simulate's clients and a
server's methods pay per model.

    python bench/bench_export_template.py --out bench/results/export_template    # ~3 min, 2 CPUs

Per model: one warm-up export, then `--repeats` modules of that architecture (different seeds,
so different weights), each exported twice in turns, from the kept graph and by a fresh trace
(templates off), through `exporters.export_onnx` with the parity check; the two files must be
byte-identical. Writes OUT.json and OUT.md (median seconds per export).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _record import run_header

from edgefl.client.run import export_model, model_metadata
from edgefl.models.zoo import make_spec
from edgefl.training import init_model
from exporters import export as ex

# (model, input shape, classes, what it stands for)
CASES = (
    ("cnn", (1, 8, 8), 10, "the digits clients in the tests"),
    ("cnn", (1, 28, 28), 10, "the paper's MNIST client"),
    ("cnn1d", (3, 1, 128), 12, "a HAPT phone"),
    ("cvae-small", (1, 28, 28), 10, "a wristband's decoder, MNIST"),
    ("cvae1d", (3, 1, 128), 12, "a wristband's decoder, HAPT"),
    ("vgg9", (1, 28, 28), 10, "the phone's default VGG-9"),
)


def _export(spec, seed: int, path: Path, fresh: bool) -> float:
    model = init_model(spec, seed).eval()
    meta = model_metadata(
        spec,
        class_names=[str(i) for i in range(spec.num_classes)],
        label_counts=[1] * spec.num_classes,
        client_id=f"bench-{seed}",
        profile=None,
    )
    kept = dict(ex._TEMPLATES)
    if fresh:
        ex._TEMPLATES.clear()
    t0 = time.perf_counter()
    export_model(model, spec, meta, path)
    seconds = time.perf_counter() - t0
    if fresh:  # what the fresh trace kept is dropped: the next templated export uses the first
        ex._TEMPLATES.clear()
        ex._TEMPLATES.update(kept)
    return seconds


def bench(name, shape, classes, repeats: int, tmp: Path) -> dict:
    spec = make_spec(name, shape, classes)
    _export(spec, 0, tmp / "warm.onnx", fresh=False)  # the first export keeps the graph
    times = {"template": [], "trace": []}
    for seed in range(1, repeats + 1):
        a, b = tmp / f"t{seed}.onnx", tmp / f"f{seed}.onnx"
        times["template"].append(_export(spec, seed, a, fresh=False))
        times["trace"].append(_export(spec, seed, b, fresh=True))
        if a.read_bytes() != b.read_bytes():
            raise SystemExit(f"{name} {shape}: the templated file differs from a fresh trace's")
    return {
        "model": name,
        "input_shape": list(shape),
        "classes": classes,
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        "seconds": times,
        "bytes": b.stat().st_size,
    }


def markdown(report: dict) -> str:
    lines = [
        "# One architecture exported again in one process: kept graph vs fresh trace",
        "",
        f"- command: `{report['command']}`",
        f"- date: {report['date']}; commit {report['commit']}",
        f"- machine: {report['machine']}; torch {torch.__version__}, one torch thread",
        f"- {report['repeats']} modules per row after one warm-up export, each exported both ways "
        "in turns through `export_onnx` (parity check included); every pair of files "
        "byte-identical",
        "",
        "| model | input | stands for | file KiB | trace s | kept graph s | saved |",
        "|---|---|---|--:|--:|--:|--:|",
    ]
    for r, (_, _, _, what) in zip(report["results"], CASES, strict=True):
        m = r["median_s"]
        lines.append(
            f"| {r['model']} | {'x'.join(map(str, r['input_shape']))} | {what} "
            f"| {r['bytes'] / 1024:,.1f} | {m['trace']:.2f} | {m['template']:.2f} "
            f"| {1 - m['template'] / m['trace']:.0%} |"
        )
    return "\n".join([*lines, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/results/export_template")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    # The graph kept on disk (exporters/graph_cache.py) would turn the fresh trace into a read.
    os.environ["EDGEFL_CACHE_DIR"] = "off"
    torch.set_num_threads(1)
    report = run_header("bench/bench_export_template.py") | {"repeats": args.repeats}
    with tempfile.TemporaryDirectory() as tmp:
        report["results"] = [bench(*c[:3], args.repeats, Path(tmp)) for c in CASES]
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
