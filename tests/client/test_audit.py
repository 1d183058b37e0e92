"""`edgefl audit`: membership inference against real uploads, the members recovered from the
upload's own record (edgefl.client.audit), on digits."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgefl.client.audit import AuditSettings, choose_queries, open_target, run_audit
from edgefl.client.run import ClientJob, _local_data, run_client

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

COMMON = dict(profile="wristband", dataset="digits", num_clients=4, partition="dirichlet:0.5")
# An MLP trained 40 epochs on 540 MNIST digits: 100 % on them, ~84 % on others (digits' 8x8
# images are too easy to overfit: 60 epochs of scnn left the loss attack at AUC 0.54).
OVERFIT = dict(profile="wristband", dataset="mnist", num_clients=100, partition="iid")


@pytest.fixture(scope="module")
def uploads(tmp_path_factory):
    """An overfit classifier (many epochs on a small shard), a plain one trained under DP-SGD
    and a small decoder."""
    out = str(tmp_path_factory.mktemp("uploads"))
    overfit = run_client(
        ClientJob(**OVERFIT, out_dir=out, model="mlp", epochs=40, force=True, client_id="overfit")
    )
    dp = run_client(
        ClientJob(
            **COMMON,
            out_dir=out,
            client_index=1,
            model="scnn:width=8,bn=false",
            epochs=2,
            dp="8",
            label_counts="absent",
            client_id="dp",
        )
    )
    dec = run_client(
        ClientJob(**COMMON, out_dir=out, client_index=2, model="cvae-mlp:hidden=16", epochs=2)
    )
    int8 = run_client(
        ClientJob(
            **COMMON, out_dir=out, client_index=3, model="cvae-mlp:hidden=16", epochs=1,
            quantize="int8",
        )
    )  # fmt: skip
    return {"overfit": overfit.path, "dp": dp.path, "decoder": dec.path, "int8": int8.path}


def test_members_are_the_samples_the_client_trained_on(uploads):
    target = open_target(uploads["decoder"])
    _, _, _, train_idx, val_idx, _ = _local_data(ClientJob(**COMMON, client_index=2))
    assert np.array_equal(target.train_idx, train_idx)
    assert np.array_equal(target.val_idx, val_idx)
    q = choose_queries(target, AuditSettings(queries=50))
    assert 0 < len(q.members) <= 50 and set(q.members) <= set(train_idx.tolist())
    # population non-members: outside the shard, with the members' class counts
    assert not set(q.nonmembers) & set(target.shard.tolist())
    y = target.data.y
    assert np.array_equal(
        np.bincount(y[q.members], minlength=10), np.bincount(y[q.nonmembers], minlength=10)
    )
    assert not set(q.pool) & (set(q.members) | set(q.nonmembers))
    assert "left out" not in q.source, q.source
    # Every sample it trained on asked for: a class the client holds most of has fewer others,
    # and fewer members than asked are said, with why (it read "as many members as others").
    every = choose_queries(target, AuditSettings(queries=10_000))
    short = len(train_idx) - len(every.members)
    assert short > 0, "the shard holds no class mostly: the case is gone"
    assert f"; {short} member(s) of class" in every.source, every.source
    assert "each class is queried as often on both sides" in every.source, every.source
    held = choose_queries(target, AuditSettings(queries=50, nonmembers="held-out"))
    assert set(held.nonmembers) <= set(val_idx.tolist())


def test_an_overfit_classifier_is_caught(uploads, cli, tmp_path):
    report = tmp_path / "audit.json"
    res = cli(
        "audit", str(uploads["overfit"]), "--shadows", "2", "--out", str(report), "--json", "-q"
    )
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    assert json.loads(report.read_text()) == result
    (audited,) = result["uploads"]
    assert audited["kind"] == "classifier" and 0 < audited["members"] <= audited["trained_on"]
    rows = {r["attack"]: r for r in audited["attacks"]}
    assert set(rows) == {"loss threshold", "LiRA offline, 2 shadows"}
    loss = rows["loss threshold"]
    assert loss["auc_ci"][0] <= loss["auc"] <= loss["auc_ci"][1]
    # measured 0.62 [0.59, 0.66] (loss) and 0.68 [0.65, 0.71] (LiRA): members are told apart
    assert loss["auc_ci"][0] > 0.55
    assert rows["LiRA offline, 2 shadows"]["auc_ci"][0] > 0.55
    assert audited["accuracy"]["members"] > audited["accuracy"]["nonmembers"]
    assert "not differentially private as a whole" in audited["privacy"]


def test_decoder_and_dp_uploads_print_their_attacks(uploads, cli):
    res = cli(
        "audit", str(uploads["decoder"]), str(uploads["dp"]), "--shadows", "0", "--queries", "100",
        "--steps", "5", "--restarts", "1", "--draws", "50", "-q", "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    dec, dp = json.loads(res.stdout)["uploads"]
    assert [r["attack"] for r in dec["attacks"]] == [
        "reconstruction",
        "reconstruction (calibrated)",
        "sample distance",
        "sample distance (calibrated)",
    ]
    assert [r["attack"] for r in dp["attacks"]] == ["loss threshold"]
    assert dp["label_counts"] == "absent"
    assert "-DP by its record" in dp["privacy"]
    for row in dec["attacks"] + dp["attacks"]:
        assert 0 <= row["auc"] <= 1


def test_table_output(uploads, cli):
    res = cli(
        "audit", str(uploads["decoder"]), "--no-reference", "--steps", "3", "--restarts", "1",
        "--draws", "20",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "reconstruction" in text and "calibrated" not in text
    assert "AUC" in text and "label counts: exact" in text


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--shadows", "1"], "--shadows 2 or more"),
        (["--shadows", "-1"], "--shadows must be an integer >= 0, got -1"),
        (["--nonmembers", "others"], "--nonmembers"),
        (["--queries", "0"], "--queries"),
        (["--dataset", "fmnist"], "was trained on 'mnist', not on 'fmnist'"),
    ],
)
def test_refusals_come_before_any_work(uploads, cli, args, says):
    res = cli("audit", str(uploads["overfit"]), *args)
    assert res.exit_code == 2, res.output
    assert says in " ".join(res.output.split())
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    ("kind", "args", "says"),
    [
        ("overfit", ["--steps", "3"], "--steps applies with decoder uploads only"),
        ("overfit", ["--no-reference"], "--[no-]reference applies with decoder uploads only"),
        ("decoder", ["--shadows", "2"], "--shadows applies with classifier uploads only"),
    ],
)
def test_an_attacks_options_on_uploads_it_does_not_attack_are_refused(uploads, cli, kind, args,
                                                                       says):  # fmt: skip
    # They were passed over: the report of an audit with them equalled one without.
    res = cli("audit", str(uploads[kind]), *args)
    assert res.exit_code == 2 and says in " ".join(res.output.split()), res.output


def test_one_upload_named_twice_is_refused(uploads, cli):
    """It was audited twice, its attackers' models trained twice."""
    path = uploads["overfit"]
    res = cli("audit", str(path), str(path.parent / ".." / path.parent.name / path.name))
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and f"is the upload {path} again" in said, said


