"""Issue 36: a method over its max_teachers is refused before the ingest, from what the files
declare (exporters.declared_kinds), with the words of the refusal after it, and exit code 2:
ingest's per-file validation (minutes for 10,000 uploads) never runs for it. At or under the
cap the run fuses as before; beside other methods, the refused one is reported and the rest
fuse (`server fuse` and simulate's batches alike)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from fed_fixtures import build_federation

import exporters
from edgefl.errors import FusionError
from edgefl.fusion import METHODS
from edgefl.fusion.caps import GROWS
from edgefl.server.fuse import FuseJob, run_fuse
from edgefl.server.plan import plan

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# dense in a second: what is checked here is who runs, not what it learns.
TINY = ["--epochs", "1", "--gen-steps", "2", "--batch-size", "16", "--nz", "8", "--ngf", "4"]


@pytest.fixture(scope="session")
def federation(tmp_path_factory):
    """Two classifiers (client-000/001) and two decoders."""
    return build_federation(tmp_path_factory.mktemp("fed"))


@pytest.fixture
def validated(monkeypatch) -> list[str]:
    """The files ingest's per-file validation is asked to check, in the order asked."""
    seen: list[str] = []
    real = exporters.folder.validate_upload

    def spy(path, **kw):
        seen.append(Path(path).name)
        return real(path, **kw)

    monkeypatch.setattr(exporters.folder, "validate_upload", spy)
    return seen


def _fuse(cli, federation, method: str, *args: str):
    return cli("server", "fuse", str(federation), "--method", method, *args, "--quiet")


def test_over_the_cap_is_refused_before_any_file_is_validated(cli, federation, tmp_path, validated):
    r = _fuse(
        cli,
        federation,
        "dense",
        "--out",
        str(tmp_path / "g.onnx"),
        "--opt",
        "max_teachers=1",
        *TINY,
    )
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "dense refuses 2 classifier uploads, more than its max_teachers (1): every " in text
    assert "generator step forwards every teacher" in text
    assert "--opt dense:max_teachers=2 runs it anyway" in text
    assert "--opt dense:committee=1 bounds its time (a random 1 teachers each step)" in text
    assert validated == []
    assert not (tmp_path / "g.onnx").exists()


def test_at_the_cap_it_fuses_as_before(cli, federation, tmp_path, validated):
    out = tmp_path / "g.onnx"
    r = _fuse(cli, federation, "dense", "--out", str(out), "--opt", "max_teachers=2", *TINY)
    assert r.exit_code == 0, r.output
    assert sorted(validated) == [f"client-00{i}.onnx" for i in range(4)]
    assert json.loads(out.with_suffix(".json").read_text())["used"] == [
        "client-000",
        "client-001",
    ]


def test_beside_other_methods_only_the_capped_one_is_refused(cli, federation, tmp_path, validated):
    r = _fuse(
        cli,
        federation,
        "dense,fedavg",
        "--out-dir",
        str(tmp_path / "g"),
        "--opt",
        "dense:max_teachers=1",
        "--json",
    )
    assert r.exit_code == 0, r.output
    reps = json.loads(r.stdout)
    assert reps["dense"]["error"].startswith("dense refuses 2 classifier uploads")
    assert reps["dense"]["used"] == [] and not (tmp_path / "g" / "dense.onnx").exists()
    assert reps["fedavg"]["used"] == ["client-000", "client-001"]
    assert "ingest_shared_by" not in reps["fedavg"]  # the ingest served fedavg alone
    assert len(validated) == 4  # once each


def test_every_method_over_its_cap_means_no_ingest_and_exit_2(cli, federation, tmp_path, validated):
    r = _fuse(
        cli,
        federation,
        "dense,pfedzkd",
        "--out-dir",
        str(tmp_path / "g"),
        "--opt",
        "max_teachers=1",
    )
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "pfedzkd refuses 2 classifier uploads" in text and "dense refuses 2" in text
    assert validated == []


