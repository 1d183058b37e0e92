"""pFedZKD benchmark: PSO-searched clients + Multi-ZSKD on MNIST against the paper's Table 2, the
same fusion over fixed-architecture clients (the paper's "pFedZKD-Hom", Table 4), and the search
time of a `wristband` and a `smartphone` budget on this machine.

    python bench/bench_pfedzkd.py [--alphas 0.1,0.3,0.5] [--clients 10] [--workers 2] ...

Per alpha: N clients on MNIST Dir(alpha) (partition seed 0), each through run_client: with
`--search pso` (PSO-FedNAS under the `--profile` budget, plus a `--max-macs` cap so CPU training
stays short) and, for Hom, with one fixed `nas-cnn` (its default genes: the same search space, no
search). Each federation is fused with `pfedzkd` through run_fuse and evaluated on the 10,000
MNIST test images; `ensemble` (the teachers' logit average) is the reference upper bound.

The paper's budget (20 particles x 10 generations x 10 restarts, 10 epochs per candidate, 50
final epochs; N_syn 4,000) is hours per client on two CPU cores. The defaults below are the
reduced budget that is recorded with the results. Writes bench/results/pfedzkd.{json,md}.
"""

from __future__ import annotations

from edgefl.threads import share_cores_politely

# What the edgefl CLI does first: thread settings before numpy and torch load, and MKL's
# fork-safe allocator before this script forks (docs/development.md).
share_cores_politely()

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
# Paper Table 2 (pFedZKD) and Table 4 (pFedZKD-Hom), MNIST, Top-1 %.
PAPER = {
    "pfedzkd": {0.1: 87.58, 0.3: 94.54, 0.5: 95.82},
    "hom": {0.1: 75.09, 0.3: 80.29, 0.5: 86.91},
}


def _init_worker() -> None:
    # One intra-op thread per worker: two workers use both cores without thread contention.
    torch.set_num_threads(1)


def _train_client(kw: dict) -> dict:
    from edgefl.client.run import ClientJob, run_client
    from edgefl.models.cost import costs

    messages: list[str] = []
    t = time.perf_counter()
    r = run_client(ClientJob(**kw), on_status=messages.append)
    c = costs(r.spec)
    gens = [m for m in messages if m.startswith("generation ")]
    return {
        "client": r.client_id,
        "arch": _arch(r.spec),
        "macs": c.macs,
        "params": c.params,
        "samples": r.summary.samples,
        "local_val_accuracy": r.summary.val_accuracy,
        "train_seconds": r.summary.seconds,
        "total_seconds": time.perf_counter() - t,
        "search_log": gens,
    }


def _arch(spec) -> str:
    from edgefl.models.nas import arch_string
    from edgefl.models.zoo import spec_label

    return arch_string(spec.params["genes"]) if spec.name == "nas-cnn" else spec_label(spec)


def federation(pool, out: Path, alpha: float, args, search: bool) -> list[dict]:
    base = dict(
        profile=args.profile,
        dataset="mnist",
        out_dir=str(out),
        num_clients=args.clients,
        partition=f"dirichlet:{alpha}",
        epochs=args.local_epochs,
        fed_seed=0,
    )
    if search:
        base |= dict(search="pso", search_options=search_options(args))
    else:
        base |= dict(model=args.hom_model)
    # seed = client index: each client draws its own swarm (run_client seeds the search with
    # job.seed) and its own local training order; Hom uses the same seeds.
    jobs = [base | {"client_index": i, "seed": i} for i in range(args.clients)]
    return pool.map(_train_client, jobs, chunksize=1)


def search_options(args) -> dict:
    return {
        "particles": args.particles,
        "generations": args.generations,
        "candidate_epochs": args.candidate_epochs,
        "fitness_samples": args.fitness_samples,
        "max_macs": args.max_macs,
    }


def fuse(uploads: Path, method: str, args, out: Path) -> dict:
    from edgefl.server.fuse import FuseJob, run_fuse

    options = {}
    if method == "pfedzkd":
        options = {
            "synthetic": args.synthetic,
            "inversion_steps": args.inversion_steps,
            "inversion_lr": args.inversion_lr,
            "epochs": args.distill_epochs,
        }
    t = time.perf_counter()
    rep = run_fuse(
        FuseJob(
            uploads=str(uploads),
            method=method,
            out=str(out / f"{method}.onnx"),
            options=options,
            device=args.device,
            eval="mnist:test",
        )
    )
    row = {
        "accuracy": 100 * rep["accuracy"],
        "seconds": time.perf_counter() - t,
        "stages": rep["seconds"],
    }
    if method == "pfedzkd":
        row["target_agreement"] = [t["target_agreement"] for t in rep["teachers"]]
    return row


