"""Run an edgefl artifact the way a device would: onnxruntime and numpy only, nothing else.

    python examples/on_device_infer.py MODEL.onnx [INPUT.npy | IMAGE.png] [--invert]
                                       [--batch 1] [--runs 50]

Reads the artifact's own metadata (what kind of model, which input shape), builds a low-memory
onnxruntime session and prints latency and peak memory. With an INPUT a classifier (or global
model) classifies it and prints each sample's top classes: a .npy array (H x W, C x H x W or
N x C x H x W; values in [0, 1], or 0-255) or an image file (PNG, JPEG: needs Pillow, the one
optional import), scaled to the model's input size. MNIST-style models expect a light digit on
a dark background: --invert a dark digit on white paper. Without an INPUT it feeds random inputs
of the right kind. No torch and no edgefl import: copy this file next to the .onnx on the device.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np
import onnxruntime as ort

METADATA_KEY = "edgefl"


def read_metadata(session: ort.InferenceSession) -> dict:
    props = session.get_modelmeta().custom_metadata_map
    if METADATA_KEY not in props:
        sys.exit(f"error: no '{METADATA_KEY}' metadata in this model; not an edgefl artifact")
    return json.loads(props[METADATA_KEY])


def low_memory_options() -> ort.SessionOptions:
    opts = ort.SessionOptions()
    # The arena and memory-pattern planner pre-allocate and keep buffers for speed; on a device
    # with a few MiB of RAM, allocating per run is the better trade.
    opts.enable_cpu_mem_arena = False
    opts.enable_mem_pattern = False
    opts.intra_op_num_threads = 1  # small cores; threads cost memory and rarely pay off here
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3  # errors only
    return opts


def random_inputs(meta: dict, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    if meta["kind"] == "decoder":
        labels = rng.integers(0, meta["num_classes"], batch)
        return {
            "z": rng.standard_normal((batch, meta["latent_dim"])).astype(np.float32),
            "label": np.eye(meta["num_classes"], dtype=np.float32)[labels],
        }
    # classifier or global model: images in [0, 1]
    return {"input": rng.random((batch, *meta["input_shape"]), dtype=np.float32)}


def load_input(path: str, shape: list[int], invert: bool) -> np.ndarray:
    """(N, C, H, W) float32 in [0, 1] from a .npy array or an image file."""
    c, h, w = shape
    if path.lower().endswith(".npy"):
        try:
            x = np.load(path, allow_pickle=False).astype(np.float32)
        except (OSError, ValueError) as exc:
            sys.exit(f"error: cannot read {path} as a numpy array: {exc}")
        if x.ndim == 2:
            x = x[None, None]
        elif x.ndim == 3:
            x = x[None]
        if x.ndim != 4 or tuple(x.shape[1:]) != (c, h, w):
            sys.exit(
                f"error: {path} holds shape {list(x.shape)}; this model takes "
                f"N x {c} x {h} x {w} (or {h} x {w} for one grayscale sample)"
            )
        if x.size and x.max() > 1.0:  # 0-255 pixels
            x = x / 255.0
    else:
        try:
            from PIL import Image
        except ImportError:
            sys.exit(
                "error: reading an image file needs Pillow (pip install pillow); "
                "or pass the pixels as a .npy array"
            )
        try:
            img = Image.open(path).convert("L" if c == 1 else "RGB").resize((w, h))
        except OSError as exc:
            sys.exit(f"error: cannot read {path} as an image: {exc}")
        x = np.asarray(img, dtype=np.float32) / 255.0
        x = x[None, None] if c == 1 else x.transpose(2, 0, 1)[None]
    if not np.isfinite(x).all():
        sys.exit(f"error: {path} holds NaN or infinite values")
    x = np.clip(x, 0.0, 1.0)
    return (1.0 - x if invert else x).astype(np.float32)


def top_classes(logits: np.ndarray, names: list[str], k: int = 3) -> list[list[tuple[str, float]]]:
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    order = np.argsort(-p, axis=1)[:, :k]
    return [[(names[j], float(row[j])) for j in idx] for row, idx in zip(p, order, strict=True)]


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far, in MiB."""
    # Linux: VmHWM is the peak of this program's own address space. ru_maxrss also counts the
    # parent's footprint when started from a big process (fork keeps the high-water mark and
    # execve carries it over), so a benchmark harness would measure itself.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in KiB on Linux, bytes on macOS.
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="an edgefl artifact (.onnx)")
    parser.add_argument("input", nargs="?", help="a .npy array or an image file to classify")
    parser.add_argument("--invert", action="store_true", help="invert the input (dark on light)")
    parser.add_argument("--batch", type=int, default=1, help="samples per run (default 1)")
    parser.add_argument("--runs", type=int, default=50, help="timed runs (default 50)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.batch < 1 or args.runs < 1:
        parser.error("--batch and --runs must be >= 1")

    baseline = peak_rss_mib()  # the Python + numpy + onnxruntime floor, before the model
    start = time.perf_counter()
    try:
        session = ort.InferenceSession(
            args.model, sess_options=low_memory_options(), providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime's errors share no narrower base class
        sys.exit(f"error: cannot load {args.model}: {str(exc).splitlines()[0]}")
    load_ms = 1000 * (time.perf_counter() - start)
    meta = read_metadata(session)
    if args.input is not None:
        if meta["kind"] == "decoder":
            sys.exit("error: a decoder generates images; it takes no input to classify")
        feed = {"input": load_input(args.input, meta["input_shape"], args.invert)}
    else:
        feed = random_inputs(meta, args.batch, np.random.default_rng(args.seed))
    names = [i.name for i in session.get_inputs()]
    if sorted(names) != sorted(feed):
        sys.exit(f"error: model inputs {names} do not match a {meta['kind']} artifact")

    out = session.run(None, feed)[0]  # warm-up: first run allocates and plans
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        session.run(None, feed)
        times.append(1000 * (time.perf_counter() - t0))

    ms = np.array(times)
    print(f"model: {args.model} ({meta['kind']}, {meta.get('client_id', '?')})")
    if args.input is not None:
        names = [str(n) for n in meta.get("class_names") or range(meta["num_classes"])]
        for i, top in enumerate(top_classes(out, names)):
            ranked = ", ".join(f"{name} {100 * p:.1f}%" for name, p in top)
            print(f"sample {i}: class {top[0][0]} ({ranked})")
    print(f"load: {load_ms:.1f} ms")
    print(f"output: {out.dtype} {list(out.shape)}")
    print(
        f"latency: median {np.median(ms):.3f} ms, p90 {np.percentile(ms, 90):.3f} ms "
        f"(batch {len(next(iter(feed.values())))}, {args.runs} runs)"
    )
    print(f"peak RSS: {peak_rss_mib():.1f} MiB (before loading the model: {baseline:.1f} MiB)")


if __name__ == "__main__":
    main()
