"""The first export of a process (issue 59 item 4): each row is a fresh process that builds one
zoo model and exports it as `client train` does (`edgefl.client.export.export_model`), with the
graph cache off (a trace: torch.export's imports and the exporter), then on, first empty (the
process that keeps the graph) and then warm (later processes). Each file is compared with the
one a trace writes for the same weights.

    python bench/bench_first_export.py --out bench/results/first_export
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from _record import run_header, write_record  # bench/ is on sys.path when run as a script

CHILD = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    from pathlib import Path
    import torch
    from edgefl.client.export import export_model
    from edgefl.models.zoo import build_model, make_spec, role_of
    name, shape = sys.argv[1], tuple(json.loads(sys.argv[2]))
    torch.manual_seed(int(sys.argv[3]))
    spec = make_spec(name, shape, 10)
    model = build_model(spec)
    kind = "classifier" if role_of(spec) == "classifier" else "decoder"
    meta = {"kind": kind, "input_shape": list(shape), "num_classes": 10,
            "class_names": [str(i) for i in range(10)], "edgefl_version": "0.1.0",
            "spec": {"name": name}, "client_id": "c", "label_counts": [5] * 10,
            "profile": "p", "costs": {"params": 1},
            "training": {"epochs": 1, "final_loss": 0.5}}
    t1 = time.perf_counter()
    export_model(model, spec, meta, Path(sys.argv[4]))
    t2 = time.perf_counter()
    print(json.dumps({"export_s": t2 - t1, "process_s": t2 - t0,
                      "dynamo": "torch._dynamo" in sys.modules}))
    """
)


def child(name: str, shape, seed: int, out: Path, cache: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", CHILD, name, json.dumps(list(shape)), str(seed), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "EDGEFL_CACHE_DIR": cache, "OMP_NUM_THREADS": "1"},
        check=True,
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


MODELS = {
    "cnn": (1, 28, 28),
    "cnn1d": (9, 1, 128),
    "cvae-small": (1, 28, 28),
    "fedgh-cnn5": (1, 28, 28),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--warm", type=int, default=3, help="warm processes per model")
    ap.add_argument("--out", help="STEM: write STEM.json and STEM.md")
    args = ap.parse_args()
    header = run_header("bench/bench_first_export.py")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in args.models.split(","):
            shape = MODELS[name]
            cache = str(work / f"cache-{name}")
            traced = child(name, shape, 0, work / "t.onnx", "off")
            keeps = child(name, shape, 0, work / "k.onnx", cache)
            warm, same = [], True
            for seed in range(1, args.warm + 1):
                warm.append(child(name, shape, seed, work / "w.onnx", cache))
                child(name, shape, seed, work / "f.onnx", "off")
                same &= (work / "w.onnx").read_bytes() == (work / "f.onnx").read_bytes()
            row = {
                "model": name,
                "input": list(shape),
                "traced_export_s": round(traced["export_s"], 2),
                "traced_process_s": round(traced["process_s"], 2),
                "keeping_export_s": round(keeps["export_s"], 2),
                "warm_export_s": round(min(w["export_s"] for w in warm), 2),
                "warm_process_s": round(min(w["process_s"] for w in warm), 2),
                "warm_imports_dynamo": any(w["dynamo"] for w in warm),
                "byte_identical": same,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    lines = [
        "# The first export of a process (bench/bench_first_export.py)",
        "",
        f"`{header['command']}`, {header['date']}, {header['machine']}, commit "
        f"{header['commit']}; one torch thread; best of {args.warm} warm processes.",
        "",
        "| model | input | traced: export s / process s | first with cache (keeps it) s | "
        "warm: export s / process s | warm imports dynamo | warm file = traced file |",
        "|---|---|---|---:|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {'x'.join(map(str, r['input']))} | {r['traced_export_s']} / "
            f"{r['traced_process_s']} | {r['keeping_export_s']} | {r['warm_export_s']} / "
            f"{r['warm_process_s']} | {'yes' if r['warm_imports_dynamo'] else 'no'} | "
            f"{'yes' if r['byte_identical'] else 'NO'} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_record(args.out, header, rows, text)


if __name__ == "__main__":
    main()
