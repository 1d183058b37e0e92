"""Uploads held in memory or parked on disk after their checks (issue 36, `server fuse
--resident-mib`): wall time and peak memory of `server fuse` over a federation of large
classifiers, both ways, and whether the global models are the same.

    python bench/bench_parked.py [--phones 10] [--methods fedavg,fedmho-md]
                                 [--work runs/bench-parked] [--out bench/results/parked]

The federation: `--phones` copies of one VGG-9 upload (264 MiB; trained one epoch on ~100
MNIST samples, the copies given distinct client ids: the bench measures the server, not the
weights' values) and two wristband decoders (`client train --profile wristband`, one epoch).
Each method runs in a fresh process twice: held (`--resident-mib` above the folder's size) and
parked (`--resident-mib 0`), with MNIST's test set for accuracy. FedMHO-MD runs with a short
schedule (`synthetic`, `epochs`): a VGG-9 teacher pass and student on 2 CPUs is minutes per
thousand samples. Peak RSS is the largest process of the command (the server or a worker).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _record import RSS_WRAPPER, run_header

ROOT = Path(__file__).resolve().parents[1]
EDGEFL = [
    sys.executable,
    "-c",
    "import sys; from edgefl.cli import main; sys.argv[0]='edgefl'; main()",
]
OPTIONS = {"fedavg": [], "fedmho-md": ["--opt", "synthetic=300", "--opt", "epochs=1"]}


def client(out: Path, profile: str, index: int, *extra: str) -> None:
    subprocess.run(
        [
            *EDGEFL,
            "client",
            "train",
            "--profile",
            profile,
            "--dataset",
            "mnist",
            "--num-clients",
            "500",
            "--partition",
            "iid",
            "--client-index",
            str(index),
            "--epochs",
            "1",
            "--force",
            "--out",
            str(out),
            *extra,
        ],
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )


def federation(work: Path, phones: int) -> Path:
    import exporters

    fed = work / f"vgg9x{phones}"
    if len(list(fed.glob("*.onnx"))) == phones + 2:
        return fed
    fed.mkdir(parents=True, exist_ok=True)
    one = work / "one"
    client(one, "smartphone", 0, "--model", "vgg9")
    model = exporters.read_artifact(next(one.glob("*.onnx"))).model
    meta = exporters.get_metadata(model)
    for i in range(phones):  # same weights, distinct clients: the server sees `phones` uploads
        exporters.set_metadata(model, meta | {"client_id": f"phone-{i:03d}"})
        exporters.atomic_write_bytes(fed / f"phone-{i:03d}.onnx", model.SerializeToString())
    for i in (1, 2):
        client(fed, "wristband", i)
    return fed


def fuse(uploads: Path, method: str, resident_mib: int, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-c",
        RSS_WRAPPER,
        *EDGEFL,
        "server",
        "fuse",
        str(uploads),
        "--method",
        method,
        *OPTIONS.get(method, []),
        "--out",
        str(out / f"{method}.onnx"),
        "--eval",
        "mnist:test",
        "--device",
        "cpu",
        "--resident-mib",
        str(resident_mib),
        "--overwrite",
        "--quiet",
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{method} failed:\n{done.stderr[-3000:]}")
    rss_kb = int(done.stderr.rsplit("MAXRSS_KB", 1)[1].split()[0])
    report = json.loads((out / f"{method}.json").read_text())
    return {
        "wall_seconds": wall,
        "peak_rss_mib": rss_kb / 1024,
        "accuracy": report["accuracy"],
        "uploads_parked": report["uploads_parked"],
        "stages": report["seconds"],
        "ingest_stages": report["ingest_stages"],
        "global_sha256": report["global_sha256"],
    }


def table(header: dict, fed_bytes: int, phones: int, rows: dict) -> str:
    lines = [
        "# Uploads held or parked after the ingest (bench/bench_parked.py)",
        "",
        f"`{header['command']}` on {header['date']}, {header['machine']}, commit "
        f"{header['commit']}.",
        "",
        f"{phones} VGG-9 uploads (copies of one, distinct client ids) and 2 wristband decoders, "
        f"{fed_bytes / 2**20:,.0f} MiB of files; MNIST test set.",
        "",
        "| method | uploads | wall s | peak RSS MiB | ingest s | fusion stages s | accuracy % | "
        "same model |",
        "|---|---|---:|---:|---:|---|---:|---|",
    ]
    for method, pair in rows.items():
        for how in ("held", "parked"):
            r = pair[how]
            stages = ", ".join(
                f"{k} {v:.1f}" for k, v in r["stages"].items() if k not in ("ingest", "total")
            )
            same = pair["held"]["global_sha256"] == pair["parked"]["global_sha256"]
            lines.append(
                f"| {method} | {how} ({r['uploads_parked']} parked) | {r['wall_seconds']:.1f} | "
                f"{r['peak_rss_mib']:,.0f} | {r['stages'].get('ingest', 0):.1f} | {stages} | "
                f"{100 * r['accuracy']:.2f} | {'yes' if same else 'NO'} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--phones", type=int, default=10)
    ap.add_argument("--methods", default="fedavg,fedmho-md")
    ap.add_argument("--work", default="runs/bench-parked")
    ap.add_argument("--out", default="bench/results/parked")
    args = ap.parse_args()
    header = run_header("bench/bench_parked.py")
    work = Path(args.work)
    fed = federation(work, args.phones)
    fed_bytes = sum(p.stat().st_size for p in fed.glob("*.onnx"))
    above = fed_bytes // 2**20 + 1
    rows = {}
    for method in args.methods.split(","):
        rows[method] = {}
        for how, mib in (("held", above), ("parked", 0)):
            r = fuse(fed, method, mib, work / how)
            rows[method][how] = r
            print(
                f"{method} {how}: {r['wall_seconds']:.1f} s, peak {r['peak_rss_mib']:,.0f} MiB, "
                f"{100 * r['accuracy']:.2f} %, {r['uploads_parked']} parked",
                flush=True,
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = header | {"phones": args.phones, "upload_bytes": fed_bytes, "methods": rows}
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(table(header, fed_bytes, args.phones, rows))
    print(f"wrote {out}.md and {out}.json")


if __name__ == "__main__":
    main()
