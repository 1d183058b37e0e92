"""Text from an upload never moves the operator's cursor or starts a line of its own (issue 33):
each writer of consoles, logs and messages gets a file name holding a newline, a carriage
return, escape sequences and a C1 control, and must show them escaped. The program's own line
breaks stay; a line that begins with the forged text would pass for the server's own."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fed_fixtures import build_federation, copy_uploads
from rich.console import Console
from rich.table import Table

import exporters
from edgefl.cli.common import SafeConsole, upload_text
from edgefl.cli.progress import BarReporter
from edgefl.errors import FusionError
from edgefl.fusion import METHODS
from edgefl.progress import LineReporter
from edgefl.server.ingest import ingest
from edgefl.server.selection import select

HOSTILE = "up\nerror: forged\r\x1b[2K\x1b]0;t\x07\x85.onnx"
RAW = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # in a line: anything but a tab
EDGEFL = str(Path(sys.executable).parent / "edgefl")


def _clean(text: str) -> list[str]:
    """The lines of `text`: none holds a raw control character, none is the forged one."""
    lines = text.split("\n")
    for line in lines:
        assert not RAW.search(line), f"raw control character in {line!r}"
        assert not line.lstrip().startswith("error: forged"), f"forged line {line!r}"
    return lines


@pytest.fixture(scope="session")
def federation(tmp_path_factory):
    return build_federation(tmp_path_factory.mktemp("fed"))


def test_line_reporter():
    out = io.StringIO()
    rep = LineReporter(out, every=0.0)
    rep(f"ingest {HOSTILE}", 1, 1, note=HOSTILE)
    rep.message(f"screened out {HOSTILE}")
    assert len(_clean(out.getvalue())) == 3  # two lines and the end


def test_bar_reporter_and_its_messages():
    out = io.StringIO()
    bars = BarReporter(Console(file=out, force_terminal=False, width=300))
    with bars.bars:
        bars(f"ingest {HOSTILE}", 1, 2, note=HOSTILE)
        bars.message(f"robust {HOSTILE}: outputs repaired")
        bars(f"ingest {HOSTILE}", 2, 2, note=HOSTILE)
    assert "\\x0a" in out.getvalue()
    _clean(out.getvalue())


def test_safe_console_lines_and_tables():
    out = io.StringIO()
    con = SafeConsole(file=out, width=300, highlight=False)
    con.print(f"  [red]rejected[/] {upload_text(HOSTILE)}: not a valid ONNX file")
    table = Table("file", "reason")
    table.add_row(upload_text(HOSTILE), upload_text(f"quotes {HOSTILE}"))
    con.print(table)
    lines = _clean(out.getvalue())
    assert lines[0].startswith("  rejected up\\x0aerror: forged\\x0d\\x1b[2K"), lines[0]


def test_messages_of_ingest_and_select(tmp_path, federation):
    """The reasons ingest records (which quote graph names) and the lists a failing run
    prints: one line per upload."""
    up = tmp_path / "up"
    copy_uploads(federation, up, ["client-002.onnx"])
    (up / HOSTILE).write_bytes(b"not onnx")
    bad = exporters.read_artifact(federation / "client-000.onnx").model
    bad.graph.input[0].name = f"x{HOSTILE}"
    bad.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 10**9  # absurd: quoted
    (up / "quoting.onnx").write_bytes(bad.SerializeToString())
    found = ingest(up, max_upload_bytes=exporters.DEFAULT_MAX_UPLOAD_BYTES, jobs=1)
    reasons = dict(found.rejected)
    assert set(reasons) == {HOSTILE, "quoting.onnx"}  # the report names the file exactly
    assert "\\x0aerror: forged" in reasons["quoting.onnx"]
    for reason in reasons.values():
        _clean(reason)
    with pytest.raises(FusionError) as err:
        select(METHODS.get("fedavg"), found)
    lines = _clean(err.value.message)
    assert all(ln.startswith(("  rejected ", "  not used ")) for ln in lines[1:]), lines
    assert len(lines) == 4  # the sentence, two rejected, the decoder not used

    (up / "client-002.onnx").unlink()
    with pytest.raises(FusionError) as err:
        ingest(up, max_upload_bytes=exporters.DEFAULT_MAX_UPLOAD_BYTES, jobs=1)
    assert len(_clean(err.value.message)) == 1


def _fuse(up: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [EDGEFL, "server", "fuse", str(up), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )


@pytest.fixture(scope="module")
def hostile_dir(federation, tmp_path_factory):
    up = tmp_path_factory.mktemp("hostile") / "up"
    copy_uploads(federation, up, ["client-000.onnx"])
    (up / HOSTILE).write_bytes(b"not onnx")
    return up


def test_server_fuse_log_errors_and_json(hostile_dir, tmp_path):
    """The log lines on stderr (not a terminal: plain lines), the error of a run left with
    nothing to use, and --json (whose report keeps the name exactly)."""
    r = _fuse(hostile_dir, tmp_path / "g.onnx", "--method", "ensemble", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    _clean(r.stderr)
    assert [x["file"] for x in json.loads(r.stdout)["rejected"]] == [HOSTILE]
    r = _fuse(hostile_dir, tmp_path / "h.onnx", "--method", "fedcvae-ens")
    assert r.returncode == 2
    assert "rejected up\\x0aerror: forged" in r.stderr, r.stderr
    _clean(r.stderr)
    _clean(r.stdout)


def test_server_fuse_human_summary(hostile_dir, tmp_path):
    r = _fuse(hostile_dir, tmp_path / "g.onnx", "--method", "ensemble")
    assert r.returncode == 0, r.stderr[-3000:]
    _clean(r.stdout)


def test_emoji_codes_in_names_are_shown_as_written(cli, tmp_path, capsys):
    """rich turned ":rocket:" in any printed string into an emoji: a file "x:rocket:.onnx" was
    named as "x\U0001f680.onnx", a file that does not exist (and `--calibrate digits:train:`
    lost its text)."""
    from edgefl.cli.common import console

    bad = tmp_path / "x:rocket:.onnx"
    bad.write_text("not onnx")
    deploy = ["deploy", str(bad), "--profile", "smartphone", "--target", "onnx"]
    for args in (["eval", str(bad), "--dataset", "digits"], [*deploy, "--out", str(tmp_path)]):
        r = cli(*args)
        said = " ".join(r.output.split())
        assert r.exit_code == 2 and "x:rocket:.onnx" in said and "\U0001f680" not in said, said
        assert "fix:" in said, said
    table = Table("file")
    table.add_row(":fire:")
    console.print(":fire:", table)  # a line and a table cell, as every command prints them
    assert capsys.readouterr().out.count(":fire:") == 2


def _with_meta(src: Path, dst: Path, **changes) -> Path:
    """A copy of an upload whose edgefl metadata has `changes` (what a hostile client sends)."""
    import onnx

    model = onnx.load(src)
    prop = next(p for p in model.metadata_props if p.key == "edgefl")
    prop.value = json.dumps(json.loads(prop.value) | changes)
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, dst)
    return dst


def test_client_ids_and_class_names_from_uploads_are_data(federation, tmp_path, cli):
    """`server fuse` printed the used uploads' client ids raw (a newline in one forged a line of
    its own), and `eval` and `infer` drew a model's class names as markup (bold red, a link):
    the class names of an upload reach the global model."""
    up = tmp_path / "up"
    names = ["[bold red]ZERO[/]", *map(str, range(1, 9)), "[link=http://evil]9[/link]"]
    _with_meta(federation / "client-000.onnx", up / "a.onnx", client_id=HOSTILE)
    _with_meta(federation / "client-001.onnx", up / "b.onnx", class_names=names)
    _with_meta(federation / "client-002.onnx", up / "c.onnx")  # a decoder: names 0-9 win 2-1
    r = _fuse(up, tmp_path / "g.onnx", "--method", "ensemble")
    assert r.returncode == 0, r.stderr[-3000:]
    _clean(r.stdout)
    assert "used 1 upload(s): up\\x0aerror: forged" in r.stdout, r.stdout
    # Another task's names are refused (the majority names class 0 "0"), and shown as written.
    assert "rejected b.onnx: class 0 is named '[bold red]ZERO[/]', the majority's '0'" in r.stdout
    art = tmp_path / "named.onnx"
    _with_meta(federation / "client-001.onnx", art, class_names=names)
    said = cli("eval", str(art), "--dataset", "digits").output
    assert "[bold red]ZERO[/]" in said and "[link=http://evil]9[/link]" in said, said
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((2, 1, 8, 8), np.float32))
    said = cli("infer", str(art), "--input", str(x)).output
    assert any(f"0: {n} (p=" in said for n in names), said  # the name shown as written
