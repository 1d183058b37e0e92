"""A parameter average over a federation of two architectures (issue 33): FedAvg and FedMHO's w0
average the largest group of one architecture and set the others aside by name, with the
reason, in the report, the human summary and `--json`; only a federation with nothing left to
average is refused. Before, the whole method was refused ("needs one architecture")."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fed_fixtures import DECODERS, build_federation, build_mixed_federation, copy_uploads

import exporters
from edgefl.errors import FusionError
from edgefl.fusion.averaging import average_classifiers, average_scope, one_architecture
from edgefl.models.parse import parse_model_arg
from edgefl.server.fuse import FuseJob, run_fuse
from edgefl.server.ingest import ingest

SMALL = {"synthetic": 100, "epochs": 1}
CNN, SCNN = "client-000.onnx", "client-scnn.onnx"


@pytest.fixture(scope="module")
def two_archs(tmp_path_factory):
    """client-000 and client-001 (cnn), client-scnn (scnn:width=4) and the two decoders."""
    root = tmp_path_factory.mktemp("archs")
    main, mixed = build_federation(root), build_mixed_federation(root)
    out = copy_uploads(
        main, root / "two", ["client-000.onnx", "client-001.onnx", *(f"{d}.onnx" for d in DECODERS)]
    )
    copy_uploads(mixed, out, [SCNN])
    return out


def fake(name: str, model: str, samples: int, module=True):
    spec = parse_model_arg(model, (1, 8, 8), 10)
    return SimpleNamespace(
        name=name,
        spec=spec,
        module=object() if module else None,
        rebuilt=module,
        forward_only=None if module else "int8 weights (QDQ)",
        label_counts=np.array([samples]),
    )


def test_the_largest_group_is_averaged_and_the_others_set_aside_with_the_reason():
    ups = [
        fake("a", "scnn:width=4", 10),
        fake("b", "cnn", 10),
        fake("c", "cnn", 10),
        fake("q", "cnn", 10, module=False),
    ]
    kept, left = one_architecture(ups, "fedavg")
    assert [u.name for u in kept] == ["b", "c"]
    assert [u.name for u, _ in left] == ["a", "q"]  # in upload order
    why = dict((u.name, r) for u, r in left)
    assert "architecture scnn" in why["a"] and "2 cnn classifier(s) fedavg averages" in why["a"]
    assert "int8 weights (QDQ)" in why["q"] and "rebuilt edgefl classifier" in why["q"]
    assert average_scope(kept, ups) == "2 of 4: cnn only"
    assert average_scope(kept, kept) is None


def test_a_tie_goes_to_the_group_with_more_samples_then_to_the_first():
    more = [fake("a", "scnn:width=4", 10), fake("b", "cnn", 11)]
    assert [u.name for u in one_architecture(more, "fedavg")[0]] == ["b"]
    even = [fake("a", "scnn:width=4", 10), fake("b", "cnn", 10)]
    assert [u.name for u in one_architecture(even, "fedavg")[0]] == ["a"]
    assert [u.name for u in one_architecture(even[::-1], "fedavg")[0]] == ["b"]


def test_nothing_to_average_is_refused_naming_every_classifier():
    ups = [fake("p", "cnn", 10, module=False), fake("q", "cnn", 10, module=False)]
    with pytest.raises(FusionError) as exc:
        one_architecture(ups, "fedavg")
    assert "\n  p: " in exc.value.message and "\n  q: " in exc.value.message
    # average_classifiers itself still averages one architecture only.
    with pytest.raises(FusionError, match="set these aside first"):
        average_classifiers([fake("a", "scnn:width=4", 1), fake("b", "cnn", 1)], "fedavg")


def test_fedavg_over_two_architectures_averages_the_larger_group(two_archs, tmp_path):
    out = tmp_path / "g.onnx"
    rep = run_fuse(FuseJob(uploads=str(two_archs), method="fedavg", out=str(out), device="cpu"))
    assert rep["used"] == ["client-000", "client-001"]
    assert rep["averaged"] == ["client-000", "client-001"]
    assert rep["scope"] == "2 of 3: cnn only"
    [aside] = rep["set_aside"]
    assert aside["file"] == SCNN and "architecture scnn(width=4) differs" in aside["reason"]
    assert aside in rep["skipped"]  # the one set-aside channel every method's uploads share
    on_disk = json.loads(out.with_suffix(".json").read_text())
    assert on_disk["set_aside"] == [aside] and on_disk["scope"] == rep["scope"]
    # The global model is the two cnn classifiers' average, and names only them.
    found = ingest(two_archs, max_upload_bytes=exporters.DEFAULT_MAX_UPLOAD_BYTES)
    cnns = [u for u in found.uploads if u.name in (CNN, "client-001.onnx")]
    _, want = average_classifiers(cnns, "fedavg")
    art = exporters.read_artifact(out)
    assert art.metadata["client_ids"] == ["client-000", "client-001"]
    assert art.metadata["dataset"] == "digits"  # the uploads' task: deploy suggests its data
    x = torch.rand(3, 1, 8, 8)
    np.testing.assert_allclose(art.run(x.numpy()), want.eval()(x).detach().numpy(), atol=1e-5)


@pytest.mark.parametrize("name", ["fedmho", "fedmho-md", "fedmho-cw"])
def test_fedmho_w0_averages_the_larger_group(two_archs, tmp_path, name):
    rep = run_fuse(
        FuseJob(
            uploads=str(two_archs),
            method=name,
            out=str(tmp_path / "g.onnx"),
            device="cpu",
            options=SMALL,
        )
    )
    assert rep["initialised_from"] == ["client-000", "client-001"]
    assert rep["scope"] == "w0 from 2 of 3: cnn only"
    if name == "fedmho":  # no teacher: the scnn upload is not used at all
        assert "client-scnn" not in rep["used"]
        assert [x["file"] for x in rep["set_aside"]] == [SCNN] and rep["partly_used"] == []
    else:  # MD and CW: it still teaches, only not in w0
        assert "client-scnn" in rep["used"] and rep["set_aside"] == []
        [part] = rep["partly_used"]
        assert part["file"] == SCNN and "still used as teachers" in part["reason"]


def test_cli_names_the_set_aside_upload_in_both_outputs(cli, two_archs, tmp_path):
    out = tmp_path / "g.onnx"
    r = cli(
        "server",
        "fuse",
        str(two_archs),
        "--method",
        "fedavg",
        "--out",
        str(out),
        "--device",
        "cpu",
        "--json",
    )
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["scope"] == "2 of 3: cnn only" and rep["set_aside"][0]["file"] == SCNN
    r = cli(
        "server", "fuse", str(two_archs), "--method", "fedavg", "--out", str(out), "--device", "cpu"
    )
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert f"skipped {SCNN}: fedavg averages parameters" not in text  # the real reason, not this
    assert f"skipped {SCNN}: architecture scnn(width=4) differs" in text
    assert "global model from 2 of 3: cnn only" in text
    assert "fedavg: 2 upload(s) used in the end, 1 set aside" in text  # the log, on stderr
    r = cli(
        "server",
        "fuse",
        str(two_archs),
        "--method",
        "fedavg,fedmho-md",
        "--out-dir",
        str(tmp_path / "d"),
        "--device",
        "cpu",
        "--opt",
        "fedmho-md:epochs=1",
        "--opt",
        "fedmho-md:synthetic=100",
    )
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert f"fedavg: set aside {SCNN}: architecture scnn(width=4) differs" in text
    assert f"fedmho-md: partly used {SCNN}:" in text


def test_a_simulate_row_of_a_partial_average_says_so_and_has_no_paper_number():
    from edgefl.simulate.render import accuracy_text

    row = {"method": "fedavg", "accuracy": 0.61, "scope": "5 of 10: vgg9 only"}
    assert accuracy_text(row) == "61.00 (5 of 10: vgg9 only)"
    assert accuracy_text(row | {"scope": None}) == "61.00"
