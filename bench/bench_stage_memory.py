"""Where a command's memory sits: its resident set sampled twice a second, each sample tagged
with the phase the command's last stderr line names (its words before the first number: edgefl's
progress lines, "pfedzkd inversion teacher 12/2000 ..." -> "pfedzkd inversion teacher"), and the
peak of each phase in the order they came.

    python bench/bench_stage_memory.py --out bench/results/NAME -- edgefl server fuse ...

Writes NAME.json and NAME.md. A stage that prints no line of its own (pFedZKD's labelling) is
counted in the phase before it. Linux only (/proc/PID/status)."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import run_header  # noqa: E402


def phase_of(line: str) -> str:
    return re.split(r"\s\d", line.strip())[0][:60] or "start"


def rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(v.split()[1]) for v in f if v.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None


def profile(cmd: list[str], every: float = 0.5) -> dict:
    """Run `cmd`; its phases in order, each with its peak RSS and when (s from the start)."""
    start = time.perf_counter()
    child = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    last = ["start"]
    lines: list[str] = []

    def follow() -> None:
        for line in child.stderr:
            if line.strip():
                last[0] = line
                lines.append(f"{time.perf_counter() - start:8.1f} {line.rstrip()[:160]}")

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    phases: dict[str, dict] = {}
    while child.poll() is None:
        kib = rss_kib(child.pid)
        if kib is not None:
            peak = phases.setdefault(phase_of(last[0]), {"peak_mib": 0.0, "at_s": 0.0})
            if kib / 1024 > peak["peak_mib"]:
                peak.update(
                    peak_mib=round(kib / 1024, 1), at_s=round(time.perf_counter() - start, 1)
                )
        time.sleep(every)
    reader.join(timeout=5)
    return {
        "rc": child.returncode,
        "wall_s": round(time.perf_counter() - start, 1),
        "phases": [{"phase": k, **v} for k, v in phases.items()],
        "last_lines": lines[-5:],
    }


def render(record: dict) -> str:
    head = (
        f"`{record['command']}` on {record['date']}, {record['machine']}, "
        f"commit {record['commit']}."
    )
    out = [head, "", "| phase | peak RSS MiB | at s |", "|---|---:|---:|"]
    out += [f"| {p['phase']} | {p['peak_mib']:,.1f} | {p['at_s']:.1f} |" for p in record["phases"]]
    out += ["", f"exit {record['rc']} after {record['wall_s']:.1f} s"]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="STEM: writes STEM.json and STEM.md")
    ap.add_argument("--every", type=float, default=0.5, help="seconds between samples")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command")
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("give the command after --")
    record = {**run_header("bench/bench_stage_memory.py"), "profiled": cmd}
    record |= profile(cmd, args.every)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    out.with_suffix(".md").write_text(render(record))
    print(render(record))


if __name__ == "__main__":
    main()
