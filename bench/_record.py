"""What every recorded bench result names: the command, when, on what machine, at which commit."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_header(script: str) -> dict:
    """`script` is the bench's path from the repository root (e.g. "bench/bench_scale.py")."""
    # EDGEFL_COMMIT: where the tree was copied without its history (a GPU machine's run)
    commit = (
        os.environ.get("EDGEFL_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
    )
    return {
        "command": " ".join(["python", script, *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs (shared), {platform.platform()}",
        "commit": commit,
    }


def page_head(title: str, header: dict) -> list[str]:
    """A record page's first lines: its title, then the run's command, date, machine and commit."""
    h = header
    return [
        f"# {title}",
        "",
        f"`{h['command']}`, {h['date']}, {h['machine']}, commit {h['commit']}.",
        "",
    ]


# `python -c RSS_WRAPPER CMD...` runs CMD and prints "MAXRSS_KB n" on stderr: the largest
# resident set of any process CMD started (the server or one of its forked workers).
RSS_WRAPPER = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.run(sys.argv[1:]).returncode\n"
    "print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


def write_record(stem: str, meta: dict, rows: list, text: str) -> None:
    """STEM.json ({"meta", "rows"}) and STEM.md (`text`): a bench's record."""
    Path(stem + ".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    Path(stem + ".md").write_text(text)


def child_row(argv: list[str]) -> dict:
    """Run one setting of a bench in a fresh process (its peak RSS is then the setting's own):
    `argv` after the interpreter; the child prints its row as JSON on its last line. A failed
    child stops the bench with its stderr."""
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True)
    if done.returncode:
        sys.exit(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])
