"""Does evaluating teachers of one architecture together (their weights stacked, one vmapped
call) beat one forward per teacher on the CPU? Issue 36 asks for the teacher passes of FedMHO-MD,
the ensemble and the data-free methods to be batched; this measures it before building it.

For each architecture: N freshly initialised MNIST classifiers (the weights' values do not
change the arithmetic's cost), their mean logits over S random images, once as a loop of
forwards (what edgefl does) and once through torch.func.stack_module_state + vmap in chunks
of 500 images; at 1 and 2 torch threads. Writes OUT.json and OUT.md.

    python bench/bench_stacked_teachers.py --out bench/results/stacked_teachers   # ~2 min
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from torch.func import functional_call, stack_module_state

from edgefl.models.parse import parse_model_arg
from edgefl.models.zoo import build_model


def loop(models, x):
    return torch.stack([m(x) for m in models]).mean(0)


def stacked(models, x, chunk=500):
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")

    def one(p, b, xb):
        return functional_call(base, (p, b), (xb,))

    outs = [torch.vmap(one, in_dims=(0, 0, None))(params, buffers, xb) for xb in x.split(chunk)]
    return torch.cat(outs, 1).mean(0)


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default="cnn,scnn")
    ap.add_argument("--teachers", type=int, default=50)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    x = torch.rand(args.samples, 1, 28, 28)
    rows = []
    for arch in args.archs.split(","):
        spec = parse_model_arg(arch, (1, 28, 28), 10)
        models = [build_model(spec).eval() for _ in range(args.teachers)]
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            with torch.no_grad():
                diff = float((loop(models, x) - stacked(models, x)).abs().max())
                a = best_of(lambda models=models: loop(models, x), args.repeats)
                b = best_of(lambda models=models: stacked(models, x), args.repeats)
            rows.append(
                {
                    "arch": arch,
                    "threads": threads,
                    "loop_s": round(a, 3),
                    "stacked_s": round(b, 3),
                    "stacked_over_loop": round(b / a, 3),
                    "max_abs_diff": diff,
                }
            )
            print(rows[-1], flush=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    meta = {
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "torch": torch.__version__,
        "commit": commit,
        "command": "python bench/bench_stacked_teachers.py "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
        "teachers": args.teachers,
        "samples": args.samples,
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = [
        "# Teachers stacked and vmapped against one forward each (bench/bench_stacked_teachers.py)",
        "",
        f"{meta['date_utc']} UTC, {meta['machine']}, torch {meta['torch']}, commit "
        f"{meta['commit']}; `{meta['command']}`. {args.teachers} teachers, mean logits over "
        f"{args.samples} random 28x28 images, best of {args.repeats}.",
        "",
        "| arch | threads | loop s | stacked s | stacked / loop | max abs diff |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['arch']} | {r['threads']} | {r['loop_s']} | {r['stacked_s']} | "
        f"{r['stacked_over_loop']} | {r['max_abs_diff']:.1e} |"
        for r in rows
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
