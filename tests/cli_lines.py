"""Command lines as people read them (README, docs, the demo's way on): do they parse?"""

from __future__ import annotations

import re
import shlex

import typer.main

from edgefl.cli import app

BASH = re.compile(r"```bash\n(.*?)```", re.S)


def parses(line: str) -> None:
    """`edgefl A B ARGS...` is a real command whose arguments parse (nothing is run). A
    method's own flags on `server fuse`/`simulate` are checked when the command runs, not here."""
    words = shlex.split(line)
    assert words[0] == "edgefl"
    command, i = typer.main.get_command(app), 1
    while hasattr(command, "commands") and i < len(words) and words[i] in command.commands:
        command, i = command.commands[words[i]], i + 1
    # A group left with words: the next one names no command of it (a typo like `servr`).
    assert not hasattr(command, "commands"), f"no such command in {line!r}: {words[i : i + 1]}"
    ctx = command.make_context(" ".join(words[:i]), words[i:], resilient_parsing=False)
    ctx.close()


def bash_lines(markdown: str) -> list[str]:
    """Every line of the page's bash blocks, continuations joined, comments cut, blanks dropped."""
    lines = (
        line.split(" #", 1)[0].strip()
        for block in BASH.findall(markdown)
        for line in block.replace("\\\n", " ").splitlines()
    )
    return [line for line in lines if line]


def edgefl_lines(markdown: str) -> list[str]:
    """Every `edgefl ...` command of the page's bash blocks."""
    return [line for line in bash_lines(markdown) if line.startswith("edgefl ")]


REPEATABLE = ("--fuse-opt", "--opt", "--search-opt", "--client-model")


def overridden(args: list[str], extra: list[str]) -> list[str]:
    """`args` with the `--flag value` pairs of `extra` in place of its own values of those flags
    (a repeatable flag is added to): the CLI refuses one flag given twice with two values."""
    replaced = {extra[i] for i in range(0, len(extra), 2) if extra[i] not in REPEATABLE}
    out, i = [], 0
    while i < len(args):
        name = args[i].partition("=")[0]
        if name in replaced:
            i += 1 if "=" in args[i] else 2
            continue
        out.append(args[i])
        i += 1
    return out + extra
