"""The cost model against the runtimes (issue 31 item 5): every zoo classifier that runs on a
wristband or a phone (the planner's inference rule, `inference_misfit`), on MNIST and HAPT,
deployed as full-integer int8 TFLite and measured in TFLite Micro (minimal arena by bisection,
split into activations and persistent data), and as ORT format measured in onnxruntime
(resident increase in a fresh process), beside the cost model's `infer_peak_bytes` (fp32
weights + largest step) and `tflm_arena_bytes` (the runtime-aware estimate).

    python bench/bench_deploy.py [--datasets mnist,hapt] [--skip vgg9] [--ort-only vgg9]
                                 [--out bench/results]

Models are untrained (sizes and memory do not depend on the weights' values); calibration uses
256 samples of the dataset's train split. The TFLite Micro arena of a model that fits only the
phone is measured under a bench profile without limits (a phone runs onnxruntime; the arena
shows what the cost model says of it). Writes deploy_memory.json and deploy_memory.md with
command, date, machine, commit.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("OMP_NUM_THREADS", "1")

import onnx
from _record import run_header
from onnx import TensorProto, helper

from edgefl.client.run import export_model, model_metadata
from edgefl.data.registry import DATASETS
from edgefl.deploy import DeployRequest, deploy
from edgefl.deploy.measure import ort_resident_increase
from edgefl.errors import EdgeflError
from edgefl.models.cost import ORT_FLOOR_BYTES, costs
from edgefl.models.plan import inference_misfit, plan_inference
from edgefl.models.zoo import ZOO, build_model, input_kind, make_spec, spec_label
from edgefl.profiles import get_profile

PROFILES = ("wristband", "smartphone")
# Budgets no model meets: the arena of a phone-only model is measured, not refused.
UNBOUNDED = """name = "bench-unbounded"
description = "bench only: TFLite Micro measured without a budget"
ram_bytes = 68_719_476_736
ram_available_fraction = 1.0
storage_bytes = 68_719_476_736
macs_per_second = 1.0e12

[training]
optimizer = "sgd"
batch_size = 1
epochs = 1
max_epoch_seconds = 1.0
"""


class _Skipped(Exception):
    pass


def models(dataset: str, skip: set[str]):
    """Each zoo classifier's default size, and the largest each profile runs (plan_inference),
    that runs on at least one of PROFILES: (spec, profiles it fits)."""
    info = DATASETS.get(dataset)
    specs = [
        make_spec(e.name, info.input_shape, info.num_classes)
        for e in ZOO
        if e.role == "classifier" and input_kind(info.input_shape) in e.inputs
    ]
    specs += [plan_inference(get_profile(p), info.input_shape, info.num_classes) for p in PROFILES]
    seen = set()
    for spec in specs:
        if spec_label(spec) in seen or spec.name in skip:
            continue
        seen.add(spec_label(spec))
        fits = [p for p in PROFILES if not inference_misfit(spec, get_profile(p))]
        if fits:
            yield spec, fits


def ort_floor(tmp: Path) -> int | None:
    """onnxruntime's resident increase for an Identity model: the session's own floor."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "floor", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    path = tmp / "identity.onnx"
    onnx.save(model, path)
    return ort_resident_increase(path)


def measure(spec, fits, dataset: str, tmp: Path, unbounded: Path, tflm: bool = True) -> dict:
    c = costs(spec)
    src = tmp / f"{dataset}-{spec_label(spec)}.onnx".replace("/", "_")
    meta = model_metadata(
        spec,
        class_names=[str(i) for i in range(spec.num_classes)],
        label_counts=[1] * spec.num_classes,
        client_id="bench",
        profile=None,
        dataset=dataset,
    )
    export_model(build_model(spec), spec, meta, src)
    row = {
        "dataset": dataset,
        "model": spec_label(spec),
        "fits": fits,
        "params": c.params,
        "cost_infer_peak_bytes": c.infer_peak_bytes,
        "cost_tflm_arena_bytes": c.tflm_arena_bytes,
        "cost_ort_bytes": ORT_FLOOR_BYTES + c.infer_peak_bytes,
    }
    band = "wristband" in fits
    start = time.perf_counter()
    try:
        if not tflm:
            raise _Skipped("not measured (--ort-only)")
        rep = deploy(
            DeployRequest(
                model=str(src),
                profile="wristband" if band else str(unbounded),
                target="tflite-micro",
                out=str(tmp / f"{src.stem}-tflm"),
                calibrate=f"{dataset}:train",
                eval=f"{dataset}:test",
                eval_samples=200,
            )
        )
    except _Skipped as exc:
        row["tflm_skipped"] = str(exc)
    except EdgeflError as exc:
        row["tflm_refused"] = exc.message
    else:
        fig = rep.runtime_figures
        row |= {
            "tflm_profile": "wristband" if band else "bench-unbounded",
            "tflm_arena_bytes": fig["memory_bytes"],
            "tflm_flash_bytes": fig["flash_bytes"],
            "tflm_arena_split": fig.get("arena_split"),
            "tflm_int8_accuracy": rep.accuracy["accuracy"],
            "tflm_fp32_accuracy": rep.accuracy["accuracy_fp32"],
        }
        row["estimate_over_arena"] = c.tflm_arena_bytes / fig["memory_bytes"]
    row["tflm_seconds"] = time.perf_counter() - start
    if "smartphone" in fits:
        try:
            rep = deploy(
                DeployRequest(
                    model=str(src),
                    profile="smartphone",
                    target="ort-mobile",
                    out=str(tmp / f"{src.stem}-ort"),
                    eval=f"{dataset}:test",
                    eval_samples=200,
                )
            )
        except EdgeflError as exc:
            row["ort_refused"] = exc.message
        else:
            row["ort_rss_increase_bytes"] = rep.runtime_figures["memory_bytes"]
            row["ort_file_bytes"] = rep.files[0]["bytes"]
            row["ort_mobile_usability"] = rep.runtime_figures["mobile_usability"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="mnist,hapt")
    ap.add_argument("--skip", default="", help="zoo names to leave out (comma-separated)")
    ap.add_argument("--ort-only", default="", help="zoo names measured in onnxruntime only")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgefl-bench-deploy-") as name:
        tmp = Path(name)
        unbounded = tmp / "bench-unbounded.toml"
        unbounded.write_text(UNBOUNDED)
        floor = ort_floor(tmp)
        print(json.dumps({"ort_identity_rss_increase_bytes": floor}), flush=True)
        for dataset in args.datasets.split(","):
            for spec, fits in models(dataset, set(filter(None, args.skip.split(",")))):
                tflm = spec.name not in args.ort_only.split(",")
                row = measure(spec, fits, dataset, tmp, unbounded, tflm)
                print(json.dumps(row), flush=True)
                rows.append(row)
    write(rows, floor, args)


