"""edgefl's one-shot messages on Flower's real record types: what a reply must be before the
server takes any of it, and how a node finds its own job (issue 17)."""

from __future__ import annotations

import hashlib
import json
import stat
from dataclasses import asdict

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict  # noqa: E402

from edgefl.client.job import ClientJob, SimSettings  # noqa: E402
from edgefl.data.public import load_public  # noqa: E402
from edgefl.errors import ConfigError, EdgeflError  # noqa: E402
from edgefl.flower import wire  # noqa: E402
from edgefl.flower.client_app import answer, node_job  # noqa: E402
from edgefl.flower.collect import Collected  # noqa: E402
from edgefl.flower.server_app import DEFAULTS, _options, _public, land, serve  # noqa: E402

MB = 1 << 20


def test_a_reply_round_trips_with_its_hashes():
    files = {"upload": b"\x08\x01onnx bytes", "model": bytes(range(256)) * 10}
    got = wire.read_reply(wire.reply(files, {"client_id": "client-003", "n": 1}), MB)
    assert got.files == files and got.summary == {"client_id": "client-003", "n": 1}
    assert not got.skipped
    assert wire.read_reply(wire.reply({}, {}, skipped=True), MB).skipped


def test_the_servers_public_set_travels_exactly():
    x = np.random.default_rng(0).random((5, 1, 8, 8), dtype=np.float32)
    settings, got = wire.read_request(wire.request({"a": 1}, public=x))
    assert settings == {"a": 1} and got.dtype == np.float32 and np.array_equal(got, x)
    assert wire.read_request(wire.request({"a": 1}))[1] is None


def _forged(files: dict, sha: dict | str, summary="{}") -> RecordDict:
    arrays = {
        k: Array(dtype="uint8", shape=(len(v),), stype="raw", data=v) for k, v in files.items()
    }
    sha = sha if isinstance(sha, str) else json.dumps(sha)
    return RecordDict(
        {
            wire.FILES: ArrayRecord(arrays),
            wire.META: ConfigRecord({"sha256": sha, "summary": summary}),
        }
    )


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (RecordDict({}), "not an edgefl upload"),
        (
            _forged({"upload": b"abc"}, {"upload": _sha(b"abd")}),
            "does not match its declared SHA-256",
        ),
        (_forged({"upload": b"abc"}, {}), "each with a declared sha256"),
        (
            _forged({"../../etc/passwd": b"abc"}, {"../../etc/passwd": _sha(b"abc")}),
            "must be upload",
        ),
        (_forged({"upload": b"x" * (MB + 1)}, {"upload": _sha(b"x" * (MB + 1))}), "over the limit"),
        (_forged({"upload": b"abc"}, "not json"), "sha256 is not JSON"),
        (_forged({"upload": b"abc"}, {"upload": _sha(b"abc")}, "[1, 2]"), "must be JSON objects"),
        (_forged({"upload": b"abc"}, {"upload": _sha(b"abc")}, "x" * (2 * MB)), "over 1,048,576"),
    ],
)
def test_a_reply_is_refused_with_its_reason(content, why):
    with pytest.raises(wire.Refused, match=why.replace("(", r"\(")):
        wire.read_reply(content, MB)


def test_a_file_that_is_not_a_byte_vector_is_refused():
    arr = Array(dtype="float32", shape=(1,), stype="raw", data=b"\0\0\0\0")
    content = RecordDict(
        {
            wire.FILES: ArrayRecord({"upload": arr}),
            wire.META: ConfigRecord(
                {"sha256": json.dumps({"upload": _sha(b"\0" * 4)}), "summary": "{}"}
            ),
        }
    )
    with pytest.raises(wire.Refused, match="1-D uint8"):
        wire.read_reply(content, MB)


@pytest.mark.parametrize(
    ("text", "safe"),
    [
        ("client-007", "client-007"),
        ("../x", "node-5"),
        ("a/b", "node-5"),
        ("", "node-5"),
        ("\x1b[31mred", "node-5"),
        ("x" * 65, "node-5"),
        (3, "node-5"),
        (".hidden", "node-5"),
    ],
)
def test_a_node_never_chooses_the_path_its_upload_lands_on(text, safe):
    assert wire.safe_client_id(text, "node-5") == safe


