"""Subfolders of an upload folder (issue 34 item 5): phones in N/phones and bands in N/bands are
never skipped in silence. Without --recursive each folder is named, with the uploads it holds
and the fix; with --recursive they are read, each upload named by its path in the folder, and
the server's rules still hold: nothing followed through a symlink, the walk bounded."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from fed_fixtures import CLASSIFIERS, DECODERS, build_federation

import exporters
from edgefl.errors import FusionError
from edgefl.server.ingest import ingest

MAX = exporters.DEFAULT_MAX_UPLOAD_BYTES


@pytest.fixture(scope="session")
def federation(tmp_path_factory):
    return build_federation(tmp_path_factory.mktemp("fed"))


@pytest.fixture
def nested(federation, tmp_path):
    """N/phones: the classifiers; N/bands: the decoders; N itself holds no upload."""
    root = tmp_path / "N"
    for sub, names in (("phones", CLASSIFIERS), ("bands", DECODERS)):
        (root / sub).mkdir(parents=True)
        for name in names:
            shutil.copyfile(federation / f"{name}.onnx", root / sub / f"{name}.onnx")
    return root


def snapshot(root: Path) -> dict:
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in sorted(root.rglob("*"))
    }


def test_folders_are_named_with_their_uploads_and_the_fix(nested):
    with pytest.raises(FusionError) as exc:
        ingest(nested, max_upload_bytes=MAX)
    text = exc.value.message + " " + exc.value.hint
    for sub in ("phones/", "bands/"):
        assert f"folder {sub} not read" in text
    assert "it holds 2 .onnx file(s)" in text and "--recursive" in text
    assert "not an .onnx file" not in text


def test_recursive_reads_the_subfolders_with_the_folder_in_each_name(nested):
    before = snapshot(nested)
    found = ingest(nested, max_upload_bytes=MAX, recursive=True)
    names = sorted(u.name for u in found.uploads)
    assert names == sorted(
        [*(f"bands/{n}.onnx" for n in DECODERS), *(f"phones/{n}.onnx" for n in CLASSIFIERS)]
    )
    assert {u.kind for u in found.uploads} == {"classifier", "decoder"}
    assert found.folders == [] and found.rejected == []
    assert snapshot(nested) == before  # only read


def test_a_folder_and_an_upload_beside_it_are_both_reported(nested, federation):
    shutil.copyfile(federation / f"{CLASSIFIERS[0]}.onnx", nested / "top.onnx")
    found = ingest(nested, max_upload_bytes=MAX)
    assert [u.name for u in found.uploads] == ["top.onnx"]
    assert sorted(n for n, _ in found.folders) == ["bands/", "phones/"]
    assert all("--recursive" in why for _, why in found.folders)


def test_recursive_never_follows_a_symlinked_folder(nested, tmp_path, federation):
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copyfile(federation / f"{CLASSIFIERS[0]}.onnx", outside / "stolen.onnx")
    os.symlink(outside, nested / "link")
    found = ingest(nested, max_upload_bytes=MAX, recursive=True)
    assert all("stolen" not in u.name for u in found.uploads)
    assert any("'link'" in n and "symlink" in n for n in found.notes)


def test_the_walk_is_bounded_in_depth(nested, federation):
    deep = nested / "a" / "b" / "c" / "d" / "e"
    deep.mkdir(parents=True)
    shutil.copyfile(federation / f"{CLASSIFIERS[0]}.onnx", deep / "deep.onnx")
    found = ingest(nested, max_upload_bytes=MAX, recursive=True)
    assert all("deep" not in u.name for u in found.uploads)
    assert [n for n, _ in found.folders] == ["a/b/c/d/e/"]
    assert "deeper than" in found.folders[0][1]


def test_same_client_id_in_two_folders_is_refused_as_a_duplicate(nested):
    shutil.copytree(nested / "phones", nested / "phones2")
    found = ingest(nested, max_upload_bytes=MAX, recursive=True)
    assert sum("duplicate client id" in r for _, r in found.rejected) == len(CLASSIFIERS)


def test_server_fuse_names_the_folders_then_reads_them_with_recursive(nested, tmp_path, cli):
    out = tmp_path / "g.onnx"
    r = cli("server", "fuse", str(nested), "--method", "fedavg", "--out", str(out))
    assert r.exit_code == 2 and not out.exists()
    text = " ".join(r.output.split())
    assert "phones/" in text and "bands/" in text and "--recursive" in text
    r = cli(
        "server",
        "fuse",
        str(nested),
        "--method",
        "fedavg",
        "--recursive",
        "--out",
        str(out),
        "--json",
    )
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout[r.stdout.index("{") :])
    files = {a["client_id"]: a["file"] for a in report["accepted"]}
    assert sorted(files[c] for c in report["used"]) == [f"phones/{n}.onnx" for n in CLASSIFIERS]
    assert sorted(files.values()) == sorted(
        [*(f"bands/{n}.onnx" for n in DECODERS), *(f"phones/{n}.onnx" for n in CLASSIFIERS)]
    )


def test_a_method_short_of_a_kind_names_the_folder_that_holds_it(nested, tmp_path, cli):
    """The issue's case: "fedmho needs at least 1 decoder upload(s), got 0" said nothing of
    the decoders one level down."""
    for f in (nested / "phones").iterdir():
        f.rename(nested / f.name)
    (nested / "phones").rmdir()
    out = tmp_path / "g.onnx"
    r = cli("server", "fuse", str(nested), "--method", "fedmho", "--out", str(out))
    assert r.exit_code == 2 and not out.exists()
    text = " ".join(r.output.split())
    assert "decoder" in text and "not read folder bands/" in text
    assert "it holds 2 .onnx file(s)" in text and "--recursive" in text
