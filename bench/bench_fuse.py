"""Ingest once, fuse many (issue 14): what one `edgefl server fuse` over several methods costs
against each method alone, what each ingest stage costs for one paper-size VGG-9 upload, and
the peak memory of ingesting five of them.

    python bench/bench_fuse.py [--out bench/results/fuse] [--work runs/bench-fuse]

1. The FedMHO paper's small prototypes on MNIST (5 `cnn` classifier + 5 `cvae-small` decoder
   uploads, trained briefly by `edgefl simulate --paper-models`: timing, not accuracy), the six
   methods of its table with their default (paper) configurations: each alone
   (`server fuse --method M --out ...`) and all six in one command (`--method a,...,f
   --out-dir`). Targets: all six <= 1.3 x the slowest alone, and <= 60 s. FedCVAE-ENS's 40
   epochs make it the slowest by far; `--opt fedcvae-ens:epochs=20 --skip-vgg9 --out
   bench/results/fuse_equal` shows the harder case of methods of more equal length.
2. One VGG-9 upload (264 MiB; trained one epoch on ~100 samples: the weights' values do not
   matter here) through every ingest stage: read, parse, checker, tensors, hash, session
   (exporters.validate_upload), rebuild, parity (edgefl.artifacts.rebuild). Target on the CPU
   of a GPU machine: <= 3 s in all.
3. Peak RSS of ingesting 5 such uploads (copies with distinct client ids) in a fresh process,
   over their total size. Target: <= 2.5 x.
Every timing is wall-clock on this machine, whatever else runs on it (see `load` in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EDGEFL = [
    sys.executable,
    "-c",
    "import sys; from edgefl.cli import main; sys.argv[0]='edgefl'; main()",
]
TABLE = ["fedavg", "ensemble", "fedcvae-ens", "fedmho", "fedmho-md", "fedmho-sd"]


def run(args: list[str], **kw) -> float:
    start = time.perf_counter()
    subprocess.run(
        EDGEFL + [str(a) for a in args], check=True, cwd=ROOT, stdout=subprocess.DEVNULL, **kw
    )
    return time.perf_counter() - start


def federation(work: Path) -> Path:
    sim = work / "sim"
    if not (sim / "uploads").is_dir() or len(list((sim / "uploads").glob("*.onnx"))) < 10:
        run(
            [
                "simulate",
                "--dataset",
                "mnist",
                "--clients",
                "10",
                "--paper-models",
                "--classifier-epochs",
                "2",
                "--generator-epochs",
                "2",
                "--methods",
                "fedavg",
                "--jobs",
                "2",
                "--out",
                sim,
            ]
        )
    return sim / "uploads"


def bench_methods(uploads: Path, work: Path, repeats: int, opts: list[str]) -> dict:
    """`repeats` rounds of (each method alone, then all six together); judged on the medians:
    wall times on shared cores vary by ~20 % from one run to the next."""

    def extra(methods: list[str]) -> list[str]:  # the same options alone and together
        def applies(o: str) -> bool:  # METHOD:key=value for that method; key=value for all
            head, sep, _ = o.partition(":")
            return not sep or "=" in head or head in methods

        return [a for o in opts if applies(o) for a in ("--opt", o)]

    rounds = []
    for r in range(repeats):
        out = work / "fused"
        shutil.rmtree(out, ignore_errors=True)
        alone = {}
        for m in TABLE:
            alone[m] = run(
                [
                    "server",
                    "fuse",
                    uploads,
                    "--method",
                    m,
                    "--out",
                    out / "alone" / f"{m}.onnx",
                    "--device",
                    "cpu",
                    *extra([m]),
                ]
            )
        together = run(
            [
                "server",
                "fuse",
                uploads,
                "--method",
                ",".join(TABLE),
                "--out-dir",
                out / "together",
                "--device",
                "cpu",
                *extra(TABLE),
            ]
        )
        slowest = max(alone.values())
        rounds.append(
            {
                "alone_seconds": alone,
                "together_seconds": together,
                "slowest_alone_seconds": slowest,
                "ratio": together / slowest,
            }
        )
        print(
            f"  round {r + 1}: alone "
            + ", ".join(f"{m} {t:.1f}" for m, t in alone.items())
            + f"; all six {together:.1f} s = {together / slowest:.2f} x the slowest",
            flush=True,
        )
    reports = {m: json.loads((out / "together" / f"{m}.json").read_text()) for m in TABLE}
    alone_median = {m: statistics.median(x["alone_seconds"][m] for x in rounds) for m in TABLE}
    together = statistics.median(x["together_seconds"] for x in rounds)
    ratio = statistics.median(x["ratio"] for x in rounds)
    return {
        "options": opts,
        "rounds": rounds,
        "alone_seconds": alone_median,
        "together_seconds": together,
        "slowest_alone_seconds": max(alone_median.values()),
        "ratio": ratio,
        "target_ratio": 1.3,
        "target_seconds": 60,
        "meets": ratio <= 1.3 and together <= 60,
        "together_stage_seconds": {m: r["seconds"] for m, r in reports.items()},
        "ingest_stages": reports[TABLE[0]]["ingest_stages"],
    }


def vgg9_upload(work: Path) -> Path:
    d = work / "vgg9"
    path = d / "client-000.onnx"
    if not path.exists():
        run(
            [
                "client",
                "train",
                "--profile",
                "smartphone",
                "--dataset",
                "mnist",
                "--model",
                "vgg9",
                "--force",
                "--num-clients",
                "500",
                "--partition",
                "iid",
                "--client-index",
                "0",
                "--epochs",
                "1",
                "--out",
                d,
            ]
        )
    return path


STAGES = r"""
import json, sys, time
import exporters
from edgefl.artifacts import rebuild
t = {}
start = time.perf_counter()
art = exporters.validate_upload(sys.argv[1], timings=t)
module, why = rebuild(art, timings=t)
assert why is None, why
t["total"] = time.perf_counter() - start
print(json.dumps(t))
"""

RSS = r"""
import json, resource, sys, time
from pathlib import Path
import torch
import exporters
from edgefl.server.ingest import ingest
torch.zeros(1) + 1  # libraries loaded and warmed before the baseline
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.perf_counter()
found = ingest(sys.argv[1], max_upload_bytes=exporters.DEFAULT_MAX_UPLOAD_BYTES)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
size = sum(p.stat().st_size for p in Path(sys.argv[1]).glob("*.onnx"))
print(json.dumps({"uploads": len(found.uploads), "rejected": found.rejected, "total_bytes": size,
                  "baseline_rss": base, "peak_rss": peak, "ratio": (peak - base) / size,
                  "seconds": seconds, "stages": found.stages}))
