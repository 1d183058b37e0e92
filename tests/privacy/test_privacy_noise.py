"""DP-SGD's noise is secret on a device: drawn from the system's entropy unless a simulation
seeds it, and an upload whose noise came from a stated seed says so; the server recomputes its
epsilon but never counts it private under --max-epsilon (whoever knows the seed can replay the
noise and subtract it)."""

from __future__ import annotations

import numpy as np
import torch

from edgefl.client.privacy import privacy_record, spent
from edgefl.models.zoo import build_model, make_spec
from edgefl.privacy import DPConfig, plan_dp
from edgefl.training import TrainConfig, train


def _trained(noise_seed):
    torch.manual_seed(0)
    model = build_model(make_spec("mlp", (1, 4, 4), 3, hidden=[8]))
    rng = np.random.default_rng(0)
    x = rng.random((60, 1, 4, 4), dtype=np.float32)
    y = rng.integers(0, 3, 60)
    cfg = TrainConfig(
        epochs=1, batch_size=10, optimizer="sgd", lr=0.1, dp=DPConfig(8.0), noise_seed=noise_seed
    )
    train(model, "classifier", x, y, 3, cfg)
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_a_devices_noise_differs_run_to_run_and_a_seeded_one_repeats():
    assert not torch.equal(_trained(None), _trained(None))  # same seed, same data: secret noise
    assert torch.equal(_trained(7), _trained(7))


def test_a_seeded_record_is_spent_but_replayable():
    plan = plan_dp(DPConfig(8.0), 100, 10, 2).as_dict()
    labels = {"release": "absent"}
    secret = spent({"privacy": privacy_record(plan, labels)})
    seeded = spent({"privacy": privacy_record(plan, labels, seeded=True)})
    assert secret.epsilon == seeded.epsilon and abs(secret.epsilon - 8.0) < 0.08
    assert not secret.replayable and seeded.replayable and "stated seed" in seeded.why
    assert privacy_record(plan, labels)["noise"] == "secret"


def test_max_epsilon_sets_a_seeded_upload_aside_and_keeps_a_secret_one():
    from types import SimpleNamespace

    from edgefl.server.ingest import Ingest, privacy_screen

    plan = plan_dp(DPConfig(4.0), 100, 10, 2).as_dict()
    labels = {"release": "absent"}

    def upload(name, seeded):
        return SimpleNamespace(name=name, meta={"privacy": privacy_record(plan, labels, seeded)})

    found = Ingest(uploads=[upload("a.onnx", False), upload("b.onnx", True)])
    privacy_screen(found, 8.0)
    assert [u.name for u in found.uploads] == ["a.onnx"]
    assert found.rejected and found.rejected[0][0] == "b.onnx"
    assert "stated seed" in found.rejected[0][1]
    # without --max-epsilon both stay: a simulation's seeded record is consistent
    found = Ingest(uploads=[upload("a.onnx", False), upload("b.onnx", True)])
    privacy_screen(found, None)
    assert len(found.uploads) == 2 and not found.rejected
