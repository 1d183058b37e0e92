"""DP-SGD's training memory on the wristband (issue 57 item 2): the planner's pick under --dp,
its estimate, and the peak measured with the planner's probe (edgefl.privacy.memory).

For each dataset: `plan(wristband, dataset, dp=True)`; then the pick trained as `client train`
trains it (edgefl.training.train with the plan's chunk, DP batch and optimizer, 32
Poisson steps of random inputs of the dataset's shape: the memory does not depend on the values)
under the allocation probe. For comparison, the same model through the per-sample path with the
unbudgeted chunk (what DP-SGD did before the planner counted it) and trained without DP.

    python bench/bench_dp_memory.py            # ~20 s on 2 CPUs
Writes bench/results/dp_memory.json and .md (command, date, machine, commit).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from edgefl.data.registry import DATASETS
from edgefl.models.cost import costs
from edgefl.models.plan import plan
from edgefl.models.zoo import role_of, spec_label
from edgefl.privacy import DPConfig
from edgefl.privacy.dpsgd import DP_GRADIENT_BYTES, dp_chunk, dp_train_epoch
from edgefl.privacy.memory import peak_bytes
from edgefl.profiles import get_profile
from edgefl.training import TrainConfig, cvae_loss, init_model, make_optimizer, train

OUT = Path(__file__).resolve().parent / "results" / "dp_memory"


def header() -> dict:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "command": " ".join(["python", "bench/bench_dp_memory.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared with other jobs), "
        f"{platform.platform()}, torch {torch.__version__}",
        "commit": commit,
    }


def _data(spec, n):
    rng = np.random.default_rng(0)
    x = rng.random((n, *spec.input_shape), dtype=np.float32)
    return x, rng.integers(0, spec.num_classes, n).astype(np.int64)


def _cvae_one(forward, x, onehot):
    recon, mu, logvar = forward(x, onehot)
    return cvae_loss(recon, x, mu, logvar)


def measure(dataset: str) -> dict:
    prof, info = get_profile("wristband"), DATASETS.get(dataset)
    p = plan(prof, info, dp=True)
    # DP-SGD's expected batch and optimizer as planned (its default batch: 512 on MNIST's
    # nominal 6,000 samples, the indices the budget holds)
    spec, c, batch, opt = p.spec, costs(p.spec), p.fit.batch_size, p.fit.optimizer
    # q = 1/32: 32 Poisson steps of mean `batch`, many of more than one chunk (two steps
    # seldom drew one, and under-measured the peak by 62 KB)
    x, y = _data(spec, 32 * batch)
    role = role_of(spec)
    dp = DPConfig(8.0, batch=batch)
    cfg = TrainConfig(1, batch, opt, 1e-3, dp=dp, noise_seed=0, dp_chunk=p.fit.dp_chunk)
    dp_peak = peak_bytes(lambda: train(init_model(spec, 0), role, x, y, spec.num_classes, cfg))
    plain = dataclasses.replace(cfg, dp=None, dp_chunk=None)
    plain_peak = peak_bytes(lambda: train(init_model(spec, 0), role, x, y, spec.num_classes, plain))

    # Before: every sample's gradient materialised, the chunk set by 256 MiB (the whole batch).
    old_chunk = dp_chunk(c.weight_bytes, DP_GRADIENT_BYTES)
    xt = torch.from_numpy(x)
    yt = torch.from_numpy(y) if role == "classifier" else F.one_hot(torch.from_numpy(y)).float()

    def old():
        model = init_model(spec, 0).train()
        loss = _cvae_one if role == "generator" else (lambda f, a, b: F.cross_entropy(f(a), b))
        dp_train_epoch(
            model, loss, xt, yt, sample_rate=batch / len(x), noise_multiplier=1.0, clip=1.0,
            opt=make_optimizer(model.parameters(), cfg), gen=torch.Generator().manual_seed(0),
            chunk=old_chunk,
        )  # fmt: skip

    old_peak = peak_bytes(old)
    per_sample = dataclasses.replace(c, ghost=False)
    return {
        "dataset": dataset,
        "profile": prof.name,
        "budget_bytes": prof.ram_budget_bytes,
        "batch_size": batch,
        "optimizer": opt,
        "model": spec_label(spec),
        "role": p.role,
        "params": c.params,
        "clipping": p.fit.clipping,
        "dp_chunk": p.fit.dp_chunk,
        "dp_estimate_bytes": p.fit.train_bytes,
        "dp_measured_bytes": dp_peak,
        "plain_estimate_bytes": c.train_bytes(batch, opt),
        "plain_measured_bytes": plain_peak,
        "per_sample_chunk": old_chunk,
        "per_sample_estimate_bytes": per_sample.dp_train_bytes(batch, opt, old_chunk),
        "per_sample_measured_bytes": old_peak,
        "epoch_seconds_estimate": p.fit.epoch_seconds,
    }


def render(result: dict) -> str:
    h = result["header"]
    kib = 1024
    lines = [
        "# DP-SGD's training memory on the wristband (issue 57 item 2)",
        "",
        f"`{h['command']}`, {h['date']}, {h['machine']}, commit {h['commit']}.",
        "",
        "Peaks measured with edgefl.privacy.memory (torch's CPU allocations, what the planner's",
        "tests check the estimate against); budget 845 KiB (the wristband's RAM budget); random",
        "inputs of the dataset's shape, 32 Poisson steps of DP-SGD's expected batch as planned,",
        "Adam.",
        "",
        "| dataset | pick under --dp | clipping, chunk of batch | DP estimate KiB | DP measured KiB |"
        " budget KiB | no DP est. / meas. KiB | per-sample path, whole batch: est. / meas. KiB |",
        "|---|---|---|--:|--:|--:|--:|--:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['dataset']} | {r['model']} ({r['role']}, {r['params']:,} params) | "
            f"{r['clipping']}, {r['dp_chunk']} of {r['batch_size']} | "
            f"{r['dp_estimate_bytes'] / kib:.1f} | "
            f"{r['dp_measured_bytes'] / kib:.1f} | {r['budget_bytes'] / kib:.1f} | "
            f"{r['plain_estimate_bytes'] / kib:.1f} / {r['plain_measured_bytes'] / kib:.1f} | "
            f"{r['per_sample_estimate_bytes'] / kib:.1f} / "
            f"{r['per_sample_measured_bytes'] / kib:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(OUT), help="STEM: writes STEM.json and STEM.md")
    args = ap.parse_args(argv)
    out = Path(args.out)
    torch.set_num_threads(1)  # a device trains on one thread (edgefl.training.one_thread)
    result = {"header": header(), "rows": [measure(d) for d in ("mnist", "hapt")]}
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(render(result))
    print(render(result))


if __name__ == "__main__":
    main()
