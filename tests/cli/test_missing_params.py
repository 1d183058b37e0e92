"""A required option or argument left out is one message with the fix, exit 2, for every one of
every command: click's "Missing option '--profile'" with usage text named no profile, and under
--json its fix was "see --help"."""

from __future__ import annotations

import json

import pytest
import typer.main
from typer.testing import CliRunner

from edgefl.cli import app
from edgefl.cli import click_compat as click
from edgefl.cli.missing import WANTED


def _commands(command, path=()):
    if not getattr(command, "commands", None):
        yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def _required():
    """(command path, the arguments that give every required parameter before it, it)."""
    for path, command in _commands(typer.main.get_command(app)):
        given: list[str] = []
        for param in command.params:
            if not param.required:
                continue
            yield path, list(given), param
            opt = max(param.opts, key=len) if isinstance(param, click.Option) else None
            given += [opt, "x"] if opt else ["x"]


REQUIRED = list(_required())


def test_the_required_parameters_are_all_found():
    names = {(" ".join(p), q.name) for p, _, q in REQUIRED}
    assert {("deploy", "model"), ("deploy", "out"), ("server fuse", "method")} <= names
    assert ("client train", "profile") in names and ("eval", "dataset") in names
    assert len(names) > 15


def _name(param):
    return (
        max(param.opts, key=len) if isinstance(param, click.Option) else param.human_readable_name
    )


@pytest.mark.parametrize(
    "path, given, param", REQUIRED, ids=[f"{' '.join(p)} {q.name}" for p, _, q in REQUIRED]
)
def test_each_missing_parameter_is_one_message_with_a_fix(path, given, param):
    r = CliRunner().invoke(app, [*path, *given], env={"COLUMNS": "200"})
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert f"error: {' '.join(path)} needs {_name(param)}: " in text, text
    assert "Missing option" not in text and "Missing argument" not in text, text
    assert "Usage:" not in text and "Traceback" not in text, text
    assert ": a value" not in text, f"{_name(param)} has no help to say what it takes"
    assert "fix: e.g. " in text or "fix: usage: edgefl " in text, text
    if param.name in WANTED and WANTED[param.name].names is not None:
        valid = WANTED[param.name].names()
        assert valid and all(v in text for v in valid), text  # the registry, read whole


@pytest.mark.parametrize(
    "args, says",
    [
        (["eval", "m.onnx"], ["mnist", "fmnist", "hapt"]),
        (["server", "fuse", "ups"], ["fedmho-md", "pfedzkd", "e.g. --method fedmho"]),
        (["deploy", "m.onnx", "--profile", "wristband"], ["ort-mobile", "tflite-micro"]),
    ],
)
def test_json_callers_get_the_valid_names_too(args, says):
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 2
    got = json.loads(r.stdout)
    assert set(got) == {"error", "fix"} and "needs --" in got["error"]
    assert all(s in got["fix"] for s in says), got
    assert "--help" not in got["fix"]


def test_other_usage_errors_still_come_from_click():
    r = CliRunner().invoke(app, ["eval", "m.onnx", "--dataset", "mnist", "--bogus"])
    assert r.exit_code == 2 and "No such option '--bogus'" in r.output


def test_every_wanted_entry_names_a_required_parameter():
    """A stale entry (a parameter renamed or made optional) would hint at nothing."""
    required = {q.name for _, _, q in REQUIRED}
    assert set(WANTED) <= required, set(WANTED) - required
