"""FedMHO's federation on CPU (issue 15, items 2-3): FedCVAE-ENS, the FedMHO family and
edgefl's fedmho-cw fused from the same uploads, with ablations of fedmho-cw.

    python bench/bench_fedmho_cw.py --runs /tmp/cw [--partitions dirichlet:0.5,dirichlet:0.1]
                                    [--seeds 0,1,2] [--jobs 2]

Per partition and seed, one `edgefl simulate` federation (MNIST, 10 clients, 5 `smartphone`
`cnn` classifiers + 5 `wristband` `cvae-small` CVAEs, the paper prototypes, `--methods
fedcvae-ens`) is made under --runs (an existing run is reused), then every row below is fused
from its uploads with run_fuse and evaluated on the MNIST test split. Writes
bench/results/fedmho_cw.{json,md}.
"""

from __future__ import annotations

from edgefl.threads import share_cores_politely

# What the edgefl CLI does first: thread settings before numpy and torch load, and MKL's
# fork-safe allocator before this script forks (docs/development.md).
share_cores_politely()

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from edgefl.server.fuse import FuseJob, run_fuse

ROOT = Path(__file__).resolve().parents[1]
# (row label, method, options): the methods at their defaults, then fedmho-cw with one part of
# it undone at a time.
ROWS = (
    ("fedcvae-ens", "fedcvae-ens", {}),
    ("fedcvae-ens [labels=decoders]", "fedcvae-ens", {"labels": "decoders"}),
    ("fedcvae-ens [augment=none]", "fedcvae-ens", {"augment": "none"}),
    ("fedcvae-ens [augment=none, epochs=20]", "fedcvae-ens", {"augment": "none", "epochs": 20}),
    ("fedmho", "fedmho", {}),
    ("fedmho-md", "fedmho-md", {}),
    ("fedmho-sd", "fedmho-sd", {}),
    ("fedmho-cw", "fedmho-cw", {}),
    ("fedmho-cw [teacher=label-weighted]", "fedmho-cw", {"teacher": "label-weighted"}),
    ("fedmho-cw [teacher=class-weighted]", "fedmho-cw", {"teacher": "class-weighted"}),
    ("fedmho-cw [teacher=mean]", "fedmho-cw", {"teacher": "mean"}),
    ("fedmho-cw [balance=fixed: lam 0.5]", "fedmho-cw", {"balance": "fixed"}),
    ("fedmho-cw [lam=1: no KD]", "fedmho-cw", {"balance": "fixed", "lam": 1.0}),
    ("fedmho-cw [labels=decoders]", "fedmho-cw", {"labels": "decoders"}),
    ("fedmho-cw [pixels=mean]", "fedmho-cw", {"pixels": "mean"}),
    ("fedmho-cw [augment=none]", "fedmho-cw", {"augment": "none"}),
)


def simulate(run: Path, partition: str, seed: int, jobs: int) -> None:
    if (run / "results.json").exists():
        return
    cmd = [
        sys.executable,
        "-c",
        "from edgefl.cli import main; main()",
        "simulate",
        "--dataset",
        "mnist",
        "--clients",
        "10",
        "--partition",
        partition,
        "--mix",
        "smartphone:5,wristband:5",
        "--paper-models",
        "--methods",
        "fedcvae-ens",
        "--seed",
        str(seed),
        "--jobs",
        str(jobs),
        "--device",
        "cpu",
        "--out",
        str(run),
    ]
    print("$", shlex.join(cmd[3:]), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def fuse_row(uploads: Path, method: str, opts: dict, work: Path) -> float:
    rep = run_fuse(
        FuseJob(
            uploads=str(uploads),
            method=method,
            out=str(work / "g.onnx"),
            options=opts,
            device="cpu",
            eval="mnist:test",
        )
    )
    return 100 * rep["accuracy"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True, help="folder of the simulate runs (reused)")
    ap.add_argument("--partitions", default="dirichlet:0.5,dirichlet:0.1")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench/results/fedmho_cw"))
    args = ap.parse_args()
    parts, seeds = args.partitions.split(","), [int(s) for s in args.seeds.split(",")]
    started = dt.datetime.now(dt.timezone.utc)
    acc: dict[str, dict[str, list[float]]] = {label: {p: [] for p in parts} for label, *_ in ROWS}
    with tempfile.TemporaryDirectory() as tmp:
        for p in parts:
            for s in seeds:
                run = Path(args.runs) / f"{p.replace(':', '')}-s{s}"
                simulate(run, p, s, args.jobs)
                for label, method, opts in ROWS:
                    acc[label][p].append(
                        round(fuse_row(run / "uploads", method, opts, Path(tmp)), 2)
                    )
                    print(f"{p} seed {s} {label}: {acc[label][p][-1]}", flush=True)
    machine = f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}"
    command = "python bench/bench_fedmho_cw.py " + shlex.join(sys.argv[1:])
    Path(args.out + ".json").write_text(
        json.dumps(
            {
                "command": command,
                "date_utc": started.isoformat(timespec="minutes"),
                "machine": machine,
                "seeds": seeds,
                "accuracy": acc,
            },
            indent=1,
        )
        + "\n"
    )

    def cell(v: list[float]) -> str:
        sd = statistics.stdev(v) if len(v) > 1 else 0.0
        return f"{statistics.mean(v):.2f} +- {sd:.2f} ({' / '.join(f'{x:.2f}' for x in v)})"

    lines = [
        f"# FedMHO's federation on CPU: FedCVAE-ENS, the FedMHO family and fedmho-cw "
        f"({started:%Y-%m-%d %H:%M} UTC)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine}",
        "",
        "MNIST, 10 clients (5 `cnn` classifiers, 5 `cvae-small` CVAEs, the paper prototypes at "
        "simulate's defaults), one federation per partition and seed, every row fused from the "
        "same uploads. Top-1 % on the MNIST test split, mean +- std (seeds "
        f"{', '.join(map(str, seeds))}).",
        "",
        "| method | " + " | ".join(parts) + " |",
        "|---|" + "---:|" * len(parts),
    ]
    lines += [
        f"| {label} | " + " | ".join(cell(acc[label][p]) for p in parts) + " |"
        for label, *_ in ROWS
    ]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
