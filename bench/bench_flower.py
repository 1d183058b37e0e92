"""Scale of `edgefl simulate` through Flower's simulation engine (Ray) against the local engine:
10, 50 and 200 clients, small models, MNIST, 2 cores (issue 17).

Every client is a smartphone training the paper's small `cnn` for one epoch on its Dir(0.5)
shard of MNIST's 60,000 training digits, then the server fuses with fedavg and evaluates on
MNIST's test split. For each client count and engine, one `edgefl simulate` runs in a fresh
folder; this script samples the resident memory of its whole process tree (Ray's processes
included) every 0.5 s from /proc and reads the run's own timings (clients, fusion) from
results.json. Writes OUT.json and OUT.md.

    python bench/bench_flower.py --work /tmp/bf --out bench/results/flower     # ~20 min, 2 CPUs
    python bench/bench_flower.py --clients 2 --model vgg9 --subset 600 \
        --out bench/results/flower_vgg9        # two 264 MiB uploads through each engine
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EDGEFL = Path(sys.executable).parent / "edgefl"


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and every descendant (one pass over /proc)."""
    parent, rss = {}, {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            status = (d / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        parent[int(d.name)] = int(fields.get("PPid", "0").strip() or 0)
        rss[int(d.name)] = int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo += [c for c, pp in parent.items() if pp == p]
    return total


def run(clients: int, engine: str, work: Path, jobs: int, model: str, subset: int | None) -> dict:
    out = work / f"{engine}-{clients}-{model}"
    shutil.rmtree(out, ignore_errors=True)
    argv = [
        str(EDGEFL),
        "simulate",
        "--engine",
        engine,
        "--dataset",
        "mnist",
        "--clients",
        str(clients),
        "--mix",
        f"smartphone:{clients}",
        "--client-model",
        f"smartphone={model}",
        "--classifier-epochs",
        "1",
        "--methods",
        "fedavg",
        "--jobs",
        str(jobs),
        "--out",
        str(out),
        "--json",
        "--quiet",
    ] + (["--subset", str(subset)] if subset else [])
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_rss(proc.pid))
            time.sleep(0.5)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - start
    t.join()
    if proc.returncode != 0:
        raise SystemExit(f"{engine} x {clients} failed ({proc.returncode}):\n{stderr[-3000:]}")
    res = json.loads(stdout)
    s = res["seconds"]
    return {
        "clients": clients,
        "engine": engine,
        "wall_s": wall,
        "clients_s": s["clients"],
        "fusion_s": s["fusion"],
        "startup_s": wall - s["total"],
        "peak_rss_bytes": peak[0],
        "accuracy": res["results"][0]["accuracy"],
        "model": model,
        "subset": subset,
        "upload_bytes": max(c["upload_bytes"] for c in res["clients"]),
    }


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        "# Flower's simulation engine vs the local engine (bench/bench_flower.py)",
        "",
        f"{meta['date_utc']} UTC, {meta['machine']}; `{meta['command']}`. MNIST"
        + (f" (a {meta['subset']:,}-digit subset)" if meta["subset"] else "")
        + f", Dir(0.5), every client a smartphone training `{meta['model']}` for 1 epoch "
        f"(single-threaded), then fedavg; --jobs {meta['jobs']}. flwr {meta['flwr']}, ray "
        f"{meta['ray']}.",
        "",
        "| clients | engine | upload | wall s | clients s | per client s | fusion s "
        "| process start s | peak RSS (tree) | fedavg acc |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['clients']} | {r['engine']} | {r['upload_bytes'] / 2**20:.2f} MiB | "
            f"{r['wall_s']:.1f} | {r['clients_s']:.1f} | "
            f"{r['clients_s'] / r['clients']:.2f} | {r['fusion_s']:.1f} | {r['startup_s']:.1f} | "
            f"{r['peak_rss_bytes'] / 2**30:.2f} GiB | {100 * r['accuracy']:.2f}% |"
        )
    lines += [
        "",
        "clients s: training every client and landing its upload (for Flower: the "
        "engine's start, one ClientApp run per client, the replies' checks); process "
        "start: the command's imports and setup before the run's own clock starts.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default="10,50,200")
    ap.add_argument("--engines", default="local,flower")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--model", default="cnn", help="every client's model, e.g. vgg9 (264 MiB)")
    ap.add_argument("--subset", type=int, default=None, help="MNIST digits used (default all)")
    ap.add_argument("--work", default="/tmp/bench-flower")
    ap.add_argument("--out", default=str(ROOT / "bench/results/flower"))
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in (int(c) for c in args.clients.split(",")):
        for engine in args.engines.split(","):
            r = run(n, engine, work, args.jobs, args.model, args.subset)
            print(json.dumps(r), flush=True)
            rows.append(r)
    meta = {
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "command": "python bench/bench_flower.py " + " ".join(sys.argv[1:]),
        "jobs": args.jobs,
        "flwr": metadata.version("flwr"),
        "model": args.model,
        "subset": args.subset,
        "ray": metadata.version("ray"),
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    out.with_suffix(".md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))


if __name__ == "__main__":
    main()
