"""FedMHO's MNIST table (paper Table 3), recorded for bench/: a thin wrapper over
`edgefl reproduce fedmho-table3` (edgefl/reproduce/), which runs every cell, resumes, and writes
table.{json,md,png} beside the cells in --runs. This script adds only the record: with
--record STEM it copies the table to STEM.{json,md,png} with the command, date and machine.

    python bench/bench_fedmho.py --budget cpu --jobs 2 --record bench/results/fedmho_table3_cpu
    python bench/bench_fedmho.py --budget paper --train-device cuda --device cuda \\
        --runs runs/bench-fedmho-paper --record bench/results/fedmho_table3_paper
    python bench/bench_fedmho.py --budget code --train-device cuda --device cuda \\
        --runs runs/bench-fedmho-code --record bench/results/fedmho_table3_code
    python bench/bench_fedmho.py --federation fedmho ...   # every method on the FedMHO federation

The recorded bench/results/fedmho*.{json,md} were made by this script's earlier version (the
FedMHO federation only, `--settings paper,budget`, `--alt-fuse` re-fusions): its commands in
bench/README.md run with `git show dc1c93f:bench/bench_fedmho.py`. What it did now lives in
edgefl: the FedMHO-federation comparison is `--federation fedmho`, the budget-true models are
`edgefl simulate` without --paper-models, and a re-fusion with other options is
`edgefl server fuse RUN/uploads --method fedmho,fedmho-md,fedmho-sd --lr 1e-4 --epochs 20`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import onnxruntime
import torch

from edgefl.errors import EdgeflError
from edgefl.reproduce.run import ReproduceJob, output_stem, reproduce


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="cpu", help="cpu | paper | code (see `edgefl reproduce`)")
    ap.add_argument("--federation", default="own", help="own | classifiers | fedcvae | fedmho")
    ap.add_argument("--partitions", default=None, help="default: the budget's")
    ap.add_argument("--seeds", default=None, help="default: the budget's")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--device", default="auto", help="fusion device")
    ap.add_argument("--train-device", default="cpu", help="client training: cpu | cuda | auto")
    ap.add_argument("--runs", default="runs/bench-fedmho-table3", help="reproduce --out")
    ap.add_argument("--record", default=None, help="STEM: copy the table to STEM.{json,md,png}")
    args = ap.parse_args()
    if args.record and any(Path(args.record).with_suffix(s).exists() for s in (".json", ".md")):
        sys.exit(
            f"{args.record}.json/.md exists: recorded results are never overwritten; "
            "name a new --record"
        )

    job = ReproduceJob(
        table="fedmho-table3",
        budget=args.budget,
        out=args.runs,
        federation=args.federation,
        seeds=tuple(int(s) for s in args.seeds.split(",")) if args.seeds else None,
        partitions=tuple(args.partitions.split(",")) if args.partitions else None,
        jobs=args.jobs,
        device=args.device,
        train_device=args.train_device,
    )
    t0 = time.perf_counter()
    try:
        reproduce(job, log=print)
    except EdgeflError as exc:
        sys.exit(f"error: {exc}")
    if args.record:
        record(job, Path(args.record), time.perf_counter() - t0)


def record(job: ReproduceJob, stem: Path, seconds: float) -> None:
    table = Path(job.out) / output_stem(job)
    meta = {
        "command": "python " + " ".join(sys.argv),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.system()}",
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "seconds": round(seconds),
    }
    stem.parent.mkdir(parents=True, exist_ok=True)
    summary = json.loads(table.with_suffix(".json").read_text())
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta} | summary, indent=2))
    head = (
        f"Command: `{meta['command']}`  \nMachine: {meta['machine']}, torch {meta['torch']}, "
        f"onnxruntime {meta['onnxruntime']}; this command took {seconds / 60:.0f} min.\n\n"
    )
    stem.with_suffix(".md").write_text(head + table.with_suffix(".md").read_text())
    shutil.copyfile(table.with_suffix(".png"), stem.with_suffix(".png"))
    print(f"recorded {stem}.json, .md and .png")


if __name__ == "__main__":
    main()