def search_time(profile: str, args) -> dict:
    from edgefl.client.run import ClientJob, search_client
    from edgefl.models.cost import costs
    from edgefl.search import PSOConfig

    cfg = PSOConfig(
        particles=args.time_particles,
        generations=args.time_generations,
        candidate_epochs=args.candidate_epochs,
        fitness_samples=args.time_fitness_samples,
        max_macs=args.max_macs,
    )
    job = ClientJob(
        profile=profile,
        dataset="mnist",
        num_clients=args.clients,
        partition="dirichlet:0.5",
        client_index=0,
    )
    t = time.perf_counter()
    res = search_client(job, cfg)
    b, best = res.budget, res.best
    # Seconds per sample-epoch of candidate training (with its validation pass), scaled to the
    # paper's budget on this shard: 20 particles x 11 swarms x 10 restarts x 10 epochs.
    fit_n = min(args.time_fitness_samples, b["samples"])
    spent = sum(c.seconds for c in res.candidates)
    per = spent / (len(res.candidates) * fit_n * cfg.candidate_epochs)
    return {
        "profile": profile,
        "seconds": time.perf_counter() - t,
        "search_seconds": res.seconds,
        "paper_budget_hours": per * b["samples"] * 20 * 11 * 10 * 10 / 3600,
        "arch": best.arch,
        "macs": best.macs,
        "params": costs(res.spec).params,
        "val_accuracy": best.val_accuracy,
        "train_bytes": best.train_bytes,
        "infer_bytes": best.infer_bytes,
        "ram_budget_bytes": b["ram_budget_bytes"],
        "batch_size": b["batch_size"],
        "optimizer": b["optimizer"],
        "samples": b["samples"],
        "candidates": len(res.candidates),
        "evaluations": res.evaluations,
        "table": [
            {"arch": c.arch, "macs": c.macs, "val_accuracy": c.val_accuracy, "fitness": c.fitness}
            for c in sorted(res.candidates, key=lambda c: c.fitness)
        ],
    }


def _training(profile: str) -> str:
    from edgefl.profiles import get_profile
    from edgefl.training import DEFAULT_LR

    p = get_profile(profile)
    return f"{p.optimizer} lr {DEFAULT_LR[('classifier', p.optimizer)]:g}, batch {p.batch_size}"


