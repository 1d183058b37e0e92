"""Data-free fusion on HAPT sensor windows (issue 32 item 2): DENSE, FedHydra, pFedZKD and
Co-Boosting distil the 6 phones' classifiers of an 18-user federation (12 wristbands, 6 phones),
3 seeds, each beside the phones' logit ensemble it distils.

Uploads, once per seed (skipped when WORK/sS/uploads exists):

    edgefl simulate --dataset hapt --partition user --clients 18 \\
        --mix wristband:12,smartphone:6 --classifier-epochs 50 --public-size 1000 \\
        --methods ensemble --seed S --jobs 2 --out WORK/sS

Fusion: each method's `fuse` with its defaults plus `--opt` overrides (seed 0) on the ingested
classifiers, as `edgefl server fuse` calls it; the global model scored on the 3,384 windows of
the 9 UCI test users, with per-class recall. Writes OUT.json and OUT.md.

    python bench/bench_datafree_hapt.py --methods pfedzkd --work /tmp/hydra --out bench/results/x
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
EDGEFL = Path(sys.executable).parent / "edgefl"


def uploads(work: Path, seed: int, jobs: int) -> Path:
    out = work / f"s{seed}"
    if not (out / "uploads").is_dir():
        argv = [
            str(EDGEFL),
            "simulate",
            "--dataset",
            "hapt",
            "--partition",
            "user",
            "--clients",
            "18",
            "--mix",
            "wristband:12,smartphone:6",
            "--classifier-epochs",
            "50",
            "--public-size",
            "1000",
            "--methods",
            "ensemble",
            "--seed",
            str(seed),
            "--jobs",
            str(jobs),
            "--out",
            str(out),
            "--quiet",
        ]
        subprocess.run(argv, check=True)
    return out / "uploads"


def parse(opt: list[str]) -> dict[str, dict[str, str]]:
    """--opt METHOD:key=value -> {method: {key: text}}."""
    out: dict[str, dict[str, str]] = {}
    for o in opt:
        method, kv = o.split(":", 1)
        key, value = kv.split("=", 1)
        out.setdefault(method, {})[key] = value
    return out


def fuse(method: str, folder: Path, overrides: dict[str, str], test) -> dict:
    from edgefl.fusion import METHODS
    from edgefl.fusion.base import FusionContext
    from edgefl.models.spec import parse_value
    from edgefl.server.ingest import ingest

    m = METHODS.get(method)  # options typed as `server fuse --opt` types them
    # Options that default by input kind resolved for windows, as `server fuse` resolves them.
    cfg = m.effective_config({k: parse_value(v) for k, v in overrides.items()}, test.input_shape)
    teachers = [u for u in ingest(folder, max_upload_bytes=10**8).uploads if u.kind == "classifier"]
    x, y = torch.from_numpy(test.x), torch.from_numpy(test.y)
    with torch.no_grad():
        ens = torch.stack([u.module.eval()(x) for u in teachers]).mean(0).argmax(1)
    start = time.monotonic()
    result = m.fuse(FusionContext(teachers, device=torch.device("cpu"), seed=cfg.seed), cfg)
    seconds = time.monotonic() - start
    with torch.no_grad():
        pred = result.model.cpu().eval()(x).argmax(1)

    def recall(p):
        return [round(float((p[y == c] == c).float().mean()), 3) for c in range(int(y.max()) + 1)]

    return {
        "method": method,
        "options": overrides,
        "accuracy": float((pred == y).float().mean()),
        "ensemble": float((ens == y).float().mean()),
        "seconds": round(seconds, 1),
        "recall": recall(pred),
        "ensemble_recall": recall(ens),
    } | ({"student": result.info["student"]} if "student" in result.info else {})


def markdown(res: dict) -> str:
    lines = [
        "# Data-free fusion on HAPT windows (bench/bench_datafree_hapt.py)",
        "",
        f"Command: `{res['command']}`  ",
        f"Date: {res['date']}  ",
        f"Machine: {res['machine']}  ",
        f"Commit: {res['commit']}",
        "",
        "| method | options | "
        + " | ".join(f"seed {s}" for s in res["seeds"])
        + " | mean | std | ensemble mean | gap | seconds |",
        "|---|---|" + "---:|" * (len(res["seeds"]) + 5),
    ]
    for key, rows in res["rows"].items():
        acc = [100 * r["accuracy"] for r in rows]
        ens = [100 * r["ensemble"] for r in rows]
        opts = ", ".join(f"{k}={v}" for k, v in rows[0]["options"].items()) or "defaults"
        std = float(np.std(acc, ddof=1)) if len(acc) > 1 else 0.0
        lines.append(
            f"| {key} | {opts} | "
            + " | ".join(f"{a:.2f}" for a in acc)
            + f" | {np.mean(acc):.2f} | {std:.2f} | {np.mean(ens):.2f} | "
            f"{np.mean(acc) - np.mean(ens):+.2f} | {np.mean([r['seconds'] for r in rows]):.0f} |"
        )
    lines += ["", "Per-class recall (walking, upstairs, downstairs, sitting, standing, lying):", ""]
    for key, rows in res["rows"].items():
        for s, r in zip(res["seeds"], rows, strict=True):
            lines.append(f"- {key}, seed {s}: {r['recall']} (ensemble {r['ensemble_recall']})")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--methods", default="dense,fedhydra,pfedzkd")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--opt", action="append", default=[], help="METHOD:key=value (repeatable)")
    ap.add_argument("--work", default="/tmp/bench-datafree-hapt")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench/results/datafree_hapt_bench"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from edgefl.data import load_dataset

    test = load_dataset("hapt:test")
    seeds = [int(s) for s in args.seeds.split(",")]
    opts = parse(args.opt)
    rows: dict[str, list[dict]] = {}
    for method in args.methods.split(","):
        for seed in seeds:
            r = fuse(method, uploads(Path(args.work), seed, args.jobs), opts.get(method, {}), test)
            rows.setdefault(method, []).append(r)
            print(json.dumps({"seed": seed} | r), flush=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    res = {
        "command": "python " + " ".join(sys.argv),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
        f"({args.threads} thread(s)), load average at end {os.getloadavg()}",
        "commit": commit,
        "seeds": seeds,
        "rows": rows,
    }
    Path(args.out).with_suffix(".json").write_text(json.dumps(res, indent=1))
    Path(args.out).with_suffix(".md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