def test_uploads_land_privately_under_safe_unique_names(tmp_path):
    got = Collected(
        replies={
            1: wire.Reply({"upload": b"a"}, {"client_id": "client-000"}),
            2: wire.Reply({"upload": b"b"}, {"client_id": "client-000"}),  # a clash
            3: wire.Reply({"upload": b"c"}, {"client_id": "../../evil"}),
            4: wire.Reply({}, {}, skipped=True),
        }
    )
    names = land(got, tmp_path)
    assert names == {1: "client-000.onnx", 2: "node-2.onnx", 3: "node-3.onnx"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names.values())
    assert (tmp_path / "node-3.onnx").read_bytes() == b"c"
    assert stat.S_IMODE((tmp_path / "node-2.onnx").stat().st_mode) == 0o600


def test_a_node_takes_the_job_it_is_sent_or_builds_it_from_its_config():
    sent = {"job": {"profile": "wristband", "client_index": 2, "num_clients": 3}}
    assert node_job(sent, {"partition-id": 0}).client_index == 2  # the job, not the node's id
    with pytest.raises(ConfigError, match="unknown client settings: evil"):
        node_job({"job": {"profile": "wristband", "evil": 1}}, {})
    shared = {"client": {"dataset": "digits", "num_clients": 4, "seed": 1}}
    job = node_job(shared, {"profile": "smartphone", "partition-id": 2, "data-dir": "/d"})
    assert (job.profile, job.client_index, job.num_clients, job.data_dir) == (
        "smartphone",
        2,
        4,
        "/d",
    )
    with pytest.raises(ConfigError, match="no device profile"):
        node_job(shared, {"partition-id": 0})
    with pytest.raises(ConfigError, match="unknown client settings: evil"):
        node_job({"client": {"evil": 1}}, {"profile": "wristband"})


def test_a_simulated_job_keeps_its_simulation_settings_and_a_deployed_node_refuses_them():
    cjob = ClientJob("wristband", sim=SimSettings("cpu", attack="flip", noise_seed=7))
    sent = json.loads(json.dumps({"job": asdict(cjob)}))  # as the engine's message carries it
    assert node_job(sent, {}) == cjob
    assert node_job({"job": {"profile": "wristband"}}, {}).sim == SimSettings()
    # a device's noise seed is its own: a server that set it could subtract the noise
    for sim in ({"noise_seed": 7}, {"attack": "flip"}):
        with pytest.raises(ConfigError, match="unknown client settings: sim"):
            node_job({"client": {"sim": sim}}, {"profile": "wristband"})
        # nor as a simulation's job: the node names its device, so it is deployed
        with pytest.raises(ConfigError, match="deployed SuperNode"):
            node_job({"job": {"profile": "wristband", "sim": sim}}, {"profile": "wristband"})
    with pytest.raises(ConfigError, match="unknown simulation settings: evil"):
        node_job({"job": {"profile": "wristband", "sim": {"evil": 1}}}, {})


def test_the_server_carves_the_public_set_its_clients_hold_out():
    # The clients partition --subset samples after holding the public set out of them; the
    # server must send (and FedDF distil on) that same set, not one carved from all of train.
    config = DEFAULTS | {
        "dataset": "digits",
        "public": "digits:public",
        "public-size": 100,
        "subset": 800,
        "partition": "iid",
        "seed": 3,
    }
    want = load_public("digits:public", public_size=100, seed=3, subset=800, partition="iid")
    assert np.array_equal(_public(config), want)
    assert not np.array_equal(want, load_public("digits:public", public_size=100, seed=3))
    assert _options("feddf", config) == {
        "public": "digits:public",
        "public_size": 100,
        "public_seed": 3,
        "public_subset": 800,
        "public_partition": "iid",
    }
    assert _options("fedavg", config) == {}