def write(rows: list[dict], floor: int | None, args) -> None:
    import onnxruntime
    import tflite_micro

    header = run_header("bench/bench_deploy.py")
    commit = header["commit"]
    header |= {
        "onnxruntime": onnxruntime.__version__,
        "tflite_micro": getattr(tflite_micro, "__version__", "installed"),
        "ort_identity_rss_increase_bytes": floor,
        "cost_model_ort_floor_bytes": ORT_FLOOR_BYTES,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "deploy_memory.json").write_text(json.dumps({**header, "rows": rows}, indent=2) + "\n")
    worst = max(
        (abs(r["estimate_over_arena"] - 1) for r in rows if "estimate_over_arena" in r),
        default=None,
    )
    lines = [
        "# The cost model against the runtimes (issue 31 item 5)",
        "",
        f"`{header['command']}` on {header['date']}, {header['machine']}, commit {commit}, "
        f"onnxruntime {header['onnxruntime']}.",
        "",
        "Every zoo classifier (default size, and the largest each profile runs) that runs on a "
        "wristband or a phone by the planner's inference rule. TFLite Micro: full-integer int8 "
        "(onnx2tf, per-channel), minimal arena by bisection (16 B steps), split as TFLite "
        "Micro's recording allocator reports it (activations / persistent); weights stay in "
        "flash. onnxruntime: ORT format, resident increase for load + one inference in a fresh "
        "process after `import onnxruntime`.",
        "",
        "| dataset | model | runs on | cost model infer peak (fp32) | cost model TFLM arena | "
        "TFLM arena measured (activations + persistent) | estimate / measured | TFLM flash | "
        "ORT resident increase | cost model ORT (floor + peak) | mobile checker: supported "
        "nodes NNAPI, CoreML |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        split = r.get("tflm_arena_split")
        measured = (
            f"{r['tflm_arena_bytes']:,}"
            + (f" ({split['activations']:,} + {split['persistent']:,})" if split else "")
            if "tflm_arena_bytes" in r
            else r.get("tflm_skipped") or f"refused: {r.get('tflm_refused', '')}"
        )
        if r.get("tflm_profile") == "bench-unbounded":
            measured += " (no budget)"
        ratio = f"{r['estimate_over_arena']:.3f}" if "estimate_over_arena" in r else ""
        ort = r.get("ort_rss_increase_bytes")
        lines.append(
            f"| {r['dataset']} | {r['model']} | {', '.join(r['fits'])} | "
            f"{r['cost_infer_peak_bytes']:,} | {r['cost_tflm_arena_bytes']:,} | {measured} | "
            f"{ratio} | {r.get('tflm_flash_bytes', 0):,} | "
            f"{'' if ort is None else f'{ort:,}'} | {r['cost_ort_bytes']:,} | {_eps(r)} |"
        )
    lines += [
        "",
        f"Largest gap between `tflm_arena_bytes` and the measured arena: "
        f"{'' if worst is None else f'{100 * worst:.1f}%'} (target: within 25%).",
        f"onnxruntime's floor, an Identity model's resident increase on this machine: "
        f"{'' if floor is None else f'{floor:,}'} bytes; the cost model's `ORT_FLOOR_BYTES` is "
        f"{ORT_FLOOR_BYTES:,} (shared/notes/deploy.md).",
    ]
    (out / "deploy_memory.md").write_text("\n".join(lines) + "\n")


def _eps(row: dict) -> str:
    usability = row.get("ort_mobile_usability") or {}
    return ", ".join(f"{v['supported_nodes']}/{v['nodes']}" for v in usability.values())


if __name__ == "__main__":
    main()
