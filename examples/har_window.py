"""Classify one window of a wristband's accelerometer the way the device would: onnxruntime and
numpy only, no torch, no edgefl (copy this file next to the .onnx).

    python examples/har_window.py MODEL.onnx WINDOW.csv

MODEL.onnx is an edgefl classifier or global model trained on `hapt` (accelerometer x, y, z) or
`hapt-gyro` (then gyroscope x, y, z too). WINDOW.csv holds the window as the sensor gives it:
one row per sample (128 at 50 Hz = 2.56 s), columns ax, ay, az in g (then gx, gy, gz in rad/s),
comma- or space-separated, an optional header line. The script applies edgefl's fixed map
(acc from [-2, 2] g, gyro from [-4, 4] rad/s, clipped into [0, 1]: the same on every device,
no statistics of anyone's data), runs the model and prints the activities by probability.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import onnxruntime as ort

ACC_RANGE, GYRO_RANGE = 2.0, 4.0  # as edgefl.data.hapt


def scale(window: np.ndarray) -> np.ndarray:
    """(L, C) sensor units -> (1, C, 1, L) in [0, 1]."""
    full = np.array([ACC_RANGE] * 3 + [GYRO_RANGE] * 3, dtype=np.float32)[: window.shape[1]]
    x = np.clip((window + full) / (2 * full), 0.0, 1.0).astype(np.float32)
    return x.T[None, :, None, :]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("window", help="CSV: one row per sample, ax ay az [gx gy gz]")
    args = ap.parse_args()
    session = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
    meta = json.loads(session.get_modelmeta().custom_metadata_map.get("edgefl", "{}"))
    shape = meta.get("input_shape")
    if meta.get("kind") not in ("classifier", "global") or not shape or shape[1] != 1:
        sys.exit("error: not an edgefl classifier of sensor windows (train one on hapt)")
    channels, length = shape[0], shape[2]
    try:
        with open(args.window, encoding="utf-8") as f:
            text = f.read().replace(",", " ").splitlines()
        rows = [line.split() for line in text if line.strip()]
        if rows and not all(_number(v) for v in rows[0]):
            rows = rows[1:]  # a header line
        window = np.array(rows, dtype=np.float32)
    except (OSError, ValueError) as exc:
        sys.exit(f"error: cannot read {args.window} as numbers: {exc}")
    if window.shape != (length, channels):
        sys.exit(
            f"error: the model wants {length} rows of {channels} columns, "
            f"{args.window} has shape {window.shape}"
        )
    logits = session.run(None, {session.get_inputs()[0].name: scale(window)})[0][0]
    p = np.exp(logits - logits.max())
    p /= p.sum()
    names = meta.get("class_names") or [str(i) for i in range(len(p))]
    for i in np.argsort(-p):
        print(f"{names[i]:<20} {p[i]:6.1%}")


def _number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


if __name__ == "__main__":
    main()
