"""Training memory of the planner's picks: the estimate (Costs.train_bytes) against the peak of
one epoch of edgefl.training.train measured with edgefl.privacy.memory's probe.

For each shipped profile and dataset: plan(profile, dataset) (no DP); its pick trained as
`client train` trains it (the profile's batch and optimizer, the default jitter) on two batches
of random inputs of the dataset's shape (the memory does not depend on the values; the second
step runs with the optimizer's state), so the estimate is taken for a shard of two batches.
"old estimate" is the formula before this bench (weights x (2 + state) + batch x activations).

    python bench/bench_train_memory.py            # ~1 min on 2 CPUs (VGG-9 steps)
Writes bench/results/train_memory.json and .md (command, date, machine, commit); --out STEM
writes STEM.json and STEM.md instead.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from _record import run_header

from edgefl.client.job import _default_augment
from edgefl.data.registry import DATASETS
from edgefl.models.cost import OPTIMIZER_STATE
from edgefl.models.plan import plan
from edgefl.models.zoo import spec_label
from edgefl.privacy.memory import peak_bytes
from edgefl.training import TrainConfig, init_model, train

OUT = Path(__file__).resolve().parent / "results" / "train_memory"
PROFILES = ("wristband", "mcu", "smartwatch", "smartphone", "raspberry-pi-5", "server-gpu")
DATASETS_RUN = ("mnist", "fmnist", "hapt", "digits")


def measure(spec, role: str, batch: int, optimizer: str) -> int:
    rng = np.random.default_rng(0)
    n = 2 * batch
    x = rng.random((n, *spec.input_shape), dtype=np.float32)
    y = rng.integers(0, spec.num_classes, n).astype(np.int64)
    cfg = TrainConfig(1, batch, optimizer, 1e-3, augment=_default_augment(spec, role))
    return peak_bytes(lambda: train(init_model(spec, 0), role, x, y, spec.num_classes, cfg))


def main(argv: list[str] | None = None) -> None:
    from edgefl.profiles import get_profile

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(OUT), help="STEM: writes STEM.json and STEM.md")
    out = Path(ap.parse_args(argv).out)
    torch.set_num_threads(1)  # a device trains on one thread
    rows, seen = [], {}
    for name in PROFILES:
        prof = get_profile(name)
        for ds in DATASETS_RUN:
            p = plan(prof, DATASETS.get(ds))
            c, b, opt = p.costs, prof.batch_size, prof.optimizer
            key = (p.spec.to_json(), b, opt)
            if key not in seen:
                seen[key] = measure(p.spec, p.role, b, opt)
            old = c.weight_bytes * (2 + OPTIMIZER_STATE[opt]) + b * c.activation_bytes
            rows.append({
                "profile": name, "dataset": ds, "model": spec_label(p.spec), "role": p.role,
                "batch_size": b, "optimizer": opt, "budget_bytes": prof.ram_budget_bytes,
                "old_estimate_bytes": old, "estimate_bytes": c.train_bytes(b, opt, 2 * b),
                "estimate_shard_bytes": p.fit.train_bytes, "shard_samples": p.fit.samples,
                "measured_bytes": seen[key],
            })  # fmt: skip
            print(rows[-1], flush=True)
    result = {"header": run_header("bench/bench_train_memory.py"), "rows": rows}
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(render(result))


def _kib(n: float) -> str:
    return f"{n / 1024:,.1f}"


def render(result: dict) -> str:
    h = result["header"]
    lines = [
        "# Training memory of the planner's picks: estimate vs measured",
        "",
        f"`{h['command']}`, {h['date']}, {h['machine']}, commit {h['commit']}.",
        "",
        "Measured: the peak of torch's CPU allocations (edgefl.privacy.memory) over one epoch of",
        "two batches of edgefl.training.train (model built, the profile's batch and optimizer).",
        "Estimates for that two-batch shard; the planner's own (last column but one) counts the",
        "default shard's sample order (8 B per sample). Old: weights x (2 + state) + batch x",
        "activations, before this change (and before training freed its gradients after the step:",
        "the wristband's mnist pick measured 862.1 KiB with the old loop, dp_memory.md).",
        "",
        "| profile | dataset | pick | batch, optimizer | old est. KiB | new est. KiB | measured KiB"
        " | new / measured | planner's est. (shard) KiB | budget KiB |",
        "|---|---|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['profile']} | {r['dataset']} | {r['role']} {r['model']} | "
            f"{r['batch_size']}, {r['optimizer']} | {_kib(r['old_estimate_bytes'])} | "
            f"{_kib(r['estimate_bytes'])} | {_kib(r['measured_bytes'])} | "
            f"{r['estimate_bytes'] / r['measured_bytes']:.3f} | "
            f"{_kib(r['estimate_shard_bytes'])} ({r['shard_samples']:,}) | "
            f"{_kib(r['budget_bytes'])} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
