"""pFedZKD's server (Multi-ZSKD): class similarity, Dirichlet soft targets, inversion that a
teacher recognises, and a deterministic fusion of two digits classifiers of different
architectures."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from edgefl.client.run import ClientJob, run_client
from edgefl.data import load_dataset
from edgefl.errors import ConfigError
from edgefl.fusion import METHODS
from edgefl.fusion.generator import BNStatLoss
from edgefl.fusion.options import effective
from edgefl.fusion.pfedzkd import (
    PFedZKDConfig,
    class_similarity,
    consensus,
    consensus_of,
    invert,
    labels_of,
    mixes_of,
    rebalance,
    soft_targets,
    soften,
)
from edgefl.models.zoo import make_spec
from edgefl.server.fuse import FuseJob, run_fuse
from edgefl.training import TrainConfig, init_model, train

SMALL = {"synthetic": 400, "inversion_steps": 100, "epochs": 15, "lr": 3e-3}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def teacher():
    """A digits classifier good enough to have classes worth inverting (~1 s)."""
    data = load_dataset("digits", "train")
    spec = make_spec("scnn", (1, 8, 8), 10, width=16)
    model = init_model(spec, 0)
    cfg = TrainConfig(epochs=8, batch_size=32, optimizer="adam", lr=3e-3, seed=0)
    train(model, "classifier", data.x, data.y, 10, cfg)
    model.zero_grad(set_to_none=True)
    return model.eval()


@pytest.fixture(scope="module")
def uploads(tmp_path_factory):
    """Two clients with different architectures: a scalable CNN and a nas-cnn."""
    out = tmp_path_factory.mktemp("uploads")
    for i, model in enumerate(["scnn:width=8", "nas-cnn"]):
        run_client(
            ClientJob(
                profile="smartwatch",
                dataset="digits",
                out_dir=str(out),
                num_clients=2,
                client_index=i,
                partition="dirichlet:1.0",
                model=model,
                epochs=8,
                force=True,
            )
        )
    return out


def test_class_similarity_is_a_clamped_cosine_matrix(teacher):
    sim = class_similarity(teacher.head, 1e-3)
    assert sim.shape == (10, 10)
    assert torch.allclose(sim.diagonal(), torch.ones(10), atol=1e-5)
    assert torch.allclose(sim, sim.T) and sim.min() >= 1e-3 and sim.max() <= 1


def test_soft_targets_are_distributions_and_small_beta_is_peaked(teacher):
    sim = class_similarity(teacher.head, 1e-3)
    rng = np.random.default_rng(0)
    sharp, smooth = soft_targets(sim, 3, 0.1, 200, rng), soft_targets(sim, 3, 1.0, 200, rng)
    for y in (sharp, smooth):
        assert y.shape == (200, 10) and torch.allclose(y.sum(1), torch.ones(200), atol=1e-5)
    assert sharp.max(1).values.mean() > smooth.max(1).values.mean()


def _peaked_targets(per_class: int):
    """per_class images of each digit, each with a peaked soft target on its class."""
    classes = torch.arange(10).repeat_interleave(per_class)
    targets = torch.full((len(classes), 10), 0.02)
    targets[torch.arange(len(classes)), classes] = 0.82
    return classes, targets


def test_inverted_images_are_classified_as_their_target_class(teacher):
    classes, targets = _peaked_targets(4)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    x = invert(
        teacher,
        targets,
        (1, 8, 8),
        steps=150,
        lr=0.1,
        tau=4.0,
        gen=torch.Generator().manual_seed(0),
        device=torch.device("cpu"),
    )
    assert x.shape == (40, 1, 8, 8) and x.min() >= 0 and x.max() <= 1
    with torch.no_grad():
        pred = teacher(x).argmax(1)
    assert (pred == classes).float().mean() >= 0.8
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    assert all(p.grad is None for p in teacher.parameters())  # only the images got gradients


def _bn_distance(model, x) -> float:
    stats = BNStatLoss([model])
    stats.recording = True
    with torch.no_grad():
        model(x)
    value = float(stats.value(torch.device("cpu")))
    stats.remove()
    return value


def test_the_batchnorm_prior_pulls_pseudo_images_to_the_teachers_statistics(teacher):
    data = load_dataset("digits", "train")
    spec = make_spec("scnn", (1, 8, 8), 10, width=16, bn=True)
    bn_teacher = init_model(spec, 0)
    cfg = TrainConfig(epochs=8, batch_size=32, optimizer="adam", lr=3e-3, seed=0)
    train(bn_teacher, "classifier", data.x, data.y, 10, cfg)
    bn_teacher.zero_grad(set_to_none=True)
    bn_teacher.eval()
    classes, targets = _peaked_targets(8)

    def images(model, bn):
        return invert(
            model, targets, (1, 8, 8), steps=150, lr=0.1, tau=4.0, bn=bn,
            gen=torch.Generator().manual_seed(0), device=torch.device("cpu"),
        )  # fmt: skip

    plain, pulled = images(bn_teacher, 0.0), images(bn_teacher, 10.0)
    real = torch.from_numpy(data.x[:80])
    assert _bn_distance(bn_teacher, pulled) < 0.5 * _bn_distance(bn_teacher, plain)
    assert _bn_distance(bn_teacher, real) < _bn_distance(bn_teacher, plain)
    with torch.no_grad():
        assert (bn_teacher(pulled).argmax(1) == classes).float().mean() >= 0.8
    # the teacher leaves as it came: no hooks; one without BatchNorm is inverted as without bn
    assert not any(m._forward_hooks for m in bn_teacher.modules())
    assert torch.equal(images(teacher, 10.0), images(teacher, 0.0))


def test_the_smoothness_prior_charges_only_roughness_past_its_free_level(teacher):
    """`smooth` weighs each image's roughness past `smooth_from`: with the free level far above
    any image the inversion is the plain one, bit for bit; at 0 the images come out smoother
    than without the prior; a free level between leaves them between."""
    from edgefl.fusion.inversion import roughness

    _, targets = _peaked_targets(4)

    def images(smooth, smooth_from=0.0):
        return invert(
            teacher, targets, (1, 8, 8), steps=100, lr=0.1, tau=4.0, smooth=smooth,
            smooth_from=smooth_from, gen=torch.Generator().manual_seed(0),
            device=torch.device("cpu"),
        )  # fmt: skip

    plain, free = images(0.0), images(1.0, smooth_from=1e9)
    assert torch.equal(plain, free)
    full, half = images(1.0), images(1.0, smooth_from=float(roughness(plain).mean()) / 2)
    r_plain, r_full, r_half = (float(roughness(x).mean()) for x in (plain, full, half))
    assert r_full < r_half < r_plain
    # held near its free level, not taken to the full prior's 0.3: Adam's momentum carries an
    # image ~20 % past the level once its charge stops (digits teacher, 100 steps: 8.2 of 10.4)
    assert r_half > float(roughness(plain).mean()) / 2 * 0.5
    fmnist = effective(PFedZKDConfig(), (1, 28, 28), "fmnist")
    assert fmnist.smooth_from == 49.24  # Fashion-MNIST's training images' mean roughness
    assert effective(PFedZKDConfig(), (1, 28, 28), "mnist").smooth_from == 0.0


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_fuses_heterogeneous_teachers_deterministically(uploads, tmp_path):
    before = {p.name: _digest(p) for p in uploads.iterdir()}
    reports = [
        run_fuse(
            FuseJob(
                uploads=str(uploads),
                method="pfedzkd",
                out=str(tmp_path / f"g{i}.onnx"),
                options=SMALL,
                device="cpu",
                eval="digits:test",
            )
        )
        for i in range(2)
    ]
    a, b = reports
    assert a["loss_history"] == b["loss_history"] and a["accuracy"] == b["accuracy"]
    assert a["accuracy"] > 0.35  # chance is 0.1; a tiny budget on purpose (~0.55)
    assert {u["model"].split("(")[0] for u in a["accepted"]} == {"scnn", "nas-cnn"}
    assert [t["images"] for t in a["teachers"]] == [200, 200]
    assert a["mixes"] == 400 and sum(a["synthetic_per_class"]) == 800
    assert json.loads(json.dumps(a["config"]))["betas"] == [0.1, 1.0]
    assert {p.name: _digest(p) for p in uploads.iterdir()} == before


def test_mixes_lie_between_two_pseudo_samples_and_the_teachers_label_them(teacher):
    x = torch.rand(50, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    labels = consensus([teacher], x, 4.0, "cpu")
    mixed = mixes_of(x, seed=0)
    both = consensus_of([teacher], [x, mixed], 4.0, "cpu")  # one pass over the teachers
    assert torch.equal(both[0], labels)
    xs, ys = torch.cat([x, mixed]), torch.cat(both)
    assert torch.equal(xs[:50], x) and torch.equal(ys[:50], labels)
    mixed, flat = xs[50:], x.flatten(1)
    for m in mixed.flatten(1):
        # Some pair (i, j) and lam in [0, 1] with m = lam * x_i + (1 - lam) * x_j.
        d = flat[:, None, :] - flat[None, :, :]  # x_i - x_j
        lam = ((m - flat[None, :, :]) * d).sum(-1) / (d * d).sum(-1).clamp_min(1e-12)
        fit = lam[:, :, None] * d + flat[None, :, :]
        best = (fit - m).norm(dim=-1).min()
        assert best < 1e-4
    assert torch.allclose(ys[50:], consensus([teacher], mixed, 4.0, "cpu"))
    assert torch.allclose(ys.sum(1), torch.ones(100))
    # Not one x repeated: the mixes are new points.
    assert (mixed[:, None] - x[None]).flatten(2).norm(dim=-1).min() > 1e-3


def _fixed(logits: list[float]) -> torch.nn.Module:
    """A teacher that gives every input the same logits."""
    head = torch.nn.Linear(1, len(logits))
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.tensor(logits))
    return head


def test_probability_labels_rank_as_the_teachers_probability_average():
    # Two teachers fairly sure of class 1 and one with huge logits for class 0: the mean of
    # their tau-4 outputs ranks class 0 first (near the logit average), their probabilities 1.
    teachers = [_fixed([40.0, 0, 0]), _fixed([0, 3.0, 0]), _fixed([0, 3.0, 0])]
    x = torch.zeros(5, 1)
    paper = labels_of(teachers, [x], PFedZKDConfig(), "cpu")[0]
    probs = labels_of(teachers, [x], PFedZKDConfig(labels="probabilities"), "cpu")[0]
    assert torch.equal(paper, consensus(teachers, x, 4.0, "cpu"))
    avg = torch.stack([torch.softmax(t(x), 1) for t in teachers]).mean(0)
    assert (paper.argmax(1) == 0).all() and (avg.argmax(1) == 1).all()
    assert torch.allclose(probs, soften(avg, 4.0)) and (probs.argmax(1) == 1).all()
    # softened as one teacher's: log-odds shrink by tau, so the labels are flatter than avg
    assert (
        torch.allclose(probs.sum(1), torch.ones(5))
        and (probs.max(1).values < avg.max(1).values).all()
    )
    assert torch.allclose(soften(avg, 1.0), avg)


def test_balance_divides_labels_by_their_class_mass_over_every_part():
    a = torch.tensor([[0.9, 0.1], [0.9, 0.1]])
    b = torch.tensor([[0.5, 0.5]])
    assert rebalance([a, b], 0.0) == [a, b]  # the paper's labels, untouched
    mass = torch.tensor([2.3, 0.7]) / 3  # over both parts: the mixes count too
    for power in (0.5, 1.0):
        out = rebalance([a, b], power)
        want = torch.cat([a, b]) / mass**power
        want = want / want.sum(1, keepdim=True)
        assert torch.allclose(torch.cat(out), want) and [len(y) for y in out] == [2, 1]
    # the even label now leans to the rarer class; one-hot labels stay what they were
    assert out[1][0, 1] > 0.7 and torch.equal(rebalance([torch.eye(2)], 1.0)[0], torch.eye(2))
    teachers = [_fixed([40.0, 0, 0]), _fixed([0, 3.0, 0])]
    x = torch.zeros(4, 1)
    plain = labels_of(teachers, [x], PFedZKDConfig(), "cpu")
    even = labels_of(teachers, [x], PFedZKDConfig(balance=1.0), "cpu")
    assert torch.allclose(even[0], rebalance(plain, 1.0)[0])


def test_without_mixes_the_student_learns_the_papers_set_alone(uploads, tmp_path):
    job = FuseJob(
        uploads=str(uploads),
        method="pfedzkd",
        out=str(tmp_path / "g.onnx"),
        options=SMALL | {"mix": False},
        device="cpu",
    )
    rep = run_fuse(job)
    assert rep["mixes"] == 0 and sum(rep["synthetic_per_class"]) == 400


def test_config_parses_betas_and_refuses_bad_values():
    from edgefl.fusion.layering import layer

    method = METHODS.get("pfedzkd")
    assert layer(["pfedzkd"], shared={"betas": "0.1,1.0"})["pfedzkd"]["betas"] == (0.1, 1.0)
    assert layer(["pfedzkd"], shared={"betas": "0.5x2"})["pfedzkd"]["betas"] == (0.5, 2.0)
    assert layer(["pfedzkd"], shared={"betas": "1"})["pfedzkd"]["betas"] == (1.0,)
    assert method.make_config({"betas": [0.1, 1]}).betas == (0.1, 1.0)  # as JSON gives it back
    with pytest.raises(ConfigError, match="--betas must be"):
        layer(["pfedzkd"], shared={"betas": "a,b"})
    for bad in (
        {"betas": "0.1,1.0"},  # text is typed by the layer, not by the config
        {"betas": [0.0]},
        {"betas": []},
        {"tau": 0},
        {"inversion_steps": 0},
        {"synthetic": 0},
        {"similarity_floor": 0},
        {"balance": 1.5},
        {"labels": "logits"},
    ):
        with pytest.raises(ConfigError):
            method.make_config(bad)
    with pytest.raises(ConfigError, match="no option"):
        method.make_config({"temperature": 4})
    assert PFedZKDConfig().tau == 4.0 and PFedZKDConfig().synthetic is None  # by input
    # twice the paper's count on images (measured), the paper's on windows and at its budget
    assert effective(PFedZKDConfig(), (1, 28, 28), "fmnist").synthetic == 8000
    assert effective(PFedZKDConfig(), (6, 1, 128), "hapt").synthetic == 4000
    assert method.make_config(method.budgets["paper"]).synthetic == 4000
    # labels evened half-way on images (measured), the paper's on windows and at its budget
    assert effective(PFedZKDConfig(), (1, 28, 28), "fmnist").balance == 0.5
    assert effective(PFedZKDConfig(), (6, 1, 128), "hapt").balance == 0.0
    assert method.make_config(method.budgets["paper"]).balance == 0.0
    assert effective(PFedZKDConfig(synthetic=500), (1, 28, 28)).synthetic == 500  # given stays


def test_several_teachers_are_inverted_against_their_mean_output(teacher):
    """One teacher in a list is the one-teacher inversion bit for bit; two different teachers'
    images are read as their targets by the two together, and both leave without hooks."""
    data = load_dataset("digits", "train")
    other = init_model(make_spec("scnn", (1, 8, 8), 10, width=8, bn=True), 1)
    train(other, "classifier", data.x, data.y, 10, TrainConfig(8, 32, "adam", 3e-3, seed=1))
    other.zero_grad(set_to_none=True)
    other.eval()
    classes, targets = _peaked_targets(4)

    def images(teachers, bn=0.0):
        return invert(
            teachers, targets, (1, 8, 8), steps=150, lr=0.1, tau=4.0, bn=bn,
            gen=torch.Generator().manual_seed(0), device=torch.device("cpu"),
        )  # fmt: skip

    assert torch.equal(images([teacher]), images(teacher))
    x = images([teacher, other], bn=10.0)
    with torch.no_grad():
        mean = (torch.softmax(teacher(x), 1) + torch.softmax(other(x), 1)) / 2
    assert (mean.argmax(1) == classes).float().mean() >= 0.8
    assert not any(m._forward_hooks for t in (teacher, other) for m in t.modules())


def test_joint_pseudo_images_are_part_of_the_synthetic_ones(uploads, tmp_path):
    def fuse(**opts):
        return run_fuse(
            FuseJob(
                uploads=str(uploads),
                method="pfedzkd",
                out=str(tmp_path / "g.onnx"),
                options=SMALL | opts,
                device="cpu",
                overwrite=True,
            )
        )

    rep = fuse(joint=100, mix=False)
    assert sum(t["images"] for t in rep["teachers"]) == 300  # 400 less the joint 100
    assert sum(rep["synthetic_per_class"]) == 400 and rep["config"]["joint"] == 100
    every = fuse(joint=400, mix=False, committee=1, max_teachers=2)  # a committee's per chunk
    assert [t["images"] for t in every["teachers"]] == [0, 0]
    assert sum(every["synthetic_per_class"]) == 400
    with pytest.raises(ConfigError, match="--joint 500 is more than --synthetic 400"):
        METHODS.get("pfedzkd").make_config({"synthetic": 400, "joint": 500})