@pytest.mark.parametrize("name", ["dense", "coboosting", "pfedzkd", "fedhydra"])
def test_the_refusal_before_the_ingest_is_the_one_after_it(federation, tmp_path, monkeypatch, name):
    """Counted before the ingest (Method.over_cap) or after it (the method's own
    FusionContext.require, reached here by hiding every declaration): the same words."""
    method = METHODS.get(name)
    cfg = method.make_config({"max_teachers": 1})
    early = method.over_cap(cfg, 2)
    assert method.over_cap(cfg, 1) is None
    assert method.over_cap(method.make_config({"max_teachers": 0}), 10**6) is None
    monkeypatch.setattr(exporters.peek, "peek_kind", lambda *a, **k: None)
    job = FuseJob(
        uploads=str(federation),
        method=name,
        out=str(tmp_path / "g.onnx"),
        options={"max_teachers": 1},
        device="cpu",
    )
    with pytest.raises(FusionError) as late:
        run_fuse(job)
    assert late.value.hint == early.hint
    # Every capped method says what grows with each teacher; the late message may add which
    # uploads it did not use.
    assert method.teacher_cost and not early.message.endswith(GROWS)
    assert late.value.message.startswith(early.message)


def test_methods_without_a_cap_are_never_refused_by_count():
    for method in METHODS:
        if "max_teachers" not in method.option_names():
            assert method.over_cap(method.make_config({}), 10**6) is None, method.name


def test_declarations_that_lie_still_meet_the_refusal_after_the_ingest(
    federation, tmp_path, monkeypatch, validated
):
    """A count before the ingest that misses a classifier (here: every file reads as
    undeclared) leaves the refusal to the fusion's own check, after the ingest, as before."""
    monkeypatch.setattr(exporters.peek, "peek_kind", lambda *a, **k: None)
    job = FuseJob(
        uploads=str(federation),
        method="dense",
        out=str(tmp_path / "g.onnx"),
        options={"max_teachers": 1},
        device="cpu",
    )
    with pytest.raises(FusionError, match="dense refuses 2 classifier uploads"):
        run_fuse(job)
    assert len(validated) == 4


def test_simulate_refuses_a_batch_method_before_its_ingest(federation, tmp_path, validated):
    from edgefl.simulate.run import _fuse_batch

    batch = [
        (name, plan(name, {"max_teachers": 1}, tmp_path / f"{name}.onnx", federation))
        for name in ("dense", "pfedzkd")
    ]
    job = SimpleNamespace(device="cpu", dataset="digits", data_dir=None)
    lines: list[str] = []
    reports = _fuse_batch(job, batch, federation, lines.append, lambda *a, **k: None)
    assert set(reports) == {"dense", "pfedzkd"}
    assert reports["dense"]["error"].startswith("dense refuses 2 classifier uploads")
    assert "pfedzkd refused: pfedzkd refuses 2 classifier uploads" in lines[-1]
    assert validated == []


def _sim(out, methods, cap):
    from edgefl.simulate.job import SimJob

    return SimJob(
        dataset="digits",
        clients=4,
        mix="smartphone:2,wristband:2",  # two classifier clients, two decoder clients
        partition="dirichlet:1.0",
        out=str(out),
        paper_models=True,
        classifier_epochs=1,
        generator_epochs=1,
        methods=methods,
        fuse_options={"dense": {"max_teachers": cap}},
    )


def test_simulate_over_the_cap_alone_is_refused_before_any_client_trains(tmp_path):
    from edgefl.simulate.run import simulate

    with pytest.raises(FusionError, match="dense refuses 2 classifier uploads") as err:
        simulate(_sim(tmp_path / "run", ("dense",), 1))
    assert "--fuse-opt dense:max_teachers=2" in err.value.hint
    assert not (tmp_path / "run" / "uploads").exists()


def test_simulate_names_the_capped_method_before_training_the_rest_runs(tmp_path):
    from edgefl.simulate.run import check_caps, refused_by_plan

    job = _sim(tmp_path / "run", ("fedavg", "dense", "fedmho"), 1)
    assert set(refused_by_plan(job)) == {"dense"}
    lines: list[str] = []
    check_caps(job, lines.append)
    (line,) = lines
    assert line.startswith(
        "dense will be refused: dense refuses 2 classifier uploads, more than its "
        f"max_teachers (1): {METHODS.get('dense').teacher_cost} (at least 300 generator steps"
    )
    assert refused_by_plan(_sim(tmp_path / "at", ("dense",), 2)) == {}
    # Only decoder clients: nothing to count against the cap.
    bands = _sim(tmp_path / "bands", ("dense",), 1)
    assert refused_by_plan(SimpleNamespace(**(vars(bands) | {"mix": "wristband:4"}))) == {}