def test_a_devices_kept_model_never_travels(tmp_path):
    # A deployed predictions node that keeps its model (keep-model) uploads only its
    # predictions on the server's public set; the weights stay in its own folder.
    public = load_public("digits:public", public_size=100, seed=0)
    shared = {"client": {"dataset": "digits", "num_clients": 4, "public_size": 100, "epochs": 1}}
    job = node_job(
        shared,
        {
            "profile": "smartphone",
            "partition-id": 1,
            "model": "cnn",
            "kind": "predictions",
            "keep-model": str(tmp_path / "mine"),
        },
    )
    files, summary = answer(job, public, simulated=False)
    assert set(files) == {"upload"}
    assert (tmp_path / "mine" / "client-001.onnx").exists()
    assert summary["client_index"] == 1


class NoNodes:
    """A grid no node ever joins (a round must stop before it asks for any)."""

    def get_node_ids(self):
        return []


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"methods": "fedavg,fedmhoo"}, "fedmhoo"),
        ({"methods": "fedavg", "wait-nodes-s": 0.0}, "no SuperNode connected"),
        ({"methods": "fedavg", "resident-mib": -1}, "resident-mib must be >= 0"),
        # refused at the fusion, after every node had trained ("abc": a traceback)
        ({"methods": "fedavg", "max-epsilon": -1}, "run config max-epsilon must be > 0"),
        ({"methods": "fedavg", "max-epsilon": "abc"}, "max-epsilon must be a number"),
        # the server reads data-dir for eval and the public set only (it was passed over)
        ({"methods": "fedavg", "data-dir": "/d"}, "run config data-dir applies with eval or"),
        (
            {"methods": "fedavg", "data-dir": "/d", "eval": "./mine.npz:test"},
            "run config data-dir acts on a registered dataset only, and eval ./mine.npz:test",
        ),
        # what every node would refuse after the wait, or the server after the fusion: now
        # refused first, with the run config's keys (exploratory pass, 2026-12-06)
        ({"methods": "fedavg", "eval": "nope:test"}, "run config eval 'nope:test': unknown"),
        ({"methods": "fedavg", "dataset": "nope"}, "run config: unknown dataset 'nope'"),
        ({"methods": "fedavg", "epochs": -3}, "run config: epochs must be an integer >= 1"),
        ({"methods": "fedavg", "seed": "x"}, "run config: seed must be an integer"),
        ({"methods": "fedavg", "partition": "dirichlet:abc"}, "scheme 'dirichlet:abc' for part"),
        ({"methods": "fedavg", "deadline-s": -1}, "run config deadline-s must be > 0"),
        ({"methods": "fedavg", "max-upload-mib": 0}, "run config max-upload-mib must be > 0"),
        ({"methods": "fedavg", "device": "tpu"}, "run config device must be auto, cpu or cuda"),
        # with a registered dataset to read it, the round goes on to wait for nodes
        (
            {"methods": "fedavg", "data-dir": "/d", "eval": "mnist:test", "wait-nodes-s": 0.0},
            "no SuperNode connected",
        ),
    ],
)
def test_a_failed_round_says_why_in_the_out_dir_too(tmp_path, config, says):
    lines = []
    with pytest.raises(EdgeflError):
        serve(NoNodes(), config | {"out-dir": str(tmp_path / "g")}, log=lines.append)
    written = json.loads((tmp_path / "g" / "federation.json").read_text())
    assert says in written["error"] and written["hint"]
    assert any(says in line and line.startswith("edgefl: error:") for line in lines)


class TwoNodes:
    """A grid where two nodes joined and no more ever will (it cannot send a message)."""

    def get_node_ids(self):
        return [7, 3]


def test_require_nodes_refuses_a_round_short_of_min_nodes_before_any_training(tmp_path):
    lines = []
    config = {"methods": "fedavg", "min-nodes": 3, "wait-nodes-s": 0.0, "require-nodes": True}
    with pytest.raises(EdgeflError) as err:
        serve(TwoNodes(), config | {"out-dir": str(tmp_path / "g")}, log=lines.append)
    assert "only 2 of min-nodes=3 SuperNodes connected" in str(err.value)
    written = json.loads((tmp_path / "g" / "federation.json").read_text())
    assert "require-nodes" in written["error"] and "wait-nodes-s" in written["hint"]
    # TwoNodes has no messaging API: a round that went on to send the train message would
    # have failed with an AttributeError, not this refusal.


