"""A teacher pass against the machine's own peak (issue 59): K classifier teachers' mean logits
over S samples, as FedMHO-MD, FedDF and the robust screen's probe compute it
(`edgefl.fusion.teachers.mean_teacher_logits`), once with each teacher's evaluation form (what
edgefl does now) and once with the plain module (what it did before), in the same process and
hour; beside them the machine's dense fp32 matmul rate and copy bandwidth measured in the same
run, and each pass's multiply-adds per second (from the cost model's count) as a fraction of the
matmul rate. Beside them, as a reference for what a mature runtime does with the same layers,
onnxruntime (all graph optimisations, as many threads as torch) on the first --ort teachers.

With --device cuda (issue 59 item 5) the passes run on the GPU against the GPU's own fp32 matmul
rate, measured strict and with TF32 (cuDNN's convolutions take TF32 by torch's default), and a
third pass runs beside them: each group of 64 teachers' weights stacked and evaluated as one
vmapped module (`torch.func`), what batching the teachers would give there; onnxruntime is not run.

    python bench/bench_teacher_pass.py --teachers 2000 --samples 6000 --out bench/results/teacher_pass
"""

from __future__ import annotations

import argparse
import io
import json
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import torch
from _peak import copy_bandwidth, gpu_peaks, matmul_peak  # bench/ is on sys.path
from _peak import timed as _timed
from _record import page_head, run_header, write_record

from edgefl.fusion import teachers as passes
from edgefl.models.cost import costs
from edgefl.models.parse import parse_model_arg
from edgefl.models.zoo import build_model
from exporters.read import session_options


def _plain_pass(ups, x):
    """The pass before evaluation forms: each teacher's own module, 512 samples at a time."""
    total = None
    for u in ups:
        with torch.no_grad():
            logits = torch.cat([u.module(x[i : i + 512]) for i in range(0, len(x), 512)])
        total = logits if total is None else total + logits
    return (total / len(ups)).cpu()  # from an accelerator: its queued work is part of the pass


def _stacked_pass(ups, x, group: int = 64, batch: int = 1000):
    """Each `group` teachers' weights stacked (stacking timed) and run as one vmapped module
    (edgefl's `stacked_forward`), `batch` samples a call, the sum kept on x's device: what
    stacking gives without edgefl's host-side steps (one call's logits to the host each)."""
    total = None
    for start in range(0, len(ups), group):
        forward = passes.stacked_forward([u.module for u in ups[start : start + group]], x.device)
        with torch.inference_mode():
            part = torch.cat([forward(x[i : i + batch]).sum(0) for i in range(0, len(x), batch)])
        total = part if total is None else total + part
    return (total / len(ups)).cpu()


def _ort_pass(ups, x) -> float:
    """Seconds for onnxruntime to run each of `ups` over x, 512 samples a call, each session made
    and run once beforehand (what is timed is the arithmetic, as for torch's warm passes)."""
    # the server's own options: idle pool threads sleep (50 sessions' spinning pools took each
    # other's cores: 22 against 34 GMAC/s)
    options = session_options()
    options.intra_op_num_threads = torch.get_num_threads()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sessions = []
    for u in ups:
        buf = io.BytesIO()
        # the TorchScript exporter: a reference graph for this bench, not an upload's
        torch.onnx.export(
            u.module, (x[:1],), buf, input_names=["x"], output_names=["logits"],
            dynamic_axes={"x": {0: "n"}}, dynamo=False,
        )  # fmt: skip
        sessions.append(ort.InferenceSession(buf.getvalue(), options, ["CPUExecutionProvider"]))
    xs = x.numpy()
    for s in sessions:  # a session's first run allocates its arena and prepares its kernels
        s.run(None, {"x": xs[:512]})

    def passes():
        for s in sessions:
            np.concatenate([s.run(None, {"x": xs[i : i + 512]})[0] for i in range(0, len(xs), 512)])

    return _timed(passes)[0]


