"""The planner's upload size is the file `client train` writes (issue 34 item 6): for every zoo
model, on images and on sensor windows, classifiers and decoders, the planned `upload_bytes`
is within 2% of the real upload, trained one short epoch through the real client path. The
upload carries none of the exporter's debugging records (source paths of the machine)."""

from __future__ import annotations

import onnx
import pytest

from edgefl.client.run import ClientJob, run_client
from edgefl.models.cost import costs
from edgefl.models.zoo import ZOO

pytestmark = pytest.mark.slow

DATASETS = {"image": "mnist", "signal": "hapt"}
CASES = [(e.name, kind) for e in ZOO for kind in e.inputs]


@pytest.mark.parametrize("name, kind", CASES)
def test_planned_upload_is_the_file(name, kind, tmp_path):
    job = ClientJob(profile="smartphone", dataset=DATASETS[kind], out_dir=str(tmp_path),
                    subset=48, epochs=1, batch_size=16, model=name, role=ZOO.get(name).role,
                    force=True, client_id=name, partition="iid", num_clients=1)  # fmt: skip
    result = run_client(job)
    actual = result.path.stat().st_size
    planned = costs(result.spec).upload_bytes
    assert abs(planned / actual - 1) <= 0.02, (planned, actual)
    model = onnx.load(result.path)
    records = [p.key for n in model.graph.node for p in n.metadata_props]
    assert records == []  # no stack traces, module paths or FX nodes leave the device
