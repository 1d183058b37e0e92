"""Command lines as people read them (README, docs, the demo's way on): do they parse?"""

from __future__ import annotations

import re
import shlex

import typer.main

from edgefl.cli import app

BASH = re.compile(r"```bash\n(.*?)```", re.S)


def parses(line: str) -> None:
    """`edgefl A B ARGS...` is a real command whose arguments parse (nothing is run)."""
    words = shlex.split(line)
    assert words[0] == "edgefl"
    command, i = typer.main.get_command(app), 1
    while hasattr(command, "commands") and words[i] in command.commands:
        command, i = command.commands[words[i]], i + 1
    ctx = command.make_context(" ".join(words[:i]), words[i:], resilient_parsing=False)
    ctx.close()


def edgefl_lines(markdown: str) -> list[str]:
    """Every `edgefl ...` command of the page's bash blocks, continuations joined, comments cut."""
    out = []
    for block in BASH.findall(markdown):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("edgefl "):
                out.append(line)
    return out