def test_a_short_round_is_said_and_run_without_require_nodes(monkeypatch):
    from edgefl.flower import server_app

    lines = []
    base = {"min-nodes": 3, "wait-nodes-s": 0.0}
    for flag in (False, "false"):
        nodes = server_app._enough_nodes(
            TwoNodes(), server_app.DEFAULTS | base | {"require-nodes": flag}, lines.append
        )
        assert nodes == [3, 7]
    assert any("warning: only 2 of min-nodes=3" in line for line in lines)
    with pytest.raises(EdgeflError, match="require-nodes must be true or false"):
        server_app._enough_nodes(
            NoNodes(), server_app.DEFAULTS | base | {"require-nodes": "maybe"}, lines.append
        )
    enough = server_app.DEFAULTS | {"min-nodes": 2, "require-nodes": True}
    assert server_app._enough_nodes(TwoNodes(), enough, lines.append) == [3, 7]


def test_the_apps_run_config_lists_every_setting_the_server_reads():
    from pathlib import Path

    import tomllib

    from edgefl.flower.server_app import DEFAULTS

    app = Path(__file__).resolve().parents[2] / "flower_app" / "pyproject.toml"
    config = tomllib.loads(app.read_text())["tool"]["flwr"]["app"]["config"]
    assert set(config) == set(DEFAULTS)


def test_a_simulations_jobs_are_dealt_to_its_nodes_one_at_a_time(monkeypatch):
    """Each job travels alone, once, and a node is sent its next job only after it answered;
    a job that fails is named by its position, and the others still run."""
    import flwr.app

    from edgefl.flower.collect import dispatch

    sent, held = [], {}  # every message; node -> the message id it has not answered yet

    class Meta:
        def __init__(self, mid):
            self.reply_to_message_id = mid

    class Reply:
        def __init__(self, mid, job):
            self.metadata = Meta(mid)
            self.content = wire.reply({"upload": b"x"}, {"client_id": f"c{job}"})
            self.fails = job == 3

        def has_error(self):
            return self.fails

        @property
        def error(self):
            return type("E", (), {"reason": "out of memory"})

    class Grid:
        def push_messages(self, msgs):
            out = []
            for m in msgs:
                assert m.dst not in held, "a node was sent a second job before it answered"
                sent.append(m)
                held[m.dst] = str(len(sent))
                out.append(str(len(sent)))
            return out

        def pull_messages(self, ids):
            node = min(held)  # one reply per poll, the lowest node first
            mid = held.pop(node)
            assert mid in ids
            return [Reply(mid, wire.read_request(sent[int(mid) - 1].content)[0]["job"])]

    class Message:  # outside a run, flwr's Message needs a run id: the content is what counts
        def __init__(self, content, dst_node_id, message_type):
            self.content, self.dst = content, dst_node_id

    monkeypatch.setattr(flwr.app, "Message", Message)
    logged = []
    got = dispatch(
        Grid(),
        [7, 8],
        [{"job": i} for i in range(5)],
        max_bytes=1 << 20,
        log=logged.append,
        progress=lambda *a: None,
    )
    assert sorted(wire.read_request(m.content)[0]["job"] for m in sent) == [0, 1, 2, 3, 4]
    assert {m.dst for m in sent} == {7, 8}
    assert sorted(got.replies) == [0, 1, 2, 4] and got.missing == []
    assert got.refused == {3: "the client failed: out of memory"}
    assert got.replies[4].summary == {"client_id": "c4"}
    assert any(line.startswith("job 3 on node") for line in logged)


def test_a_nodes_own_npz_dataset_passes_the_servers_checks(tmp_path):
    """The nodes read a .npz of their own: the server cannot look it up (review, 2026-12-06)."""
    from edgefl.flower.server_app import _checked

    config = DEFAULTS | {"dataset": "/data/phone.npz", "out-dir": str(tmp_path / "g")}
    methods, _, _ = _checked(config)
    assert methods
