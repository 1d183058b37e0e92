"""Why FedMHO-MD/SD do (not) beat plain FedMHO on a finished simulate run.

For one run directory of bench_fedmho.py (or `edgefl simulate`) it writes a markdown report:
the label counts held by the classifier clients and by the CVAE clients; per-class test
accuracy of w0 (the classifier average), of the MD teacher (the classifiers' mean logits) and
of each FedMHO variant; and a small sweep of the global-training configuration on the same
uploads (fusion is deterministic under its seed, so each row is reproducible).

    python bench/diagnose_fedmho.py runs/bench-fedmho/paper-dirichlet0.5-s0 \\
        --out bench/results/fedmho_diagnosis_paper_dir05_s0.md
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
import sys
import time
from pathlib import Path

import numpy as np
import torch

from edgefl.data.datasets import load_dataset
from edgefl.fusion.base import FusionContext, average_classifiers
from edgefl.fusion.teachers import mean_teacher_logits
from edgefl.server.fuse import FuseJob, run_fuse
from edgefl.server.ingest import ingest

SWEEP = (  # (method, options): the paper's config first, then what bench/README discusses
    ("fedmho", {}),
    ("fedmho-md", {}),
    ("fedmho-sd", {}),
    ("fedmho", {"lr": 1e-4, "epochs": 20}),
    ("fedmho-md", {"lr": 1e-4, "epochs": 20}),
    ("fedmho-sd", {"lr": 1e-4, "epochs": 20}),
    ("fedmho", {"lr": 1e-4, "epochs": 5}),
    ("fedmho-md", {"lr": 1e-4, "epochs": 5}),
    ("fedmho-md", {"kd_reduction": "batchmean"}),
    ("fedmho-sd", {"kd_reduction": "batchmean"}),
    ("fedmho-md", {"lr": 1e-4, "epochs": 20, "kd_reduction": "batchmean"}),
    ("fedmho-md", {"lam": 0.8}),
)


def per_class(pred: torch.Tensor, y: torch.Tensor, c: int) -> list[float]:
    return [100 * float((pred[y == k] == k).float().mean()) for k in range(c)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a simulate run directory (with uploads/)")
    ap.add_argument("--seed", type=int, default=0, help="fusion seed (the run's seed)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    uploads = Path(args.run) / "uploads"
    found = ingest(str(uploads), max_upload_bytes=1 << 30)
    ctx = FusionContext(found.uploads, device=torch.device("cpu"), seed=args.seed)
    cls, dec = ctx.classifiers, ctx.decoders
    c = ctx.num_classes
    test = load_dataset("mnist", "test")
    x, y = torch.from_numpy(test.x), torch.from_numpy(test.y).long()
    _, w0 = average_classifiers(cls, "fedmho")
    with torch.no_grad():
        rows = {
            "w0 (classifier average)": per_class(w0.eval()(x).argmax(1), y, c),
            "MD teacher (mean logits)": per_class(
                mean_teacher_logits(cls, x, ctx.device).argmax(1), y, c
            ),
        }
    sweep = []
    for method, opts in SWEEP:
        rep = run_fuse(
            FuseJob(
                uploads=str(uploads),
                method=method,
                out=f"{args.run}/diagnosis/{method}.onnx",
                options=opts | {"seed": args.seed},
                eval="mnist:test",
                device="cpu",
            )
        )
        label = method + (" " + ",".join(f"{k}={v}" for k, v in opts.items()) if opts else "")
        sweep.append((label, 100 * rep["accuracy"], rep["total_seconds"]))
        if not opts:
            rows[method] = [100 * a for a in rep["eval"]["per_class_accuracy"]]
        print(f"{label}: {sweep[-1][1]:.2f}", flush=True)

    lines = [
        f"# FedMHO diagnosis: {args.run} ({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC)",
        "",
        f"Command: `python {' '.join(sys.argv)}`  ",
        f"Machine: {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}",
        "",
        "| | " + " | ".join(str(k) for k in range(c)) + " | all |",
        "|---|" + "---:|" * (c + 1),
    ]
    for name, ups in (("samples held by classifier clients", cls), ("... by CVAE clients", dec)):
        counts = np.stack([u.label_counts for u in ups]).sum(0)
        lines.append(
            f"| {name} | " + " | ".join(str(int(n)) for n in counts) + f" | {int(counts.sum())} |"
        )
    for name, accs in rows.items():
        overall = float(np.dot(accs, np.bincount(y.numpy(), minlength=c)) / len(y))
        lines.append(
            f"| {name} test acc % | " + " | ".join(f"{a:.1f}" for a in accs) + f" | {overall:.2f} |"
        )
    lines += [
        "",
        "Global-training configuration sweep on the same uploads (default = the "
        "paper's: Adam lr 1e-5, 10 epochs, lambda 0.5, KL reduction 'mean'):",
        "",
        "| configuration | test acc % | fuse s |",
        "|---|---:|---:|",
    ]
    lines += [f"| {label} | {acc:.2f} | {sec:.0f} |" for label, acc, sec in sweep]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    Path(args.out).with_suffix(".json").write_text(
        json.dumps({"run": args.run, "per_class": rows, "sweep": sweep}, indent=2)
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
