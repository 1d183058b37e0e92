"""The data-free methods (DENSE, FedHydra, pFedZKD's Multi-ZSKD, Co-Boosting) on sensor windows
as well as on images: each fuses a tiny HAPT federation of phone classifiers through the real
pipeline, deterministically, and the two mechanisms that broke on windows are checked directly
(bench/results/datafree_hapt.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from edgefl.client.run import ClientJob, run_client
from edgefl.fusion import METHODS
from edgefl.fusion.fedhydra import declared_skew, stratification_weights
from edgefl.fusion.inversion import invert
from edgefl.server.fuse import FuseJob, run_fuse

GEN = dict(epochs=2, gen_steps=3, batch_size=32, nz=16, ngf=4)
OPTS = {
    "dense": GEN,
    "fedhydra": GEN | {"strat_steps": 3, "strat_batch": 8, "max_gen_steps": 6},
    "pfedzkd": {"synthetic": 48, "inversion_steps": 5, "epochs": 2},
    "coboosting": GEN,
}
SHAPE = (3, 1, 128)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def phones(tmp_path_factory):
    """Two HAPT users' phones (a small cnn1d each, a few epochs on a subset: ~2 s)."""
    out = tmp_path_factory.mktemp("windows") / "uploads"
    for i in (0, 1):
        run_client(
            ClientJob(
                profile="smartphone",
                dataset="hapt",
                partition="user",
                num_clients=21,
                client_index=i,
                model="cnn1d:width=4",
                epochs=3,
                subset=2000,
                out_dir=str(out),
            )
        )
    return out


def _weights(path) -> list[np.ndarray]:
    import onnx
    from onnx import numpy_helper

    return [numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer]


@pytest.mark.parametrize("method", list(OPTS))
def test_fuses_a_window_federation_deterministically(phones, tmp_path, method):
    runs = []
    for run in ("a", "b"):
        out = tmp_path / run / "g.onnx"
        job = FuseJob(
            uploads=str(phones), method=method, out=str(out), options=OPTS[method], device="cpu"
        )
        run_fuse(job)
        runs.append(_weights(out))
    assert runs[0] and all(np.array_equal(a, b) for a, b in zip(*runs, strict=True))
    rep = json.loads((tmp_path / "a" / "g.json").read_text())
    assert rep["used"] == ["client-000", "client-001"]
    import exporters

    spec = exporters.read_artifact(tmp_path / "a" / "g.onnx").metadata["spec"]
    assert spec["name"] == "cnn1d"  # auto: the 1-D student on windows
    if method == "fedhydra":  # the run's own late agreement decides, not the input kind
        student, cfg = rep["student"], rep["config"]
        picked = student["late_agreement"] > cfg["pick_agreement"]
        assert student["kept"] == ("best held-out agreement" if picked else "weight average")


def test_class_weights_carry_no_prior_that_every_client_shares():
    """Every client inverts class 2 three times as easily (HAPT's "lying"): relative U_c weighs
    each client's classes equally; Eq. 6 on U would triple every client's class 2."""
    u = np.array([[1.0, 1.0], [1.0, 1.0], [3.0, 3.0]])
    _, u_c = stratification_weights(u)
    np.testing.assert_allclose(u_c, 1 / 3)
    _, literal = stratification_weights(u, relative=False)
    np.testing.assert_allclose(literal[:, 0], [0.2, 0.2, 0.6])
    # What differs between clients still counts: client 0 knows class 0 twice as well.
    _, u_c = stratification_weights(np.array([[2.0, 1.0], [1.0, 1.0]]))
    assert u_c[0, 0] > u_c[1, 0] and u_c[0, 1] < u_c[1, 1]


def test_inverted_windows_keep_only_the_variation_the_teacher_asks_for(phones):
    """From the images' start (N(0, I), Adam 0.1) a window comes out as white noise about
    +-1 g; the windows' start leaves it near the range's centre, like a real window."""
    from edgefl.server.ingest import ingest

    teacher = ingest(phones, max_upload_bytes=10**8).uploads[0].module
    targets = torch.eye(6).repeat_interleave(4, 0)
    gen = torch.Generator().manual_seed(0)

    def steps(init_std, lr):
        x = invert(
            teacher,
            targets,
            SHAPE,
            steps=30,
            lr=lr,
            tau=4.0,
            gen=gen,
            device=torch.device("cpu"),
            init_std=init_std,
        )
        return float(x.diff(dim=-1).abs().mean())

    on_images = METHODS.get("pfedzkd").effective_config({}, (1, 28, 28))
    assert (on_images.init_std, on_images.inversion_lr) == (1.0, 0.1)  # the paper's start
    on_windows = METHODS.get("pfedzkd").effective_config({}, SHAPE)
    # Real HAPT windows: mean step between samples 0.001 (still) to 0.02 (walking).
    assert steps(on_windows.init_std, on_windows.inversion_lr) < 0.06 and steps(1.0, 0.1) > 0.15


