"""Wall time of edgefl's computing commands on a quiet machine vs with two busy processes.

Requirement: every command stays within 3x its quiet time when two other busy processes share
the cores, with nothing for the user to set (edgefl/__init__.py: OpenMP waits passively and
uses no more threads than cores free at start; exporters/read.py: onnxruntime does not spin).

For each command (`server fuse` with fedmho over 2 cnn + 2 cvae-small digits uploads prepared
once, one `client train`, a tiny `simulate`) it measures the quiet time (best of --quiet-runs),
then --loaded-runs runs beside --busy `while True: pass` processes started by this script, and
writes a markdown table and JSON (OUT.md, OUT.json). Every run gets a fresh output directory.
OpenMP/MKL variables inherited from the caller are removed from the measured commands'
environment (they measure edgefl's defaults); --env puts chosen ones back, e.g. to record the
state before the fix (libgomp's default spin count and every core, in torch only):

    python bench/bench_load.py                                          # ~3 min on 2 CPUs
    python bench/bench_load.py --env GOMP_SPINCOUNT=300000 --env OMP_NUM_THREADS=$(nproc) \
        --timeout 200 --out bench/results/load-before
    python bench/bench_load.py --env OMP_WAIT_POLICY=ACTIVE --env OMP_NUM_THREADS=$(nproc) \
        --timeout 200 --out bench/results/load-active      # torch and onnxruntime both spin

Run it on an otherwise idle machine: other load makes the quiet times too slow and the
ratios meaningless (the load average at the start is recorded).
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
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

LIMIT = 3.0  # loaded / quiet wall time allowed
# Thread settings a caller's shell may carry; the benchmark measures edgefl without them.
THREAD_VARS = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_")
DATA = ["--dataset", "digits", "--num-clients", "4", "--partition-seed", "0"]


def commands(edgefl: str, uploads: Path) -> dict[str, Callable[[Path], list[str]]]:
    """Command name -> function(run_dir) -> argv. Each is small (~10-30 s quiet on 2 CPUs)."""
    return {
        "server fuse": lambda d: [
            edgefl,
            "server",
            "fuse",
            str(uploads),
            "--method",
            "fedmho",
            "--out",
            str(d / "global.onnx"),
        ],
        "client train": lambda d: [
            edgefl,
            "client",
            "train",
            "--profile",
            "smartphone",
            *DATA,
            "--client-index",
            "0",
            "--model",
            "cnn",
            "--epochs",
            "5",
            "--out",
            str(d),
        ],
        "simulate": lambda d: [
            edgefl,
            "simulate",
            "--dataset",
            "digits",
            "--clients",
            "4",
            "--mix",
            "smartphone:2,wristband:2",
            "--methods",
            "fedavg,fedmho",
            "--classifier-epochs",
            "2",
            "--generator-epochs",
            "2",
            "--fuse-opt",
            "all:epochs=2",
            "--fuse-opt",
            "all:synthetic=500",
            "--out",
            str(d / "sim"),
        ],
    }


def prepare_uploads(edgefl: str, out: Path, env: dict[str, str]) -> None:
    """2 cnn classifiers + 2 cvae-small generators on a 4-client digits partition."""
    for index, model, role in (
        (0, "cnn", "classifier"),
        (1, "cnn", "classifier"),
        (2, "cvae-small", "generator"),
        (3, "cvae-small", "generator"),
    ):
        argv = [
            edgefl,
            "client",
            "train",
            "--profile",
            "smartphone",
            *DATA,
            "--client-index",
            str(index),
            "--model",
            model,
            "--role",
            role,
            "--epochs",
            "2",
            "--out",
            str(out),
        ]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"preparing uploads failed: {' '.join(argv)}\n{proc.stderr[-2000:]}")


@contextmanager
def busy(n: int):
    """n processes that each keep one core busy, killed on exit."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.5)  # let them get going
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def timed(argv: list[str], env: dict[str, str], timeout: float) -> dict:
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"seconds": None, "timed_out": True, "loadavg": os.getloadavg()[0]}
    seconds = time.perf_counter() - start
    run = {"seconds": round(seconds, 2), "loadavg": os.getloadavg()[0]}
    if proc.returncode:
        run |= {"returncode": proc.returncode, "stderr_tail": proc.stderr[-1500:]}
    return run


def measure(name: str, argv_for, env: dict[str, str], args, work: Path) -> dict:
    counter = iter(range(10**6))

    def one() -> dict:
        run_dir = work / f"{name.replace(' ', '-')}-{next(counter)}"  # fresh: simulate resumes
        run = timed(argv_for(run_dir), env, args.timeout)
        shutil.rmtree(run_dir, ignore_errors=True)
        shown = f"{run['seconds']:.1f} s" if run["seconds"] is not None else "timed out"
        print(f"  {name}: {shown}" + (" (FAILED)" if "returncode" in run else ""), flush=True)
        return run

    quiet = [one()]
    if "returncode" in quiet[0]:  # broken, not slow: say why and go on with the next command
        print(quiet[0]["stderr_tail"], file=sys.stderr)
        return summarise(name, _shown(argv_for(work / "RUN"), work), quiet, [], args.timeout)
    quiet += [one() for _ in range(args.quiet_runs - 1)]
    with busy(args.busy):
        loaded = [one() for _ in range(args.loaded_runs)]
    return summarise(name, _shown(argv_for(work / "RUN"), work), quiet, loaded, args.timeout)


