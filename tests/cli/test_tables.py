"""Every table and help page reads at 80 columns and at 200: no line wider than the terminal, no
cell cut to "…", and every name a user must type (models, profiles, methods, flags) in full."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from edgefl.fusion import METHODS
from edgefl.models.zoo import ZOO
from edgefl.profiles import list_profiles

CLI = [
    sys.executable,
    "-c",
    "import sys; from edgefl.cli import main; sys.argv[0]='edgefl'; main()",
]


def show(width: int, *args: str) -> str:
    env = os.environ | {"COLUMNS": str(width), "LINES": "50", "TERM": "xterm"}
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def readable(text: str, width: int) -> None:
    for line in text.splitlines():
        assert len(line) <= width, f"{len(line)} > {width}: {line!r}"
    assert "…" not in text, text


@pytest.mark.parametrize("width", [80])  # the narrow terminal is where a name could be cut
def test_name_tables_fit_and_keep_every_name(width):
    first_column = set()
    for dataset in ("mnist", "hapt"):  # image models, then the models of sensor windows
        models = show(width, "models", "--profile", "wristband", "--dataset", dataset)
        readable(models, width)
        # The legend reads out one of the table's own misfits (it was a made-up x1.04).
        flat = " ".join(models.split())
        legend = re.search(r"no: (\w+ x[\d.]+(?: \+\d+)?) = needs", flat)
        assert legend and flat.count(f"no: {legend.group(1)}") >= 2, flat
        cells = [line.replace("│", " ").split() for line in models.splitlines()]
        first_column |= {c[0].split("(")[0] for c in cells if c}
    assert {e.name for e in ZOO} <= first_column
    profiles = show(width, "profile", "list")
    readable(profiles, width)
    assert set(list_profiles()) <= set(profiles.replace("│", " ").split())
    methods = show(width, "server", "methods")
    readable(methods, width)
    assert set(METHODS.names()) <= set(methods.replace("│", " ").split())
    options = show(width, "server", "methods", "fedmho-cw")
    readable(options, width)
    flags = {o["flag"] for o in METHODS.get("fedmho-cw").options}
    assert flags <= set(options.replace("│", " ").split())


def test_narrow_tables_say_which_columns_they_left_out():
    assert "left out at 80 columns:" in " ".join(show(80, "models").split())
    assert "left out" not in show(200, "profile", "list")


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize(
    "command", [["simulate"], ["server", "fuse"], ["client", "train"], ["search"], ["reproduce"]]
)
def test_help_pages_keep_every_flag_and_default(width, command):
    text = show(width, *command, "--help")
    readable(text, width)
    assert "--partition" in text or command in (["server", "fuse"], ["reproduce"])
    if command == ["simulate"]:  # the defaults the rich help used to cut
        assert "smartphone:5,wristband:5" in text and "--max-classifier-macs" in text