def _interleaved(ups, x, rounds: int, device="cpu"):
    """({pass: seconds}, {pass: mean logits}) over `ups`, the passes taking turns over `rounds`
    slices of the teachers (which goes first alternates): all see the same machine, where one
    pass after the other saw a shared host's load change between them (the plain pass took
    271-305 s in four runs of one hour). The form pass gets host samples, as the server's do."""
    xd = x.to(device)
    runs = {
        "form": lambda part: passes.mean_teacher_logits(part, x, device),
        "plain": lambda part: _plain_pass(part, xd),
    }
    if torch.device(device).type == "cuda":
        runs["stacked"] = lambda part: _stacked_pass(part, xd)
    seconds, sums = dict.fromkeys(runs, 0.0), dict.fromkeys(runs, 0.0)
    bounds = np.linspace(0, len(ups), max(1, min(rounds, len(ups))) + 1).astype(int)
    for r, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        part = ups[a:b]
        for name in list(runs)[:: 1 if r % 2 == 0 else -1]:
            t, mean = _timed(lambda run=runs[name], part=part: run(part), device)
            seconds[name] += t
            sums[name] = sums[name] + mean * len(part)
    return seconds, {name: total / len(ups) for name, total in sums.items()}


def run_gpu(arch: str, teachers: int, samples: int, shape, classes: int, rounds: int, device):
    """The passes on a GPU (module docstring): seconds, GMAC/s and fractions of its peaks."""
    spec = parse_model_arg(arch, shape, classes)
    torch.manual_seed(0)
    ups = [
        SimpleNamespace(module=build_model(spec).eval().to(device), meta={"num_classes": classes})
        for _ in range(teachers)
    ]
    x = torch.rand(samples, *shape)
    macs = costs(spec).macs * samples * teachers
    peaks = gpu_peaks(device)
    _interleaved(ups[:8], x[:512], 1, device)  # kernels chosen and loaded before the timing
    seconds, means = _interleaved(ups, x, rounds, device)
    top = max(peaks["matmul_gmacs_fp32"], peaks["matmul_gmacs_tf32"]) * 1e9
    row = {"arch": arch, "teachers": teachers, "samples": samples, "device": device}
    row.update(rounds=rounds, macs=macs, **peaks, peak_after=gpu_peaks(device))
    for name, t in seconds.items():
        row[f"{name}_s"] = round(t, 3)
        row[f"{name}_gmacs"] = round(macs / t / 1e9, 1)
        row[f"{name}_of_fp32"] = round(macs / t / (peaks["matmul_gmacs_fp32"] * 1e9), 5)
        row[f"{name}_of_tf32"] = round(macs / t / top, 5)
        row[f"{name}_max_abs_diff_vs_plain"] = float((means[name] - means["plain"]).abs().max())
    return row


def run(
    arch: str, teachers: int, samples: int, shape, classes: int, ort_k: int = 0, rounds: int = 10
) -> dict:
    spec = parse_model_arg(arch, shape, classes)
    torch.manual_seed(0)
    # fresh weights: their values do not change the arithmetic's cost
    ups = [
        SimpleNamespace(module=build_model(spec).eval(), meta={"num_classes": classes})
        for _ in range(teachers)
    ]
    x = torch.rand(samples, *shape)
    macs = costs(spec).macs * samples * teachers
    peak = matmul_peak()
    bandwidth = copy_bandwidth()
    seconds, means = _interleaved(ups, x, rounds)
    t_new, t_old = seconds["form"], seconds["plain"]
    new, old = means["form"], means["plain"]
    k = min(ort_k, teachers)
    t_ort = _ort_pass(ups[:k], x) if k else None
    peak_after = matmul_peak()
    return {
        "arch": arch,
        "teachers": teachers,
        "samples": samples,
        "threads": torch.get_num_threads(),
        "rounds": rounds,
        "macs": macs,
        "matmul_gmacs": round(peak / 1e9, 2),
        "matmul_gmacs_after": round(peak_after / 1e9, 2),
        "copy_gbs": round(bandwidth / 1e9, 2),
        "plain_s": round(t_old, 2),
        "form_s": round(t_new, 2),
        "speedup": round(t_old / t_new, 2),
        "plain_gmacs": round(macs / t_old / 1e9, 2),
        "form_gmacs": round(macs / t_new / 1e9, 2),
        "form_of_peak": round(macs / t_new / max(peak, peak_after), 3),
        "max_abs_diff": float((new - old).abs().max()),
        "ort_teachers": k,
        "ort_gmacs": round(macs * k / teachers / t_ort / 1e9, 2) if k else None,
    }


