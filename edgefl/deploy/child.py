"""Runtime work done in a child process, run by path (never imported by edgefl).

Why a child: TFLite Micro's Python interpreter can crash the process (a segmentation fault)
when its arena is far too small, onnx2tf prints to stdout and imports TensorFlow, and resident
memory is only meaningful in a fresh process. Each command prints one JSON line last.

    child.py tflm MODEL ARENA [INPUTS.npy OUTPUTS.npy]   create (and run) under an arena
    child.py tflm-alloc MODEL ARENA                       the arena's head/tail split
    child.py ort-rss MODEL                                onnxruntime resident increase
    child.py onnx2tf MODEL.onnx OUT_DIR CALIB.npy         full-integer int8 .tflite
"""

from __future__ import annotations

import json
import os
import sys
import time


def _rss() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil  # not Linux: psutil (edgefl[deploy]) reads it

    return psutil.Process().memory_info().rss


def tflm(model: str, arena: int, inputs: str | None = None, outputs: str | None = None) -> dict:
    import numpy as np
    from tflite_micro.python.tflite_micro import runtime

    interpreter = runtime.Interpreter.from_file(model, arena_size=arena)
    din, dout = interpreter.get_input_details(0), interpreter.get_output_details(0)
    if inputs is None:
        interpreter.set_input(np.zeros(din["shape"], din["dtype"]), 0)
        interpreter.invoke()
        return {"ok": True}
    x = np.load(inputs)
    (s_in,), (z_in,) = (
        din["quantization_parameters"]["scales"],
        din["quantization_parameters"]["zero_points"],
    )
    (s_out,), (z_out,) = (
        dout["quantization_parameters"]["scales"],
        dout["quantization_parameters"]["zero_points"],
    )
    info = np.iinfo(din["dtype"])
    q = np.clip(np.rint(x / s_in) + z_in, info.min, info.max).astype(din["dtype"])
    out = np.empty((len(x), *dout["shape"][1:]), np.float32)
    start = time.perf_counter()
    for i in range(len(x)):
        interpreter.set_input(q[i : i + 1].reshape(din["shape"]), 0)
        interpreter.invoke()
        out[i] = (interpreter.get_output(0).astype(np.float32) - z_out) * s_out
    seconds = time.perf_counter() - start
    np.save(outputs, out)
    return {
        "ok": True,
        "seconds_per_sample": seconds / max(1, len(x)),
        "input_scale": float(s_in),
        "input_zero_point": int(z_in),
        "output_scale": float(s_out),
        "output_zero_point": int(z_out),
        "input_shape": [int(d) for d in din["shape"]],
    }


def tflm_alloc(model: str, arena: int) -> dict:
    """How TFLite Micro's RecordingMicroAllocator split the arena: the head holds the planned
    activations (reused between ops), the tail what persists (tensor structs, per-op data such
    as per-channel quantization multipliers). It prints to fd 2 from C: read it back."""
    import re
    import tempfile

    from tflite_micro.python.tflite_micro import runtime

    interpreter = runtime.Interpreter.from_file(model, arena_size=arena)
    with tempfile.TemporaryFile(mode="w+b") as log:
        saved = os.dup(2)
        sys.stderr.flush()
        os.dup2(log.fileno(), 2)
        try:
            interpreter.print_allocations()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        text = log.read().decode(errors="replace")
    found = dict(re.findall(r"Arena allocation (total|head|tail) (\d+) bytes", text))
    return {"ok": len(found) == 3, **{k: int(v) for k, v in found.items()}}


def ort_rss(model: str) -> dict:
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    before = _rss()
    session = ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
    feed = {}
    for value in session.get_inputs():
        dims = [d if isinstance(d, int) else 1 for d in value.shape]
        feed[value.name] = np.zeros(dims, np.float32)
    session.run(None, feed)
    return {"ok": True, "rss_increase_bytes": _rss() - before}


def onnx2tf_convert(model: str, out_dir: str, calib: str) -> dict:
    import numpy as np

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import onnx2tf

    # onnx2tf checks any 4-D input whose last dim is 3 (a 3-axis accelerometer's windows are
    # (1, 128, 3) channels-last) on sample images it downloads unless this file is in the
    # working folder: offline that fails, so it gets the caller's own calibration windows.
    os.makedirs(out_dir, exist_ok=True)
    os.chdir(out_dir)
    np.save("calibration_image_sample_data_20x128x128x3_float32.npy", np.load(calib)[:20])

    onnx2tf.convert(
        input_onnx_file_path=model,
        output_folder_path=out_dir,
        output_integer_quantized_tflite=True,
        # Already scaled as the model expects: the calibration set is used as it is.
        custom_input_op_name_np_data_path=[
            ["input", calib, np.zeros(1, np.float32), np.ones(1, np.float32)]
        ],
        quant_type="per-channel",
        verbosity="error",
    )
    stem = os.path.splitext(os.path.basename(model))[0]
    path = os.path.join(out_dir, f"{stem}_full_integer_quant.tflite")
    return {"ok": os.path.isfile(path), "tflite": path}


def main(argv: list[str]) -> None:
    command, args = argv[0], argv[1:]
    if command == "tflm":
        result = tflm(args[0], int(args[1]), *args[2:4])
    elif command == "tflm-alloc":
        result = tflm_alloc(args[0], int(args[1]))
    elif command == "ort-rss":
        result = ort_rss(args[0])
    elif command == "onnx2tf":
        result = onnx2tf_convert(*args[:3])
    else:
        raise SystemExit(f"unknown command {command!r}")
    sys.stdout.write("\n" + json.dumps(result) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
