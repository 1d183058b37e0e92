"""Every zoo classifier that fits a wristband or a phone, deployed: file size, TFLite Micro arena,
onnxruntime's resident increase, beside the cost model's peak inference memory (issue 31 item 5).

    python bench/bench_deploy.py [--dataset digits] [--out bench/results]

Models are untrained (sizes and memory do not depend on the weights' values); calibration uses
the dataset's train split. Writes deploy.json and deploy.md with command, date, machine, commit.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgefl.client.run import export_model, model_metadata  # noqa: E402
from edgefl.data.registry import DATASETS  # noqa: E402
from edgefl.deploy import DeployRequest, deploy  # noqa: E402
from edgefl.deploy.targets import TARGETS  # noqa: E402
from edgefl.errors import EdgeflError  # noqa: E402
from edgefl.models.cost import costs  # noqa: E402
from edgefl.models.zoo import ZOO, build_model, input_kind, make_spec  # noqa: E402
from edgefl.profiles import get_profile  # noqa: E402

# (profile, target): the runtime each device class runs.
RUNS = (("wristband", "tflite-micro"), ("smartphone", "ort-mobile"))


def _models(dataset: str):
    info = DATASETS.get(dataset)
    for entry in ZOO:
        if entry.role == "classifier" and input_kind(info.input_shape) in entry.inputs:
            yield make_spec(entry.name, info.input_shape, info.num_classes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgefl-bench-deploy-") as tmp:
        for spec in _models(args.dataset):
            c = costs(spec)
            src = Path(tmp, f"{spec.name}.onnx")
            meta = model_metadata(spec, class_names=[str(i) for i in range(spec.num_classes)],
                                  label_counts=[1] * spec.num_classes, client_id="bench",
                                  profile=None, dataset=args.dataset)  # fmt: skip
            export_model(build_model(spec), spec, meta, src)
            for profile, target in RUNS:
                if TARGETS[target].missing():
                    continue
                row = {"model": spec.label, "profile": profile, "target": target,
                       "cost_model_infer_peak_bytes_fp32": c.infer_peak_bytes,
                       "cost_model_infer_peak_bytes_int8": c.infer_peak_bytes // 4}  # fmt: skip
                start = time.perf_counter()
                try:
                    rep = deploy(DeployRequest(model=str(src), profile=profile, target=target,
                                               out=str(Path(tmp, f"{spec.name}-{target}")),
                                               calibrate=f"{args.dataset}:train",
                                               eval=f"{args.dataset}:test", eval_samples=200))  # fmt: skip
                except EdgeflError as exc:
                    row["refused"] = exc.message
                else:
                    fig = rep.runtime_figures
                    row |= {"file_bytes": rep.files[0]["bytes"],
                            "memory_bytes": fig.get("memory_bytes"),
                            "memory_what": fig.get("memory_what"),
                            "latency_ms_per_sample": fig.get("latency_ms_per_sample"),
                            "mobile_usability": fig.get("mobile_usability")}  # fmt: skip
                    if target == "tflite-micro":
                        est = rep.cost_estimate.get("estimated_activation_bytes")
                        row["cost_model_int8_activation_bytes"] = est
                        if est:
                            row["arena_over_estimate"] = fig["memory_bytes"] / est
                row["seconds"] = time.perf_counter() - start
                print(json.dumps(row), flush=True)
                rows.append(row)
    _write(rows, args)


def _write(rows: list[dict], args) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()  # fmt: skip
    header = {"command": " ".join(["python", "bench/bench_deploy.py", *sys.argv[1:]]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.platform()}",
              "commit": commit, "dataset": args.dataset,
              "profiles": {p: get_profile(p).as_dict() for p, _ in RUNS}}  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "deploy.json").write_text(json.dumps({**header, "rows": rows}, indent=2) + "\n")
    lines = [f"# Deployed zoo models ({args.dataset})", "",
             f"`{header['command']}` on {header['date']}, {header['machine']}, commit {commit}.", "",
             "| model | profile | target | file bytes | measured memory | cost model peak (fp32 / int8) | latency ms | note |",
             "|---|---|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in rows:
        mem = r.get("memory_bytes")
        note = r.get("refused", "")
        if "arena_over_estimate" in r:
            note = f"arena / cost-model int8 activations = {r['arena_over_estimate']:.2f}"
        if r.get("mobile_usability"):
            note = ", ".join(f"{ep} {v['supported_nodes']}/{v['nodes']}"
                             for ep, v in r["mobile_usability"].items())  # fmt: skip
        lat = r.get("latency_ms_per_sample")
        lines.append(f"| {r['model']} | {r['profile']} | {r['target']} | {r.get('file_bytes', '')} "
                     f"| {'' if mem is None else f'{mem:,}'} | {r['cost_model_infer_peak_bytes_fp32']:,}"
                     f" / {r['cost_model_infer_peak_bytes_int8']:,} | "
                     f"{'' if lat is None else f'{lat:.3f}'} | {note} |")  # fmt: skip
    lines += ["", "Memory: TFLite Micro's minimal arena (bisection, weights in flash) for "
              "tflite-micro; onnxruntime's resident increase (load + one inference, fresh "
              "process, one thread) for ort-mobile."]  # fmt: skip
    (out / "deploy.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