def test_missing_upload_and_foreign_out_are_refused(uploads, cli, tmp_path):
    res = cli("audit", str(tmp_path / "nope.onnx"))
    assert res.exit_code == 2 and "not found" in res.output
    for held in ('{"mine": 1}', '["edgefl_audit", "mine"]'):
        other = tmp_path / "notes.json"
        other.write_text(held)
        res = cli("audit", str(uploads["overfit"]), "--out", str(other))
        assert res.exit_code == 2 and "not an audit report" in " ".join(res.output.split())
        assert other.read_text() == held


def test_an_audit_of_other_uploads_is_replaced_only_with_overwrite(uploads, cli, tmp_path):
    """A rerun on the same uploads replaces its report; another audit's is kept unless
    --overwrite (it was replaced without a word)."""
    out, fast = tmp_path / "audit.json", ["--shadows", "0", "--queries", "40", "-q"]
    assert cli("audit", str(uploads["overfit"]), *fast, "--out", str(out)).exit_code == 0
    first = out.read_text()
    res = cli("audit", str(uploads["dp"]), *fast, "--out", str(out), "--json")
    assert res.exit_code == 2, res.output
    err = json.loads(res.stdout)
    assert "the audit of other uploads" in err["error"] and "--overwrite" in err["fix"]
    assert out.read_text() == first
    assert cli("audit", str(uploads["overfit"]), *fast, "--out", str(out)).exit_code == 0
    res = cli("audit", str(uploads["dp"]), *fast, "--out", str(out), "--overwrite")
    assert res.exit_code == 0, res.output
    (row,) = json.loads(out.read_text())["uploads"]
    assert row["upload"] == str(uploads["dp"])


def test_too_little_data_for_the_attackers_models_is_said_first(uploads, cli):
    # digits: 1,797 images; 1,000 non-members leave the shadows too few to train as it did
    res = cli("audit", str(uploads["decoder"]))
    assert res.exit_code == 2, res.output
    assert "lower --queries" in " ".join(res.output.split())


def test_run_audit_is_repeatable(uploads):
    target = open_target(uploads["dp"])
    settings = AuditSettings(queries=40, shadows=0)
    assert run_audit(target, settings)["attacks"] == run_audit(target, settings)["attacks"]


def test_an_int8_decoder_is_queried_through_onnxruntime(uploads, cli):
    res = cli("audit", str(uploads["int8"]), "--draws", "30", "--no-reference", "-q", "--json")
    assert res.exit_code == 0, res.output
    (audited,) = json.loads(res.stdout)["uploads"]
    assert [r["attack"] for r in audited["attacks"]] == ["sample distance"]
    assert "reconstruction" in audited["skipped"][0] and "int8" in audited["skipped"][0]


