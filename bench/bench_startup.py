"""What a fresh `edgefl` process costs before it does any work: the wall time of short commands
(median of --repeat runs, each a new process) and the import time of the modules every command
pays for. The suite spawns hundreds of such processes; a user waits on each one.

    python bench/bench_startup.py [--repeat 5] [--out bench/results/startup]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _record import page_head, run_header, write_record

EDGEFL = str(Path(sys.executable).parent / "edgefl")
COMMANDS = (
    ["--version"],
    ["server", "methods"],
    ["models", "--profile", "wristband", "--dataset", "mnist"],
    ["client", "plan", "--profile", "wristband", "--dataset", "mnist"],
)
# Imported by every command that reads an ONNX file (onnx -> ml_dtypes), fuses (the screen's
# scipy) or trains (torch).
MODULES = ("ml_dtypes", "onnx", "torch", "scipy.stats", "scipy.optimize", "edgefl.server.fuse")


def _wall(argv: list[str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return times


def _import_seconds(module: str, repeat: int) -> list[float]:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    return [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout)
        for _ in range(repeat)
    ]  # fmt: skip


def measure(repeat: int) -> list[dict]:
    rows = [
        {"what": "edgefl " + " ".join(argv), "seconds": _wall([EDGEFL, *argv], repeat)}
        for argv in COMMANDS
    ]
    rows += [{"what": f"import {m}", "seconds": _import_seconds(m, repeat)} for m in MODULES]
    for row in rows:
        row["median"] = round(statistics.median(row["seconds"]), 3)
    return rows


def versions() -> dict:
    from importlib.metadata import version

    return {name: version(name) for name in ("ml_dtypes", "onnx", "numpy", "scipy", "torch")}


def render(meta: dict, rows: list[dict]) -> str:
    lines = page_head("A fresh process: short commands and imports", meta)
    lines += [
        "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".",
        "",
        f"| what | median s (of {len(rows[0]['seconds'])}) | runs |",
        "|---|---:|---|",
    ]
    lines += [
        f"| `{r['what']}` | {r['median']:.2f} | {' '.join(f'{s:.2f}' for s in r['seconds'])} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="bench/results/startup")
    args = ap.parse_args()
    meta = run_header("bench/bench_startup.py") | {"versions": versions()}
    rows = measure(args.repeat)
    text = render(meta, rows)
    write_record(args.out, meta, rows, text)
    print(text)


if __name__ == "__main__":
    main()
