"""The CLI at the lowest versions pyproject.toml allows: a fresh venv with typer and rich at
their declared floors (and click on both sides of 8.2, where typer < 0.16 broke), then the
CLI smoke: every command built, `profile list` printed, a help page, a usage error (exit 2).

    python bench/floors.py            # ~1 min with a package index; writes bench/results/floors.md

torch is not installed: building the commands, their help and `profile list` must not need it
(the CLI imports torch only where a command runs a model). Needs pip to reach a package index.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from _record import run_header

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
# click on both sides of 8.2 (None: whatever pip resolves for the typer floor, its newest).
CLICKS = (None, "8.1.8")
# What the CLI imports beside typer and rich to build its commands (not torch).
BESIDE = ("numpy", "onnx", "onnxruntime")

SMOKE = """
import typer, typer.main
from typer.testing import CliRunner
from edgefl.cli import app
typer.main.get_command(app)
r = CliRunner().invoke(app, ["profile", "list"])
assert r.exit_code == 0 and "wristband" in r.output, r.output
r = CliRunner().invoke(app, ["server", "fuse", "--help"])
assert r.exit_code == 0 and "--quiet" in r.output, (r.output, r.exception)
r = CliRunner().invoke(app, ["profile", "list", "--no-such-option"])
assert r.exit_code == 2, r.output
import click, rich.console  # noqa: E401  (click: typer's dependency up to 0.2x)
from importlib.metadata import version
print("ok: typer", typer.__version__, "click", version("click"), "rich", version("rich"))
"""


def floors(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """Each dependency's declared floor ("typer>=0.16" -> {"typer": "0.16"}), markers ignored."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    found = {}
    for dep in deps:
        m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)", dep.split(";")[0])
        if m:
            found[m.group(1).lower()] = m.group(2)
    return found


def run(click: str | None, venv: Path) -> str:
    """Install the floors (and `click`) into a fresh `venv`; the smoke's last line."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    low = floors()
    wanted = [f"typer=={low['typer']}", f"rich=={low['rich']}", *BESIDE]
    subprocess.run([*pip, *wanted, *([f"click=={click}"] if click else [])], check=True)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", SMOKE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    last = (done.stdout.strip().splitlines() or done.stderr.strip().splitlines() or ["?"])[-1]
    return last if done.returncode == 0 else f"FAILED: {last}"


def main() -> int:
    head = run_header("bench/floors.py")
    rows = []
    for click in CLICKS:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append((click or "newest", run(click, Path(tmp) / "venv")))
            print(rows[-1])
    low = floors()
    lines = [
        "# The CLI at pyproject's floors",
        "",
        f"`{head['command']}`, {head['date']}, {head['machine']}, commit {head['commit']};",
        f"declared floors: typer>={low['typer']}, rich>={low['rich']} (torch not installed).",
        "",
        "| click asked | smoke |",
        "|---|---|",
        *(f"| {c} | {r} |" for c, r in rows),
        "",
    ]
    (ROOT / "bench" / "results" / "floors.md").write_text("\n".join(lines))
    return 0 if all(not r.startswith("FAILED") for _, r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
