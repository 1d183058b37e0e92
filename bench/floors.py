"""The CLI at the lowest versions pyproject.toml allows and at the newest: a fresh venv with
typer and rich at their declared floors (and click on both sides of 8.2, where typer < 0.16
broke), and one with the newest typer and click (typer 0.20 with click 8.5 dropped every
argument's help), then the CLI smoke: every command built, `profile list` printed, every
command's help page with each positional argument described once, a usage error (exit 2).

    python bench/floors.py            # ~2 min with a package index; writes bench/results/floors.md

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
# (typer, click): typer's floor with click on both sides of 8.2, and the newest of both (None:
# whatever pip resolves), where typer 0.20 with click 8.5 lost every argument's help.
PAIRS = (("floor", None), ("floor", "8.1.8"), (None, None))
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
# Every positional argument described once in its command's help (typer 0.20 with click 8.5
# lost them all: "MODEL  [required]").
from edgefl.cli.click_compat import Argument
def walk(cmd, path=()):
    subs = getattr(cmd, "commands", {})
    return [p for n, c in subs.items() for p in walk(c, (*path, n))] if subs else [(path, cmd)]
for path, cmd in walk(typer.main.get_command(app)):
    out = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"}).output
    for a in (p for p in cmd.params if isinstance(p, Argument)):
        assert a.help and out.count(a.help.rstrip(".")) == 1, (path, a.name, out)
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


def run(typer: str | None, click: str | None, venv: Path) -> str:
    """Install typer (at `typer`, its floor or the newest), rich at its floor and `click` into
    a fresh `venv`; the smoke's last line."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    low = floors()
    typer = low["typer"] if typer == "floor" else typer
    wanted = [f"typer=={typer}" if typer else "typer", f"rich=={low['rich']}", *BESIDE]
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
    for typer, click in PAIRS:
        with tempfile.TemporaryDirectory() as tmp:
            asked = f"{typer or 'newest'} / {click or 'newest'}"
            rows.append((asked, run(typer, click, Path(tmp) / "venv")))
            print(rows[-1])
    low = floors()
    lines = [
        "# The CLI at pyproject's floors and at the newest typer and click",
        "",
        f"`{head['command']}`, {head['date']}, {head['machine']}, commit {head['commit']};",
        f"declared floors: typer>={low['typer']}, rich>={low['rich']} (torch not installed).",
        "",
        "| typer / click asked | smoke (commands built, `profile list`, help pages, every "
        "argument described, a usage error) |",
        "|---|---|",
        *(f"| {c} | {r} |" for c, r in rows),
        "",
    ]
    (ROOT / "bench" / "results" / "floors.md").write_text("\n".join(lines))
    return 0 if all(not r.startswith("FAILED") for _, r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