def test_simulate_says_the_early_refusal_before_the_ingest_and_once(federation, tmp_path):
    from edgefl.simulate.run import _fuse_batch

    batch = [
        (name, plan(name, opts, tmp_path / f"{name}.onnx", federation))
        for name, opts in (("dense", {"max_teachers": 1}), ("fedavg", {}))
    ]
    job = SimpleNamespace(device="cpu", dataset="digits", data_dir=None)
    lines: list[str] = []
    reports = _fuse_batch(job, batch, federation, lines.append, lambda *a, **k: None)
    assert reports["dense"]["error"].startswith("dense refuses 2 classifier uploads")
    assert reports["fedavg"]["used"] == ["client-000", "client-001"]
    refused = [i for i, line in enumerate(lines) if line.startswith("dense refused")]
    ingest = [i for i, line in enumerate(lines) if line.startswith("ingesting")]
    assert len(refused) == 1 and len(ingest) == 1 and refused[0] < ingest[0], lines


def test_a_generator_methods_refusal_says_how_long_it_would_take():
    """The time is the least its generator steps take (epochs x gen_steps through every
    teacher at the measured rate), growing with the teachers and the batch; pFedZKD has no
    generator steps and says none."""
    dense = METHODS.get("dense")
    cfg = dense.make_config({})
    text = dense.over_cap(cfg, 2000).message
    assert f"at least {cfg.epochs * cfg.gen_steps} generator steps through each" in text
    assert "about 4.2 hours or more on 2 CPUs" in text  # 300 steps x 2,000 x 25.4 ms
    assert "about 2.1 hours" in dense.over_cap(cfg, 1000).message
    wide = dense.make_config({"batch_size": 128})
    assert "about 4.2 hours" in dense.over_cap(wide, 1000).message
    pfedzkd = METHODS.get("pfedzkd")
    assert "generator steps" not in pfedzkd.over_cap(pfedzkd.make_config({}), 2000).message
    assert "about 2 minutes" in dense.over_cap(dense.make_config({"max_teachers": 1}), 16).message
    assert "about a minute" in dense.over_cap(dense.make_config({"max_teachers": 1}), 2).message


def test_a_committee_lifts_the_cap_on_uploads_and_forwards_that_many_a_step(
    cli, federation, tmp_path, monkeypatch
):
    """DENSE with committee=1 over a cap of 1 takes both classifiers, and each generator step
    forwards one teacher (a different draw per step, from the run's seed)."""
    from edgefl.fusion import generator

    drawn: list[int] = []
    real = generator.committee

    def spy(teachers, size, rng):
        picked = real(teachers, size, rng)
        drawn.append(len(picked))
        return picked

    monkeypatch.setattr("edgefl.fusion.dense.committee", spy)
    out = tmp_path / "g.onnx"
    opts = ["--opt", "max_teachers=1", "--opt", "committee=1"]
    r = _fuse(cli, federation, "dense", "--out", str(out), *opts, *TINY)
    assert r.exit_code == 0, r.output
    assert json.loads(out.with_suffix(".json").read_text())["used"] == [
        "client-000",
        "client-001",
    ]
    assert drawn == [1, 1]  # 1 epoch x 2 generator steps, one teacher each


def test_a_committee_larger_than_the_cap_is_refused_before_any_file(
    cli, federation, tmp_path, validated
):
    r = _fuse(
        cli,
        federation,
        "dense",
        "--out",
        str(tmp_path / "g.onnx"),
        "--opt",
        "max_teachers=1",
        "--opt",
        "committee=2",
    )
    assert r.exit_code == 2, r.output
    assert "--committee 2 is more than --max-teachers 1" in " ".join(r.output.split())
    assert validated == [] and "Traceback" not in r.output


def test_committee_draws_without_replacement_and_all_at_zero():
    import torch

    from edgefl.fusion.generator import committee

    teachers = [torch.nn.Identity() for _ in range(10)]
    rng = torch.Generator().manual_seed(0)
    state = rng.get_state()
    assert committee(teachers, 0, rng) is teachers and committee(teachers, 10, rng) is teachers
    assert torch.equal(rng.get_state(), state)  # nothing drawn: results without it unchanged
    draws = [committee(teachers, 3, rng) for _ in range(20)]
    assert all(len({id(t) for t in d}) == 3 for d in draws)
    assert len({tuple(id(t) for t in d) for d in draws}) > 1  # drawn anew each step
    again = torch.Generator().manual_seed(0)
    assert [committee(teachers, 3, again) for _ in range(20)] == draws  # by the seed