def _shown(argv: list[str], work: Path) -> list[str]:
    return [a.replace(str(work), "WORK") for a in argv]


def summarise(name, argv, quiet, loaded, timeout) -> dict:
    ok = all("returncode" not in r for r in quiet + loaded)
    q = [r["seconds"] for r in quiet if r["seconds"] is not None]
    lo = [r["seconds"] if r["seconds"] is not None else float("inf") for r in loaded]
    best = min(q) if q and ok else None
    ratios = [round(s / best, 2) for s in lo] if best else []
    return {
        "command": name,
        "argv": ["edgefl", *argv[1:]],  # paths under the temporary WORK directory
        "quiet_runs": quiet,
        "loaded_runs": loaded,
        "quiet_best_s": best,
        "ratios": [r if r != float("inf") else None for r in ratios],
        "median_ratio": statistics.median(ratios) if ratios else None,
        "worst_ratio": max(ratios) if ratios else None,
        "passed": bool(ratios) and max(ratios) <= LIMIT,
        "errors": not ok,
        "timeout_s": timeout,
    }


def machine() -> dict:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": metadata.version("torch"),
        "onnxruntime": metadata.version("onnxruntime"),
    }


def markdown(report: dict) -> str:
    m = report["machine"]
    env = " ".join(f"{k}={v}" for k, v in report["env"].items()) or "none (edgefl's defaults)"
    lines = [
        "# Wall time under load (`bench/bench_load.py`)",
        "",
        f"`{report['command_line']}`, {report['date_utc']}",
        "",
        f"Machine: {m['cpu_count']} CPUs ({m['cpus_usable']} usable), {m['cpu_model']}, "
        f"{m['platform']}, Python {m['python']}, torch {m['torch']}, onnxruntime "
        f"{m['onnxruntime']}. Load average at the start: {report['loadavg_start']:.2f}.",
        "",
        f"Environment of the measured commands: {env}. Load: {report['busy']} busy processes "
        f"(`while True: pass`). Pass: every loaded run within {LIMIT:g}x the best quiet run.",
        "",
        "| command | quiet s | loaded s per run | ratio per run | worst ratio | result |",
        "|---|--:|---|---|--:|---|",
    ]
    for r in report["results"]:
        quiet = " / ".join(_s(x) for x in r["quiet_runs"])
        loaded = " / ".join(_s(x) for x in r["loaded_runs"])
        ratios = " / ".join(f"{x:.2f}" if x is not None else "-" for x in r["ratios"])
        worst = f"{r['worst_ratio']:.2f}" if r["worst_ratio"] not in (None, float("inf")) else "-"
        result = "error" if r["errors"] else ("pass" if r["passed"] else "FAIL")
        lines.append(
            f"| `edgefl {r['command']}` | {quiet} | {loaded} | {ratios} | {worst} | {result} |"
        )
    lines += ["", "Commands (WORK/RUN is a fresh directory per run):", ""]
    lines += [f"- `{' '.join(r['argv'])}`" for r in report["results"]]
    return "\n".join(lines) + "\n"


def _s(run: dict) -> str:
    if run["seconds"] is None:
        return "timeout"
    return f"{run['seconds']:.1f}" + ("!" if "returncode" in run else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--commands",
        default="server fuse,client train,simulate",
        help="comma list of: server fuse, client train, simulate",
    )
    ap.add_argument("--quiet-runs", type=int, default=2)
    ap.add_argument("--loaded-runs", type=int, default=3)
    ap.add_argument("--busy", type=int, default=2, help="busy processes during loaded runs")
    ap.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set in the measured commands' environment (repeatable)",
    )
    ap.add_argument("--timeout", type=float, default=300, help="per run, seconds")
    ap.add_argument("--edgefl", default=None, help="edgefl executable (default: this venv's)")
    ap.add_argument("--out", default="bench/results/load", help="writes OUT.md and OUT.json")
    args = ap.parse_args()

    edgefl = args.edgefl or str(Path(sys.executable).with_name("edgefl"))
    if not Path(edgefl).exists():
        edgefl = shutil.which("edgefl") or sys.exit("no edgefl executable: pass --edgefl")
    overrides = dict(kv.split("=", 1) for kv in args.env)
    env = {k: v for k, v in os.environ.items() if not k.startswith(THREAD_VARS)} | overrides
    report = {
        "command_line": " ".join(["python", *sys.argv]),
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "loadavg_start": os.getloadavg()[0],
        "env": overrides,
        "busy": args.busy,
        "limit": LIMIT,
        "results": [],
    }
    with tempfile.TemporaryDirectory(prefix="edgefl-bench-load-") as tmp:
        work = Path(tmp)
        print("preparing 4 uploads ...", flush=True)
        prepare_uploads(edgefl, work / "uploads", env)
        table = commands(edgefl, work / "uploads")
        for name in (c.strip() for c in args.commands.split(",")):
            if name not in table:
                sys.exit(f"unknown command {name!r}; choose from {', '.join(table)}")
            print(f"{name}: {args.quiet_runs} quiet, {args.loaded_runs} loaded", flush=True)
            report["results"].append(measure(name, table[name], env, args, work))

    md, js = Path(f"{args.out}.md"), Path(f"{args.out}.json")
    md.parent.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps(report, indent=2) + "\n")
    md.write_text(markdown(report))
    print(markdown(report))
    print(f"wrote {md} and {js}")


if __name__ == "__main__":
    main()