def test_roughness_counts_neighbours_along_every_spatial_axis_of_more_than_one():
    from edgefl.fusion.inversion import roughness

    window = torch.zeros(1, 3, 1, 4)
    window[0, 0, 0] = torch.tensor([0.0, 1.0, 1.0, 3.0])  # steps 1, 0, 2 along time
    assert roughness(window).tolist() == [5.0]  # the singleton middle axis adds nothing
    image = torch.zeros(1, 1, 2, 2)
    image[0, 0, 0, 0] = 1.0  # one step to the right, one down
    assert roughness(image).tolist() == [2.0]


def test_the_smoothness_prior_leaves_windows_as_smooth_as_real_ones(phones):
    """With the teacher's loss alone, neighbouring samples of an inverted window sit far apart
    (white noise); pFedZKD's default prior on windows brings them to a real window's scale
    (0.001-0.02) while the teacher's loss still falls. Images keep the paper's inversion."""
    from torch.nn import functional as F

    from edgefl.server.ingest import ingest

    teacher = ingest(phones, max_upload_bytes=10**8).uploads[0].module
    targets = torch.eye(6).repeat_interleave(4, 0)
    on_windows = METHODS.get("pfedzkd").effective_config({}, SHAPE)
    init_std, lr = on_windows.init_std, on_windows.inversion_lr

    def invert_with(smooth, steps=100):
        gen = torch.Generator().manual_seed(0)
        return invert(
            teacher,
            targets,
            SHAPE,
            steps=steps,
            lr=lr,
            tau=4.0,
            gen=gen,
            device=torch.device("cpu"),
            init_std=init_std,
            smooth=smooth,
        )

    def ce(x):
        with torch.no_grad():
            return float(-(targets * F.log_softmax(teacher(x) / 4.0, dim=1)).sum(1).mean())

    assert METHODS.get("pfedzkd").effective_config({}, (1, 28, 28)).smooth == 0.0
    start, rough, smooth = (
        invert_with(0.0, steps=0),
        invert_with(0.0),
        invert_with(on_windows.smooth),
    )
    step = lambda x: float(x.diff(dim=-1).abs().mean())  # noqa: E731
    assert step(smooth) < 0.02 < step(rough)
    assert ce(smooth) < ce(start)


@pytest.mark.parametrize("min_skew", [0.1, 0.0])
def test_fedhydra_stratifies_only_clients_whose_labels_differ(phones, tmp_path, min_skew):
    """Two HAPT users hold every activity in about the same proportions (their declared label
    counts' Cramer's V is under 0.1): FedHydra weighs them alike instead of stratifying, and
    says so; min_label_skew=0 (the paper's budget) stratifies them anyway."""
    import exporters

    counts = [exporters.peek_metadata(p)["label_counts"] for p in sorted(phones.glob("*.onnx"))]
    assert len(counts) == 2 and all(min(c) > 0 for c in counts)
    out = tmp_path / "g.onnx"
    opts = OPTS["fedhydra"] | {"min_label_skew": min_skew}
    run_fuse(FuseJob(uploads=str(phones), method="fedhydra", out=str(out), options=opts))
    strat = json.loads(out.with_suffix(".json").read_text())["stratification"]
    assert strat["label_skew"] < 0.1
    if min_skew:
        assert strat["U"] is None
        np.testing.assert_allclose(strat["U_r"], 0.5)  # 2 clients, alike for every class
        np.testing.assert_allclose(strat["U_c"], 1 / 6)
    else:
        assert np.array(strat["U"]).shape == (6, 2)
        assert not np.allclose(strat["U_r"], 0.5)


def test_an_upload_without_label_counts_is_stratified():
    class Up:
        def __init__(self, counts):
            self.label_counts = np.asarray(counts, dtype=np.int64)

    assert declared_skew([Up([5, 5]), Up([5, 5])], 2) == 0.0
    assert declared_skew([Up([5, 5]), Up([])], 2) is None  # nothing says they are alike
