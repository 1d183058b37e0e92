"""A valid upload whose finite weights make its outputs NaN (issue 18 item 0): the rebuild check
used to pass it, because NaN minus NaN is NaN, which no tolerance comparison flags. It is
refused by name now, and the honest uploads beside it are used."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
from fed_fixtures import build_federation
from onnx import numpy_helper

import exporters
from edgefl.server.ingest import ingest
from exporters.graph import weights_hash


def _nan_logits(src, dst) -> None:
    """The same classifier with its last layer's weights at +-3e38 in turn: every weight is
    finite, but each logit sums +inf and -inf products, so it is NaN in torch and in
    onnxruntime alike (and NaN - NaN passed the old tolerance check)."""
    model = onnx.load(str(src))
    meta = exporters.read_artifact(src).metadata
    last = [
        t for t in model.graph.initializer if len(t.dims) == 2 and meta["num_classes"] in t.dims
    ][-1]
    w = numpy_helper.to_array(last).astype(np.float32)
    signs = np.where(np.indices(w.shape).sum(0) % 2 == 0, 1.0, -1.0).astype(np.float32)
    w = signs * np.float32(3e38)
    assert np.isfinite(w).all()
    last.CopyFrom(numpy_helper.from_array(w, last.name))
    exporters.set_metadata(model, meta | {"weights_sha256": weights_hash(model)})
    onnx.save(model, str(dst))


def test_an_upload_whose_finite_weights_give_nan_is_refused(tmp_path):
    fed = build_federation(tmp_path / "fed")
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    for f in ("client-000.onnx", "client-002.onnx"):
        shutil.copy(fed / f, uploads / f)
    _nan_logits(fed / "client-001.onnx", uploads / "client-001.onnx")
    found = ingest(uploads, max_upload_bytes=exporters.DEFAULT_MAX_UPLOAD_BYTES)
    assert dict(found.rejected) == {
        "client-001.onnx": "its outputs are not finite on valid inputs (NaN or infinity)"
    }
    assert sorted(u.name for u in found.uploads) == ["client-000.onnx", "client-002.onnx"]


def test_a_fused_model_never_steps_on_a_non_finite_loss():
    """Every fusion method's student loop steps through `descend`: a NaN loss stops the fusion
    with the fix, and the weights are those before the step, not NaN."""
    import pytest
    import torch

    from edgefl.errors import FusionError
    from edgefl.fusion.student import descend

    model = torch.nn.Linear(3, 2)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.ones(1, 3)).sum()
    assert descend(opt, loss) == pytest.approx(float(loss.detach()))
    moved = [p.detach().clone() for p in model.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before, moved, strict=True))
    with pytest.raises(FusionError, match="training loss became nan") as err:
        descend(opt, model(torch.full((1, 3), float("nan"))).sum())
    assert "learning rate" in err.value.hint
    assert all(torch.equal(a, p) for a, p in zip(moved, model.parameters(), strict=True))
