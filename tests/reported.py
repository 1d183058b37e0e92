"""What a run reports, checked against its files."""

from __future__ import annotations


def onnx_accuracy(path, dataset_ref: str) -> float:
    """Top-1 accuracy of an exported model file on a dataset split, read with onnxruntime alone:
    what a run reports must be what its file does."""
    import numpy as np

    import exporters
    from edgefl.data import load_dataset

    data = load_dataset(dataset_ref)
    art = exporters.read_artifact(path)
    pred = np.concatenate(
        [art.run(data.x[i : i + 512]).argmax(1) for i in range(0, len(data.x), 512)]
    )
    return float((pred == data.y).mean())
