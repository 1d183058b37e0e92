"""The server's ingest alone: its wall time at several --jobs, and where one upload's time goes.

    python bench/bench_ingest.py UPLOADS [--jobs 1,4] [--profile 300] [--out STEM]

Why: on an H200 machine of 16 CPUs `server fuse` ingested 10,000 uploads in 139 s where 2 CPUs
take 44-49 s (`bench/results/scale_gpu.md`), its rebuild and parity stages 7-12x slower per
upload, and neither thread counts nor the CUDA build of torch reproduce that on 2 CPUs. This
bench times `edgefl.server.ingest.ingest` on a folder (each --jobs value, the stages summed
over uploads as the report gives them), then profiles `--profile N` uploads checked in one
worker thread (cProfile around each file's checks, rebuild and parity: the ingest's own code
path), and writes the functions that took the most time per upload. Run it where the ingest is
slow and where it is not, on the same uploads (`bench_scale.py --work` keeps a federation).
Writes STEM.json and STEM.md.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import tempfile
import time
from pathlib import Path

from edgefl.threads import share_cores_politely  # noqa: E402

share_cores_politely()  # as the CLI does before torch loads

import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from _record import ROOT, page_head, run_header  # noqa: E402

import exporters  # noqa: E402
import exporters.folder  # noqa: E402
from edgefl.server.ingest import ingest  # noqa: E402

TOP = 25


def timed_ingest(folder: Path, jobs: int) -> dict:
    start = time.perf_counter()
    found = ingest(folder, max_upload_bytes=exporters.DEFAULT_MAX_UPLOAD_BYTES, jobs=jobs)
    return {
        "jobs": jobs,
        "wall_s": round(time.perf_counter() - start, 3),
        "accepted": len(found.uploads),
        "rejected": len(found.rejected),
        "stages_s": {k: round(v, 3) for k, v in found.stages.items()},
    }


def profiled(folder: Path, n: int) -> dict:
    """cProfile of the first `n` uploads ingested with one worker thread: each file's checks,
    rebuild and parity run under one profiler (enabled in that thread around each file)."""
    names = sorted(p.name for p in folder.glob("*.onnx"))[:n]
    with tempfile.TemporaryDirectory(prefix="edgefl-ingest-") as tmp:
        for name in names:
            shutil.copyfile(folder / name, Path(tmp, name))
        prof = cProfile.Profile()
        check = exporters.folder._check_one

        def under_profile(*args, **kwargs):
            prof.enable()
            try:
                return check(*args, **kwargs)
            finally:
                prof.disable()

        exporters.folder._check_one = under_profile
        try:
            run = timed_ingest(Path(tmp), 1)
        finally:
            exporters.folder._check_one = check
    stats = pstats.Stats(prof)
    rows = []
    for (file, line, func), (_, calls, tottime, cumtime, _) in stats.stats.items():
        rows.append(
            {
                "function": f"{_short(file)}:{line}:{func}",
                "calls": calls,
                "own_ms_per_upload": round(1000 * tottime / len(names), 3),
                "total_ms_per_upload": round(1000 * cumtime / len(names), 3),
            }
        )
    by_own = sorted(rows, key=lambda r: -r["own_ms_per_upload"])[:TOP]
    by_total = sorted(rows, key=lambda r: -r["total_ms_per_upload"])[:TOP]
    return {"uploads": len(names), "run": run, "by_own": by_own, "by_total": by_total}


def _short(file: str) -> str:
    """A profiled function's file, from the package or Python's lib folder, not the machine's
    absolute path."""
    for marker in ("site-packages/", "/edgefl/", "/exporters/", "/lib/python"):
        if marker in file:
            return file[file.index(marker) :].lstrip("/")
    return file


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("uploads", type=Path, help="a folder of uploads (e.g. bench_scale's)")
    ap.add_argument("--jobs", default="1,4", help="server fuse --jobs values to time")
    ap.add_argument("--profile", type=int, default=300, help="uploads to profile (0: none)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "ingest"))
    args = ap.parse_args()
    if not args.uploads.is_dir():
        ap.error(f"{args.uploads} is not a folder of uploads")
    try:
        jobs = [int(j) for j in args.jobs.split(",")]
    except ValueError:
        ap.error(f"--jobs {args.jobs!r}: give whole numbers, e.g. 1,4")
    if not jobs or min(jobs) < 1 or args.profile < 0:
        ap.error("--jobs values must be 1 or more and --profile 0 or more")
    header = run_header("bench/bench_ingest.py") | {
        "threads": {
            "cpus": os.cpu_count(),
            "torch": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "torch_version": torch.__version__,
            "onnxruntime_version": ort.__version__,
            "cuda_available": torch.cuda.is_available(),
        }
    }
    runs = []
    for j in jobs:
        runs.append(timed_ingest(args.uploads, j))
        print(json.dumps(runs[-1]), flush=True)
    prof = profiled(args.uploads, args.profile) if args.profile else None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = header | {"uploads": str(args.uploads), "runs": runs, "profile": prof}
    out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    out.with_suffix(".md").write_text("\n".join(page(record)) + "\n")
    print(f"wrote {out.with_suffix('.md')}")


def page(r: dict) -> list[str]:
    t = r["threads"]
    lines = [
        *page_head("The server's ingest alone (bench/bench_ingest.py)", r),
        f"{t['cpus']} CPUs, torch {t['torch_version']} at {t['torch']} thread(s) "
        f"(OMP_NUM_THREADS {t['omp_num_threads']}), onnxruntime {t['onnxruntime_version']}, "
        f"CUDA {'available' if t['cuda_available'] else 'not available'}.",
        "",
        "| --jobs | uploads | wall s | ms / upload | stages summed over uploads, s |",
        "|---:|---:|---:|---:|---|",
    ]
    for run in r["runs"]:
        n = run["accepted"] + run["rejected"]
        stages = ", ".join(f"{k} {v:.1f}" for k, v in run["stages_s"].items())
        per = 1000 * run["wall_s"] / max(1, n)
        lines.append(f"| {run['jobs']} | {n:,} | {run['wall_s']:.1f} | {per:.2f} | {stages} |")
    p = r["profile"]
    if p:
        lines += [
            "",
            f"Profiled: {p['uploads']} uploads in one worker thread "
            f"({p['run']['wall_s']:.1f} s with the profiler). Functions by their own time per "
            "upload (ms), then by time including what they call:",
            "",
            "| function | calls | own ms / upload | total ms / upload |",
            "|---|---:|---:|---:|",
        ]
        for key in ("by_own", "by_total"):
            for row in p[key]:
                lines.append(
                    f"| `{row['function']}` | {row['calls']:,} | {row['own_ms_per_upload']:.3f} "
                    f"| {row['total_ms_per_upload']:.3f} |"
                )
            lines.append("| | | | |")
        lines.pop()
    return lines


if __name__ == "__main__":
    main()
