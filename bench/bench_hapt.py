"""One-shot FL on a wristband's own task (issue 20): human-activity recognition from the
accelerometer (UCI HAPT, `hapt`), one client per user, every method, 3 seeds, beside the bounds.

The federation: the 21 UCI train users. Public data for FedDF/FedOL is whole users (the
seeded draw of the fewest train users holding >= 1,000 windows: 3 users), so no client's
wearer is in it; every other train user is a client (`--partition user`, 18 when 3 are public):
two thirds wristbands (training the CVAE the planner fits into 0.8 MiB), the rest smartphones
(training the 1-D CNN the planner gives them); the 9 UCI test users are held out for every
accuracy. For each seed, one `edgefl simulate` with every method that reads these uploads,
timed whole; then the bounds:
- upper: a centrally trained model of the phones' size (the phone's model and local training,
  on all the clients' windows at once: `client train --partition iid --num-clients 1` with
  the same public carve);
- lower: the mean test accuracy of the phones' local models (each user alone).
Writes OUT.json and OUT.md.

    python bench/bench_hapt.py --out bench/results/hapt     # 3 seeds, about 30 min on 2 CPUs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EDGEFL = Path(sys.executable).parent / "edgefl"
METHODS = (
    "fedavg,ensemble,fedcvae-ens,fedmho,fedmho-md,fedmho-sd,fedmho-cw,feddf,fedol,dense,"
    "fedhydra,pfedzkd"
)
PUBLIC = 1_000  # windows; whole users


def federation(seed: int) -> tuple[int, str, list[int]]:
    """(clients, --mix, public users) for a seed: the users the public carve leaves."""
    from edgefl.data import carve_public, load_dataset

    ds = load_dataset("hapt")
    _, pub = carve_public(len(ds), PUBLIC, seed, ds.groups)
    public = sorted(set(ds.groups[pub].tolist()))
    clients = len(set(ds.groups.tolist())) - len(public)
    wrist = round(clients * 2 / 3)
    return clients, f"wristband:{wrist},smartphone:{clients - wrist}", public


def accuracy(path: Path, x: np.ndarray, y: np.ndarray) -> float:
    import exporters

    art = exporters.read_artifact(path)
    logits = np.concatenate([art.run(x[i : i + 512]) for i in range(0, len(x), 512)])
    return float((logits.argmax(1) == y).mean())


def one_seed(seed: int, work: Path, jobs: int, methods: str, epochs: int) -> dict:
    from edgefl.data import load_dataset

    out = work / f"seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    clients, mix, public = federation(seed)
    argv = [
        str(EDGEFL),
        "simulate",
        "--dataset",
        "hapt",
        "--partition",
        "user",
        "--clients",
        str(clients),
        "--mix",
        mix,
        "--methods",
        methods,
        "--public-size",
        str(PUBLIC),
        "--classifier-epochs",
        str(epochs),
        "--seed",
        str(seed),
        "--jobs",
        str(jobs),
        "--out",
        str(out),
        "--json",
        "--quiet",
    ]
    start = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True)
    wall = time.monotonic() - start
    if r.returncode != 0:
        sys.exit(f"simulate failed (seed {seed}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    report = json.loads(r.stdout)
    test = load_dataset("hapt:test")
    phones = [c for c in report["clients"] if c["profile"] == "smartphone"]
    model_dir = out / "uploads"
    local = [accuracy(model_dir / Path(c["path"]).name, test.x, test.y) for c in phones]
    central = out / "central"
    argv = [
        str(EDGEFL),
        "client",
        "train",
        "--profile",
        "smartphone",
        "--dataset",
        "hapt",
        "--partition",
        "iid",
        "--num-clients",
        "1",
        "--client-index",
        "0",
        "--seed",
        str(seed),
        "--partition-seed",
        str(seed),
        "--public-size",
        str(PUBLIC),
        "--out",
        str(central),
        "--model",
        _model_arg(phones[0]["model"]),
        "--epochs",
        str(epochs),
    ]
    c = subprocess.run(argv, capture_output=True, text=True)
    if c.returncode != 0:
        sys.exit(f"central training failed:\n{c.stdout[-2000:]}\n{c.stderr[-2000:]}")
    upper = accuracy(next(central.glob("*.onnx")), test.x, test.y)
    return {
        "seed": seed,
        "mix": mix,
        "public_users": public,
        "classifier_epochs": epochs,
        "simulate_wall_s": round(wall, 1),
        "clients_s": report.get("seconds", {}).get("clients"),
        "fusion_s": report.get("seconds", {}).get("fusion"),
        "accuracy": {x["method"]: x["accuracy"] for x in report["results"]},
        "errors": {x["method"]: x.get("error") for x in report["results"] if x.get("error")},
        "central": upper,
        "local_mean": float(np.mean(local)),
        "local": local,
        "clients": [
            {k: c.get(k) for k in ("client_id", "profile", "role", "model", "upload_bytes")}
            for c in report["clients"]
        ],
    }


def _model_arg(label: str) -> str:
    """`cnn1d(width=24)` (a spec label) -> `cnn1d:width=24` (a --model argument)."""
    if "(" not in label:
        return label
    name, rest = label.split("(", 1)
    return f"{name}:{rest.rstrip(')')}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--methods", default=METHODS)
    ap.add_argument(
        "--classifier-epochs",
        type=int,
        default=50,
        help="the phones' local epochs (and the central model's)",
    )
    ap.add_argument("--work", default="/tmp/bench-hapt")
    ap.add_argument("--out", default=str(ROOT / "bench/results/hapt"))
    ap.add_argument("--render", action="store_true", help="only rewrite OUT.md from OUT.json")
    args = ap.parse_args()
    if args.render:
        saved = json.loads(Path(f"{args.out}.json").read_text())
        Path(f"{args.out}.md").write_text(markdown(saved["rows"], saved["meta"]))
        return
    work = Path(args.work)
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        rows.append(one_seed(seed, work, args.jobs, args.methods, args.classifier_epochs))
        print(
            json.dumps(
                {
                    k: rows[-1][k]
                    for k in ("seed", "simulate_wall_s", "accuracy", "central", "local_mean")
                }
            ),
            flush=True,
        )
    meta = {
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "command": "python bench/bench_hapt.py " + " ".join(sys.argv[1:]),
    }
    Path(f"{args.out}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    Path(f"{args.out}.md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))


def _ms(values) -> str:
    v = [x for x in values if x is not None]
    if not v:
        return "-"
    return f"{100 * np.mean(v):.2f} +- {100 * np.std(v):.2f}"


def markdown(rows: list[dict], meta: dict) -> str:
    methods = list(rows[0]["accuracy"])
    lines = [
        "# One-shot FL on a wristband's task: UCI HAPT activities (bench/bench_hapt.py)",
        "",
        f"{meta['date_utc']}, {meta['machine']}; `{meta['command']}`.",
        "The UCI train users: per seed, whole users hold the public set and every other user is "
        "a client (`--partition user`): "
        + "; ".join(
            f"seed {r['seed']}: users {', '.join(map(str, r['public_users']))} public, {r['mix']}"
            for r in rows
        )
        + ". Accelerometer x/y/z windows (2.56 s, 50 % overlap), 6 activities; every accuracy on the 9 held-out "
        "UCI test users (3,384 windows); each device's profile defaults for local training except "
        f"the phones' epochs ({rows[0]['classifier_epochs']}: a user holds ~400 windows, 7 "
        "steps an epoch). "
        f"Seeds {', '.join(str(r['seed']) for r in rows)}: mean +- std.",
        "",
        "| method | top-1 % |",
        "|---|---:|",
        *[f"| {m} | {_ms(r['accuracy'].get(m) for r in rows)} |" for m in methods],
        "| **upper bound**: central model of the phones' size, all the clients' users | "
        f"{_ms(r['central'] for r in rows)} |",
        f"| **lower bound**: mean local phone model (one user each) | "
        f"{_ms(r['local_mean'] for r in rows)} |",
        "",
        "| seed | simulate wall s (every client + every method) | clients s | fusion s |",
        "|---:|---:|---:|---:|",
        *[
            f"| {r['seed']} | {r['simulate_wall_s']} | {r['clients_s']:.1f} | {r['fusion_s']:.1f} |"
            for r in rows
        ],
        "",
        "Upload per client (seed 0):",
        "",
        "| profile | role | model | upload bytes |",
        "|---|---|---|---:|",
    ]
    seen = set()
    for c in rows[0]["clients"]:
        key = (c["profile"], c["model"])
        if key not in seen:
            seen.add(key)
            lines.append(f"| {c['profile']} | {c['role']} | {c['model']} | {c['upload_bytes']:,} |")
    if any(r["errors"] for r in rows):
        lines += ["", "Methods that refused: " + json.dumps([r["errors"] for r in rows])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