def markdown(header: dict, rows: list[dict]) -> str:
    lines = [
        *page_head(
            "A teacher pass against the machine's peak (bench/bench_teacher_pass.py)", header
        ),
        "| arch | teachers x samples | threads | matmul GMAC/s (before / after) | copy GB/s | "
        "plain module s | evaluation form s | speedup | form GMAC/s | of matmul peak | "
        "max abs diff | onnxruntime GMAC/s (teachers) |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['arch']} | {r['teachers']} x {r['samples']} | {r['threads']} | "
            f"{r['matmul_gmacs']} / {r['matmul_gmacs_after']} | {r['copy_gbs']} | "
            f"{r['plain_s']} | {r['form_s']} | {r['speedup']}x | {r['form_gmacs']} | "
            f"{100 * r['form_of_peak']:.1f}% | {r['max_abs_diff']:.1e} | {_ort_cell(r)} |"
        )
    return "\n".join(lines) + "\n"


# what each pass is on a GPU: "form" is edgefl's own pass (`mean_teacher_logits`), whatever it
# does there (one evaluation form at a time until 0e0219c; stacked teachers since)
GPU_PASSES = {
    "plain": "plain module",
    "form": "edgefl's pass",
    "stacked": "stacked (the bench's own)",
}


def markdown_gpu(header: dict, rows: list[dict]) -> str:
    title = "A teacher pass against the GPU's peak (bench/bench_teacher_pass.py --device cuda)"
    lines = [
        *page_head(title, header),
        "| arch | teachers x samples | GPU | matmul GMAC/s fp32 / TF32 (after) | copy GB/s | pass | "
        "s | GMAC/s | of fp32 peak | of TF32 peak | max abs diff vs plain |",
        "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        after = r["peak_after"]
        peaks = (
            f"{r['matmul_gmacs_fp32']:.0f} / {r['matmul_gmacs_tf32']:.0f} "
            f"({after['matmul_gmacs_fp32']:.0f} / {after['matmul_gmacs_tf32']:.0f})"
        )
        for name in ("plain", "form", "stacked"):
            lines.append(
                f"| {r['arch']} | {r['teachers']} x {r['samples']} | {r['gpu']} | {peaks} | "
                f"{r['copy_gbs']} | {GPU_PASSES[name]} | {r[name + '_s']} | {r[name + '_gmacs']} | "
                f"{100 * r[name + '_of_fp32']:.2f}% | {100 * r[name + '_of_tf32']:.2f}% | "
                f"{r[name + '_max_abs_diff_vs_plain']:.1e} |"
            )
    return "\n".join(lines) + "\n"


def _ort_cell(r: dict) -> str:
    k = r.get("ort_teachers")  # records before the reference column have none
    return f"{r['ort_gmacs']} ({k})" if k else "not measured"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default="cnn")
    ap.add_argument("--teachers", type=int, default=2000)
    ap.add_argument("--samples", type=int, default=6000)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--ort", type=int, default=50, help="teachers onnxruntime runs (0: none)")
    ap.add_argument(
        "--rounds", type=int, default=10, help="slices of the teachers the two passes alternate on"
    )
    ap.add_argument("--device", default="cpu", help="cpu | cuda (the GPU's passes and peaks)")
    ap.add_argument("--out", help="STEM: write STEM.json and STEM.md")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: give 1 or more (10 by default)")
    if args.device not in ("cpu", "cuda"):
        ap.error(f"--device {args.device}: give cpu or cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: this torch sees no CUDA GPU; run on a GPU machine or give cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    header = run_header("bench/bench_teacher_pass.py")
    rows = []
    for arch in args.archs.split(","):
        if args.device == "cpu":
            row = run(arch, args.teachers, args.samples, (1, 28, 28), 10, args.ort, args.rounds)
        else:
            row = run_gpu(
                arch, args.teachers, args.samples, (1, 28, 28), 10, args.rounds, args.device
            )
        rows.append(row)
        print(json.dumps(rows[-1]), flush=True)
    text = markdown(header, rows) if args.device == "cpu" else markdown_gpu(header, rows)
    print(text)
    if args.out:
        write_record(args.out, header, rows, text)


if __name__ == "__main__":
    main()