def test_a_hapt_users_uploads_against_other_peoples_windows(tmp_path, cli):
    """Sensor windows: a user partition's client, its decoder (trained on aligned windows) and
    its classifier (rotation jitter), audited against other users' windows."""
    hapt = dict(profile="smartphone", dataset="hapt", partition="user", num_clients=21, epochs=1)
    dec = run_client(ClientJob(**hapt, out_dir=str(tmp_path), model="cvae1d", client_id="dec"))
    clf = run_client(ClientJob(**hapt, out_dir=str(tmp_path), model="cnn1d", client_id="clf"))
    assert dec.metadata["training"]["windows"] == "aligned"
    args = ("--queries", "60", "--draws", "30", "--steps", "3", "--restarts", "1")
    res = cli("audit", str(dec.path), str(clf.path), *args, "--shadows", "0", "-q", "--json")
    assert res.exit_code == 0, res.output
    for audited in json.loads(res.stdout)["uploads"]:
        assert "other users' windows" in audited["nonmember_source"]
        assert audited["members"] == audited["nonmembers"] == 60
        assert all(0 <= r["auc"] <= 1 for r in audited["attacks"])


def test_hapt_windows_next_to_a_trained_one_are_no_non_members(tmp_path):
    job = ClientJob(
        profile="smartphone", dataset="hapt", partition="iid", num_clients=10, client_index=3,
        epochs=1, model="cnn1d", out_dir=str(tmp_path),
    )  # fmt: skip
    target = open_target(run_client(job).path)
    q = choose_queries(target, AuditSettings(queries=300))
    near = set((target.shard - 1).tolist()) | set((target.shard + 1).tolist())
    assert len(q.nonmembers) and not near & set(q.nonmembers.tolist())
    assert not near & set(q.pool.tolist())
    assert "neighbours share half their samples" in q.source


def test_shadows_of_a_prototypes_devices_model_spend_what_it_spent(tmp_path):
    """`client prototypes --dp 8` spends half on the prototypes: its kept model trained at 4."""
    from edgefl.client.audit import train_config

    job = ClientJob(
        **COMMON, model="scnn:width=8,bn=false", epochs=1, dp="8", kind="prototypes",
        out_dir=str(tmp_path / "up"), keep_model=str(tmp_path / "kept"),
    )  # fmt: skip
    run_client(job)
    (kept,) = (tmp_path / "kept").glob("*.onnx")
    cfg = train_config(open_target(kept), 0)
    assert cfg.dp.epsilon == pytest.approx(4.0)


def _with_record(src, dst, part: str, key: str, value):
    """A copy of upload `src` whose metadata's `part`.`key` says `value` (the weights intact)."""
    import onnx

    import exporters

    model = onnx.load(src)
    meta = exporters.get_metadata(model)
    meta[part][key] = value
    exporters.set_metadata(model, meta)
    onnx.save(model, dst)
    return dst


def test_damaged_folders_and_unreplayable_records_name_the_file_and_the_fix(uploads, cli, tmp_path):
    """The upload's own record is its word, not a flag: a value outside what `client train`
    accepts names the file (not --num-clients), a record that would train for hours is refused
    before any work, a folder is called one, a damaged file gets the fix line too."""
    src = uploads["overfit"]
    folder = tmp_path / "d.onnx"
    folder.mkdir()
    damaged = tmp_path / "cut.onnx"
    damaged.write_bytes(src.read_bytes()[:5000])
    cases = [
        (folder, "is a folder, not an upload"),
        (damaged, "is not a valid upload"),
        (_with_record(src, tmp_path / "n.onnx", "partition", "num_clients", 10**12), "cannot be replayed"),
        (_with_record(src, tmp_path / "e.onnx", "training", "epochs", 10**9), "sample passes"),
    ]  # fmt: skip
    for path, says in cases:
        res = cli("audit", str(path), "--queries", "50", "--shadows", "2")
        said = " ".join(res.output.split())
        assert res.exit_code == 2 and "Traceback" not in res.output, said
        assert says in said and str(path) in said, said
        assert "fix" in said, said
        assert "--num-clients" not in said


def test_ctrl_c_in_a_shadows_training_stops_the_audit(uploads, monkeypatch):
    """training.train returns on Ctrl-C (interrupted=True): the audit must not go on with a
    half-trained shadow and write a report of it."""
    import edgefl.training as training
    from edgefl.client.audit import recipe

    def interrupted(*args, **kwargs):
        def epoch(on_step=None):
            raise KeyboardInterrupt

        return epoch

    monkeypatch.setattr(training, "_epoch_step", interrupted)
    target = open_target(uploads["overfit"])
    x, y = target.data.x[target.train_idx], target.data.y[target.train_idx]
    with pytest.raises(KeyboardInterrupt):
        recipe(target)(x, y, 0)

    # SIGTERM (the CLI's KeyboardInterrupt subclass) is raised again as itself: the command
    # then says "terminated" and exits 143, not Ctrl-C's 130
    from edgefl.cli import Terminated

    def terminated(*args, **kwargs):
        def epoch(on_step=None):
            raise Terminated

        return epoch

    monkeypatch.setattr(training, "_epoch_step", terminated)
    with pytest.raises(Terminated):
        recipe(target)(x, y, 0)