def markdown(res: dict) -> str:
    a, lines = res["args"], []
    lines += [
        "# pFedZKD on MNIST: PSO-FedNAS clients + Multi-ZSKD",
        "",
        f"- command: `{res['command']}`",
        f"- date: {res['date']}; machine: {res['machine']}; total {res['total_seconds'] / 60:.1f} min",
        f"- federation: {a['clients']} clients, MNIST Dir(alpha) (partition seed 0), profile "
        f"`{a['profile']}` ({res['profile_training']}), "
        f"{a['local_epochs']} local epochs for the final model (paper: 50)",
        f"- reduced search (paper: 20 particles x 10 generations x 10 restarts, 10 epochs per "
        f"candidate on the whole shard): {a['particles']} particles x {a['generations']} "
        f"generations, 1 run, {a['candidate_epochs']} epoch per candidate on at most "
        f"{a['fitness_samples']:,} local samples, MACs capped at {a['max_macs']:,} (the FedMHO "
        "MNIST CNN has 467,200) on top of the profile budget",
        f"- Multi-ZSKD (paper: N_syn 4,000, tau 4): N_syn {a['synthetic']:,} in all, "
        f"{a['inversion_steps']} Adam steps (lr {a['inversion_lr']}) per pseudo-image, tau 4, betas (0.1, 1.0), student "
        f"`cnn`, {a['distill_epochs']} distillation epochs",
        f"- Hom: every client trains the same `{a['hom_model']}` ({res['hom_macs']:,} MACs, "
        "under the same cap: Conv3x3-BN-ReLU-MaxPool blocks 8-16, FC 64, i.e. C8k3-Pm-C16k3-Pm-F64 "
        "without dropout), then the same fusion",
        "",
        "| alpha | paper pFedZKD | ours pFedZKD (PSO) | paper Hom | ours Hom | ensemble PSO | "
        "ensemble Hom | PSO archs (distinct / MACs range) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        macs = [c["macs"] for c in r["pso_clients"]]
        archs = {c["arch"] for c in r["pso_clients"]}
        lines.append(
            f"| {r['alpha']} | {PAPER['pfedzkd'][r['alpha']]:.2f} | {r['pso']['accuracy']:.2f} | "
            f"{PAPER['hom'][r['alpha']]:.2f} | {r['hom']['accuracy']:.2f} | "
            f"{r['ensemble_pso']['accuracy']:.2f} | {r['ensemble_hom']['accuracy']:.2f} | "
            f"{len(archs)} / {min(macs):,}-{max(macs):,} |"
        )
    lines += ["", "Client architectures found (alpha: client -> arch, MACs, local val acc):", ""]
    for r in res["rows"]:
        archs = "; ".join(
            f"{c['arch']} ({c['macs'] / 1e3:.0f}k, {100 * c['local_val_accuracy']:.0f}%)"
            for c in r["pso_clients"]
        )
        lines.append(f"- {r['alpha']}: {archs}")
    lines += [
        "",
        f"## Search time on this machine: MNIST client 0 of Dir(0.5), {a['time_particles']} "
        f"particles x {a['time_generations']} generations, {a['candidate_epochs']} epoch per "
        f"candidate on {a['time_fitness_samples']:,} samples, MACs cap {a['max_macs']:,}",
        "",
        "| profile | seconds | best arch | MACs | train mem / budget | val acc | architectures "
        "trained | paper budget, extrapolated |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in res["search_time"]:
        lines.append(
            f"| {s['profile']} | {s['seconds']:.1f} | {s['arch']} | {s['macs']:,} | "
            f"{s['train_bytes'] / 2**20:.2f} / {s['ram_budget_bytes'] / 2**20:.2f} MiB "
            f"(batch {s['batch_size']}, {s['optimizer']}) | {100 * s['val_accuracy']:.1f}% | "
            f"{s['candidates']} ({s['evaluations']} evaluations) | "
            f"{s['paper_budget_hours']:.1f} h |"
        )
    lines += [
        "",
        "Extrapolation: this run's seconds per candidate sample-epoch x the paper's 20 particles "
        "x 11 swarms x 10 restarts x 10 epochs on the whole shard (same-size candidates; without "
        "the MACs cap a smartphone's space holds far larger nets).",
    ]
    lines += [
        "",
        "Timings (s) per alpha: clients PSO / Hom (wall, 2 workers), fusion PSO / Hom:",
        "",
    ]
    for r in res["rows"]:
        lines.append(
            f"- {r['alpha']}: {r['pso_clients_seconds']:.0f} / "
            f"{r['hom_clients_seconds']:.0f}, {r['pso']['seconds']:.0f} / "
            f"{r['hom']['seconds']:.0f}"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--alphas", default="0.1,0.3,0.5")
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--profile", default="raspberry-pi-5")
    p.add_argument("--particles", type=int, default=5)
    p.add_argument("--generations", type=int, default=3)
    p.add_argument("--candidate-epochs", type=int, default=1)
    p.add_argument("--fitness-samples", type=int, default=1000)
    p.add_argument("--max-macs", type=int, default=500_000)
    p.add_argument("--local-epochs", type=int, default=2)
    p.add_argument("--synthetic", type=int, default=2000)
    p.add_argument("--inversion-steps", type=int, default=100)
    p.add_argument("--inversion-lr", type=float, default=0.1)
    p.add_argument("--distill-epochs", type=int, default=20)
    # The fixed architecture of the Hom ablation: the searched family's shape, within the cap.
    p.add_argument("--hom-model", default="scnn:width=8,depth=2,bn=true,hidden=64")
    p.add_argument("--search-profiles", default="wristband,smartphone")
    p.add_argument("--time-particles", type=int, default=10)
    p.add_argument("--time-generations", type=int, default=5)
    p.add_argument("--time-fitness-samples", type=int, default=2000)
    p.add_argument("--device", default="cpu", help="fusion device: cpu | cuda | auto")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "pfedzkd"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # the fusion runs in this process while no worker is busy
    start = time.perf_counter()
    rows = []
    work = Path(tempfile.mkdtemp(prefix="pfedzkd-bench-"))
    try:
        with mp.get_context("spawn").Pool(args.workers, initializer=_init_worker) as pool:
            for alpha in [float(a) for a in args.alphas.split(",")]:
                row: dict = {"alpha": alpha}
                for tag, search in (("pso", True), ("hom", False)):
                    d = work / f"{tag}-{alpha}"
                    t = time.perf_counter()
                    row[f"{tag}_clients"] = federation(pool, d, alpha, args, search)
                    row[f"{tag}_clients_seconds"] = time.perf_counter() - t
                    row[tag] = fuse(d, "pfedzkd", args, work / f"g-{tag}-{alpha}")
                    row[f"ensemble_{tag}"] = fuse(d, "ensemble", args, work / f"e-{tag}-{alpha}")
                    print(
                        f"alpha {alpha} {tag}: pfedzkd {row[tag]['accuracy']:.2f}%, ensemble "
                        f"{row[f'ensemble_{tag}']['accuracy']:.2f}% "
                        f"({time.perf_counter() - start:.0f} s)",
                        flush=True,
                    )
                rows.append(row)
        searches = [search_time(prof, args) for prof in args.search_profiles.split(",") if prof]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, Python {platform.python_version()}",
        "args": vars(args),
        "profile_training": _training(args.profile),
        "hom_macs": rows[0]["hom_clients"][0]["macs"] if rows else 0,
        "paper": {k: {str(a): v for a, v in d.items()} for k, d in PAPER.items()},
        "rows": rows,
        "search_time": searches,
        "total_seconds": time.perf_counter() - start,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=2))
    out.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
