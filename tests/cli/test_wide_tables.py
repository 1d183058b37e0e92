"""A table whose every column matters (a partition's counts) never cuts a number at any width:
its columns wrap into blocks, the client column repeated; a cell wider than the whole width
folds onto more lines. Issue 34 item 4: `data partition` printed `13…`, `78…` at 80 columns,
the width a pipe gets."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from rich.console import Console

from edgefl.cli.wide_tables import Col, blocks

CLI = [
    sys.executable,
    "-c",
    "import sys; from edgefl.cli import main; sys.argv[0]='edgefl'; main()",
]


def show(width: int, *args: str) -> str:
    env = os.environ | {"COLUMNS": str(width), "LINES": "50", "TERM": "xterm"}
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def numbers_by_row(text: str) -> dict[int, list[int]]:
    """Every table row (all of its cells integers) -> its cells after the first, in the order
    the blocks print them."""
    out: dict[int, list[int]] = {}
    for line in text.splitlines():
        cells = line.replace("│", " ").split()
        if len(cells) > 1 and all(re.fullmatch(r"\d+", c) for c in cells):
            out.setdefault(int(cells[0]), []).extend(int(c) for c in cells[1:])
    return out


@pytest.mark.parametrize("width", [80, 40])
def test_partition_shows_every_count_whole(width):
    args = ("data", "partition", "--dataset", "mnist", "-k", "10")
    text = show(width, *args)
    assert "…" not in text, text
    for line in text.splitlines():
        assert len(line) <= width, f"{len(line)} > {width}: {line!r}"
    full = json.loads(show(200, *args, "--json"))
    want = {
        i: [*row, size]
        for i, (row, size) in enumerate(zip(full["counts"], full["sizes"], strict=True))
    }
    assert numbers_by_row(text) == want
    if width == 40:
        assert "continued:" in text and "blocks to fit 40 columns" in " ".join(text.split())


def test_partition_of_users_keeps_headers_and_users_whole():
    args = ("data", "partition", "--dataset", "hapt", "--partition", "user", "-k", "4")
    text = show(40, *args)
    assert "…" not in text and all(len(line) <= 40 for line in text.splitlines()), text
    full = json.loads(show(200, *args, "--json"))
    for name in full["class_names"]:  # a two-word header wraps at its blank, never cut
        for word in name.split():
            assert re.search(rf"\b{word}\b", text), (word, text)
    rows = numbers_by_row(text)
    repeats = text.count("continued:") + 1  # the user column is repeated in every block
    assert repeats > 1
    for i, (user, row, size) in enumerate(
        zip(full["users"], full["counts"], full["sizes"], strict=True)
    ):
        cells = rows[i]
        assert cells[0] == user and cells.count(user) >= repeats
        for _ in range(repeats):
            cells.remove(user)
        assert sorted(cells) == sorted([*row, size])


def render(table, width: int) -> str:
    console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(table)
    return console.export_text()


def test_blocks_one_table_when_it_fits_and_keys_repeat_when_not():
    cols = [Col("client", key=True), *(Col(f"c{j}") for j in range(8)), Col("total")]
    rows = [[str(i), *(str(10_000 + 1111 * j) for j in range(8)), "99999"] for i in range(3)]
    assert len(blocks(cols, rows, 200)) == 1
    tables = blocks(cols, rows, 30)
    assert len(tables) > 2
    for t in tables:
        text = render(t, 30)
        assert all(len(line) <= 30 for line in text.splitlines()), text
        assert "client" in text and "…" not in text
    assert numbers_by_row("\n".join(render(t, 30) for t in tables)) == {
        i: [int(c) for c in r[1:]] for i, r in enumerate(rows)
    }


@pytest.mark.parametrize("width", [12, 8])
def test_a_cell_wider_than_the_width_folds_and_keeps_every_digit(width):
    cols = [Col("client", key=True), Col("count")]
    rows = [["0", "123456789012"], ["1", "42"]]
    text = "".join(render(t, width) for t in blocks(cols, rows, width))
    assert "…" not in text
    assert all(len(line) <= width for line in text.splitlines()), text
    # the cell's lines, read top to bottom, give the number back whole
    body = text.split("─")[-1].splitlines()[1:]
    folded = "".join(line.split()[-1] for line in body[:-1])  # the last line is client 1's
    assert folded == "123456789012", text
