"""Measurements of a deployed file in its runtime on this machine: memory, latency, accuracy.

TFLite Micro and the resident-memory probe run in a child process (`child.py`): the interpreter
can crash its process on an arena far too small, and resident memory is only meaningful in a
process that loaded nothing else.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgefl.errors import ArtifactError

CHILD = Path(__file__).with_name("child.py")
ARENA_STEP = 16  # bytes: TFLite Micro aligns its allocations to 16
CHILD_TIMEOUT_S = 600


def run_child(*args: str, timeout: float = CHILD_TIMEOUT_S) -> dict | None:
    """The child's JSON result, or None if it failed (an exception or a crash)."""
    return child(*args, timeout=timeout)[0]


def child(*args: str, timeout: float = CHILD_TIMEOUT_S) -> tuple[dict | None, str]:
    """One run of the child: its JSON result (None if it failed: an exception, a crash, no
    answer in `timeout`) and the last line it wrote, for a message ('' when it succeeded)."""
    try:
        done = subprocess.run(
            [sys.executable, str(CHILD), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_child_env(),
        )
    except subprocess.TimeoutExpired:
        return None, f"no answer in {timeout:.0f} s"
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and lines:
        return json.loads(lines[-1]), ""
    tail = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    return None, tail[-1][:300] if tail else f"exit code {done.returncode}"


def _child_env() -> dict:
    import os

    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")


def tflm_fits(path: Path, arena: int) -> bool:
    """TFLite Micro creates the interpreter and runs one inference within `arena` bytes."""
    return tflm_try(path, arena) is None


def tflm_try(path: Path, arena: int) -> str | None:
    """None if TFLite Micro runs `path` within `arena` bytes, else the last line its
    interpreter wrote: one run for the answer and the words."""
    result, said = child("tflm", str(path), str(arena), timeout=120)
    return None if result is not None else said


def min_arena(path: Path, limit: int, on_step: Callable[[int], None] | None = None) -> int | None:
    """The smallest arena (to ARENA_STEP bytes) TFLite Micro runs `path` in; None if even `limit`
    is too small. Bisection: the interpreter refuses (or fails) below the minimum."""
    hi = 16 * 1024
    while not tflm_fits(path, hi):
        if hi >= limit:
            return None
        hi = min(limit, hi * 4)
    lo = 0
    while hi - lo > ARENA_STEP:
        mid = (lo + hi) // 2 // ARENA_STEP * ARENA_STEP
        if mid <= lo:
            break
        if tflm_fits(path, mid):
            hi = mid
        else:
            lo = mid
        if on_step:
            on_step(hi)
    return hi


def tflite_ops(path: Path) -> list[str]:
    """The builtin operators a .tflite file uses, in its own order (its flatbuffer's operator
    codes, read with the schema TFLite Micro ships)."""
    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as schema

    model = schema.Model.GetRootAsModel(path.read_bytes(), 0)
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    ops = []
    for i in range(model.OperatorCodesLength()):
        oc = model.OperatorCodes(i)  # codes past 127 live in BuiltinCode, older ones in both
        code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
        ops.append(names.get(code, f"builtin {code}"))
    return ops


def tflm_split(path: Path, arena: int) -> dict[str, int] | None:
    """The arena's split as TFLite Micro's recording allocator reports it: `head` (activations,
    planned and reused between ops), `tail` (persistent: tensor structs, per-op data), `total`."""
    result = run_child("tflm-alloc", str(path), str(arena), timeout=120)
    if not result or not result.get("ok"):
        return None
    return {k: result[k] for k in ("total", "head", "tail")}


def tflm_run(path: Path, arena: int, x: np.ndarray) -> tuple[np.ndarray, dict]:
    """Dequantized outputs of the int8 file on float inputs (NHWC), and the child's figures."""
    with tempfile.TemporaryDirectory(prefix="edgefl-tflm-") as tmp:
        inputs, outputs = Path(tmp, "x.npy"), Path(tmp, "y.npy")
        np.save(inputs, x.astype(np.float32))
        result, said = child("tflm", str(path), str(arena), str(inputs), str(outputs))
        if result is None:
            raise ArtifactError(
                f"TFLite Micro could not run {path.name} with a {arena}-byte arena: {said}",
                hint="deploy it with --target onnx, or a smaller model (edgefl models "
                "--profile PROFILE lists those that fit)",
            )
        return np.load(outputs), result


def ort_resident_increase(path: Path) -> int | None:
    """Resident memory onnxruntime adds to load `path` and run one inference (fresh process)."""
    result = run_child("ort-rss", str(path), timeout=300)
    return None if result is None else int(result["rss_increase_bytes"])


def ort_outputs(
    path: Path | bytes, x: np.ndarray, batch: int | None = 1
) -> tuple[np.ndarray, float]:
    """Outputs of an ONNX/ORT file over `x` one batch at a time, and seconds per sample
    (one thread, as on a phone's single inference)."""
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    model = str(path) if isinstance(path, Path) else path
    session = ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    step = batch or 256
    x = x.astype(np.float32)
    session.run(None, {name: x[:step]})  # warm-up: first-run allocations are not latency
    out, start = [], time.perf_counter()
    for i in range(0, len(x), step):
        out.append(session.run(None, {name: x[i : i + step]})[0])
    seconds = (time.perf_counter() - start) / max(1, len(x))
    return np.concatenate(out), seconds


@dataclass(frozen=True)
class Agreement:
    samples: int
    accuracy: float  # the deployed file on the labels
    accuracy_fp32: float  # the source model on the same samples
    argmax_agreement: float  # share of samples where both predict the same class
    max_abs_logit_diff: float

    def as_dict(self) -> dict:
        return {
            "samples": self.samples,
            "accuracy": self.accuracy,
            "accuracy_fp32": self.accuracy_fp32,
            "accuracy_drop_points": 100 * (self.accuracy_fp32 - self.accuracy),
            "argmax_agreement": self.argmax_agreement,
            "max_abs_logit_diff": self.max_abs_logit_diff,
        }


def agreement(deployed: np.ndarray, reference: np.ndarray, labels: np.ndarray) -> Agreement:
    pred, ref = deployed.argmax(1), reference.argmax(1)
    return Agreement(
        samples=len(labels),
        accuracy=float((pred == labels).mean()),
        accuracy_fp32=float((ref == labels).mean()),
        argmax_agreement=float((pred == ref).mean()),
        max_abs_logit_diff=float(np.abs(deployed - reference).max()),
    )
