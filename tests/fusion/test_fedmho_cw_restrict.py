"""fedmho-cw's `restrict`: a class the classifiers hold most of, whose decoder draws their teacher
cannot read as that class (a DP decoder's noise for a class it saw a few times), is left out of
the distillation (its draws dropped, its logit out of the softmax) and its output bias set from
the kept draws afterwards, so w0's knowledge of it is neither trained away nor left to swell."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fed_fixtures import build_federation
from torch import nn

import exporters
from edgefl.fusion import METHODS, FusionContext, restrict
from edgefl.fusion.base import federation_label_counts
from edgefl.fusion.student import train_student
from edgefl.privacy import DPPlan
from edgefl.server.ingest import ingest

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def uploads(tmp_path_factory):
    fed = build_federation(tmp_path_factory.mktemp("fed"))
    return ingest(fed, max_upload_bytes=exporters.DEFAULT_MAX_UPLOAD_BYTES).uploads


def test_read_rates_per_class():
    teacher = torch.tensor([[5.0, 0, 0], [0, 5.0, 0], [5.0, 0, 0], [5.0, 0, 0]])
    y = torch.tensor([0, 0, 2, 2])
    assert restrict.read_rates(teacher, y, 4) == [0.5, None, 0.0, None]


def test_restriction_leaves_out_only_unread_classes_the_classifiers_hold():
    rates = [0.9, 0.1, 0.2, None, 0.3]
    share = torch.tensor([0.1, 0.1, 0.9, 0.0, 0.5])  # the decoders' share of each class
    # class 1: unread, the classifiers' class -> out; class 2: the decoders' own evidence;
    # class 4: the decoders hold half, not under it; class 3: no draws.
    assert restrict.restriction(rates, share, 0.5) == [1]
    assert restrict.restriction(rates, share, 0.0) == []
    # Fewer than two classes would stay: nothing is left out.
    assert restrict.restriction([0.1, 0.2, 0.9], torch.zeros(3), 0.5) == []


def test_a_left_out_class_keeps_its_output_row():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    before = model[1].weight.detach().clone()
    x, y = torch.randn(64, 1, 4, 4), torch.randint(0, 2, (64,))
    bias = torch.tensor([0.0, 0.0, -1e4])
    teacher = torch.randn(64, 3) + bias
    train_student(
        model, x, y, epochs=3, lr=0.05, batch_size=16, seed=0, device=CPU, teacher=teacher,
        lam=0.5, logit_bias=bias,
    )  # fmt: skip
    after = model[1].weight.detach()
    assert torch.equal(after[2], before[2])  # no sample pushed class 2's logit
    assert not torch.equal(after[:2], before[:2])
    assert torch.isfinite(after).all()


def test_calibration_bounds_how_often_kept_draws_rank_a_left_out_class_first():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 4))
    with torch.no_grad():
        model[1].bias[3] += 10.0  # class 3 first on every draw
    x = torch.randn(2000, 1, 4, 4)
    restrict.calibrate_left_out(model, x, [3], CPU)
    with torch.no_grad():
        top = model(x).argmax(1)
    assert 0 < float((top == 3).float().mean()) <= 0.011
    assert set(top.tolist()) >= {0, 1, 2}


def test_below_noise_bounds_each_class_signal_by_the_dp_record():
    def band(counts, q=0.1, sigma=1.0, dp=True):
        plan = DPPlan(
            epsilon=8.0, delta=1e-5, clip=1.0, noise_multiplier=sigma, sample_rate=q, steps=100
        )
        record = {"dp_sgd": plan.as_dict()} if dp else {}
        return SimpleNamespace(label_counts=np.array(counts, float), meta={"privacy": record})

    # q n / sigma: class 0 at 50 and 5 -> above; class 1 at 5 and 9 -> below; class 2: none.
    low = restrict.below_noise([band([500, 50, 0]), band([50, 90, 0], q=0.2, sigma=2.0)], 3)
    assert low.tolist() == [False, True, True]
    # A band without DP holds what it declares; one withholding its counts, everything.
    assert restrict.below_noise([band([0, 50, 0]), band([5, 5, 1], dp=False)], 3).tolist() == [
        False,
        False,
        False,
    ]
    # A record that is not a DP-SGD plan is read as no DP (ingest rejects such records anyway).
    odd = SimpleNamespace(label_counts=np.array([0, 5, 1.0]), meta={"privacy": {"dp_sgd": {}}})
    assert restrict.below_noise([band([0, 0, 0]), odd], 3).tolist() == [True, False, False]
    withheld = SimpleNamespace(label_counts=np.array([]), meta={})
    assert not restrict.below_noise([band([0, 0, 5]), withheld], 3).any()


def test_fuse_leaves_out_what_the_rule_says_and_still_predicts_it(uploads):
    ctx = FusionContext(uploads, device=CPU, seed=0)
    method = METHODS.get("fedmho-cw")
    run = {}
    for mode in ("off", "always", "dp"):
        cfg = method.effective_config(
            {"synthetic": 400, "epochs": 2, "restrict": mode}, ctx.input_shape
        )
        run[mode] = method.fuse(ctx, cfg)
    off, on = run["off"].info, run["always"].info
    # No decoder here trained with DP: the default leaves nothing out, and trains as "off" does.
    assert off["classes_left_out"] == run["dp"].info["classes_left_out"] == []
    assert off["loss_history"] == run["dp"].info["loss_history"]
    rates = on["teacher_label_agreement_per_class"]
    assert rates == off["teacher_label_agreement_per_class"]
    decoders = [u for u in uploads if u.kind == "decoder"]
    classifiers = [u for u in uploads if u.kind == "classifier"]
    share = restrict.evidence_share(decoders, classifiers, ctx.num_classes)
    left = restrict.restriction(rates, share, restrict.READ_FLOOR)
    assert left and on["classes_left_out"] == left
    assert all(on["synthetic_per_class"][c] == 0 for c in left)
    assert federation_label_counts(classifiers, ctx.num_classes)[left].min() > 0
    # The left-out classes are still predicted on real digits (the bias was set, not left dead).
    from edgefl.data import load_dataset

    test = load_dataset("digits", "test")
    with torch.no_grad():
        top = run["always"].model(torch.from_numpy(np.asarray(test.x, dtype=np.float32))).argmax(1)
    assert any(int((top == c).sum()) > 0 for c in left)


def test_output_bias_is_the_last_linear_of_the_class_width():
    assert restrict.output_bias(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3)), 3).shape == (3,)
    assert restrict.output_bias(nn.Sequential(nn.Linear(4, 3, bias=False)), 3) is None
    assert restrict.output_bias(nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 5)), 3) is None


def test_dp_mode_follows_the_decoders_dp_records(uploads, monkeypatch):
    ctx = FusionContext(uploads, device=CPU, seed=0)
    method = METHODS.get("fedmho-cw")

    def left(mode):
        opts = {"synthetic": 400, "epochs": 1, "restrict": mode}
        return method.fuse(ctx, method.effective_config(opts, ctx.input_shape)).info[
            "classes_left_out"
        ]

    anyway = left("always")
    assert anyway and left("dp") == []  # no decoder here trained with DP
    # Every decoder's record: DP-SGD at a sampling rate that puts every class under the noise.
    monkeypatch.setattr(restrict, "_dp_rate_and_noise", lambda record: (1e-6, 1.0))
    assert left("dp") == anyway