"""


def python(code: str, *args) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        check=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_vgg9(work: Path) -> dict:
    import exporters

    one = vgg9_upload(work)
    runs = [python(STAGES, one) for _ in range(2)]
    best = min(runs, key=lambda r: r["total"])
    print(
        f"  one VGG-9 upload ({one.stat().st_size / 2**20:.0f} MiB), best of 2: "
        + ", ".join(f"{k} {v:.2f}s" for k, v in best.items()),
        flush=True,
    )
    five = work / "vgg9x5"
    if len(list(five.glob("*.onnx"))) != 5:
        five.mkdir(parents=True, exist_ok=True)
        model = exporters.read_artifact(one).model
        meta = exporters.get_metadata(model)
        for i in range(5):  # same weights, distinct clients: ingest treats them as 5 uploads
            exporters.set_metadata(model, meta | {"client_id": f"client-{i:03d}"})
            exporters.atomic_write_bytes(five / f"client-{i:03d}.onnx", model.SerializeToString())
    rss = python(RSS, five)
    print(
        f"  5 VGG-9 uploads ({rss['total_bytes'] / 2**20:.0f} MiB): peak RSS over baseline "
        f"{(rss['peak_rss'] - rss['baseline_rss']) / 2**20:.0f} MiB = {rss['ratio']:.2f} x, "
        f"ingest {rss['seconds']:.1f} s"
    )
    return {
        "upload_bytes": one.stat().st_size,
        "stages_runs": runs,
        "stages_best": best,
        "target_seconds_gpu_host": 3.0,
        "rss_five": rss,
        "target_rss_ratio": 2.5,
        "rss_meets": rss["ratio"] <= 2.5,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results/fuse")
    ap.add_argument("--work", default="runs/bench-fuse")
    ap.add_argument("--skip-vgg9", action="store_true")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of the six-method comparison")
    ap.add_argument(
        "--opt",
        action="append",
        default=[],
        metavar="[METHOD:]KEY=VALUE",
        help="a method option for every fuse (repeatable), e.g. fedcvae-ens:epochs=20 "
        "to compare methods of more equal length",
    )
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "machine": {
            "cpu_count": os.cpu_count(),
            "cpu": _cpu(),
            "python": platform.python_version(),
            "load_before": os.getloadavg(),
        },
    }
    print("1. six methods: alone vs one command", flush=True)
    result["methods"] = bench_methods(federation(work), work, args.repeats, args.opt)
    if not args.skip_vgg9:
        print("2-3. VGG-9 ingest stages and peak memory", flush=True)
        result["vgg9"] = bench_vgg9(work)
    result["machine"]["load_after"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    out.with_suffix(".md").write_text(markdown(result))
    print(f"wrote {out}.json and {out}.md")


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def markdown(r: dict) -> str:
    m = r["methods"]
    lines = [
        "# One ingest, many methods (bench/bench_fuse.py)",
        "",
        f"`{r['command']}`, {r['date_utc']} UTC; {r['machine']['cpu_count']} cores "
        f"({r['machine']['cpu']}), load average before {r['machine']['load_before'][0]:.2f}, "
        f"after {r['machine']['load_after'][0]:.2f}.",
        "",
        "## The FedMHO table's six methods, paper prototypes (5 cnn + 5 cvae-small), MNIST",
        "",
        "Options: "
        + (", ".join(f"`--opt {o}`" for o in m.get("options", [])) or "the defaults")
        + ". Whole commands (process start, ingest, fuse, export), seconds, per round:",
        "",
        "| method | "
        + " | ".join(f"round {i + 1}" for i in range(len(m["rounds"])))
        + " | median |",
        "|---|" + "---:|" * (len(m["rounds"]) + 1),
        *[
            f"| {k} | "
            + " | ".join(f"{x['alone_seconds'][k]:.1f}" for x in m["rounds"])
            + f" | {v:.1f} |"
            for k, v in m["alone_seconds"].items()
        ],
        "| **all six, one command** | "
        + " | ".join(f"**{x['together_seconds']:.1f}**" for x in m["rounds"])
        + f" | **{m['together_seconds']:.1f}** |",
        "| ratio to the slowest alone | "
        + " | ".join(f"{x['ratio']:.2f}" for x in m["rounds"])
        + f" | {m['ratio']:.2f} |",
        "",
        f"Median ratio to the slowest alone: {m['ratio']:.2f} (target <= {m['target_ratio']}); "
        f"all six {m['together_seconds']:.1f} s (target <= {m['target_seconds']} s): "
        f"{'met' if m['meets'] else 'NOT met'}.",
        "",
    ]
    if "vgg9" in r:
        v = r["vgg9"]
        best = v["stages_best"]
        rss = v["rss_five"]
        lines += [
            f"## One VGG-9 upload ({v['upload_bytes'] / 2**20:.0f} MiB), ingest stages, best of 2",
            "",
            "| stage | seconds |",
            "|---|---:|",
            *[f"| {k} | {s:.2f} |" for k, s in best.items()],
            "",
            f"Target <= {v['target_seconds_gpu_host']} s in all on the CPU of a GPU machine; "
            "these are this machine's cores.",
            "",
            "## Peak memory of ingesting 5 VGG-9 uploads",
            "",
            f"Total {rss['total_bytes'] / 2**20:.0f} MiB; peak RSS over the process baseline "
            f"{(rss['peak_rss'] - rss['baseline_rss']) / 2**20:.0f} MiB = **{rss['ratio']:.2f} x** "
            f"(target <= {v['target_rss_ratio']}: {'met' if v['rss_meets'] else 'NOT met'}); "
            f"ingest {rss['seconds']:.1f} s.",
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
