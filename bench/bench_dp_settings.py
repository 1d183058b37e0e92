"""DP-SGD's settings on one client (issue 57): what the expected batch, the optimizer and the
learning rate do at one epsilon, for a CVAE (how useful its draws are) and for a classifier.

Each setting trains the client's shard (the partition `edgefl simulate` makes: MNIST or
Fashion-MNIST Dirichlet(0.5) over 10 clients, HAPT by user over 18; seed 0) as `client train`
does, through `edgefl.training.train`, with the DP noise seeded for repeatability:
- generator: the CVAE, then 6,000 draws by the client's label counts (the classes holding >= 1 %
  of its data), a `cnn` trained on them (5 epochs, Adam 1e-3), and that `cnn`'s accuracy on the
  test samples of those classes: what a decoder upload is worth to FedCVAE-ENS-like fusion;
- classifier: the model's accuracy on the same test samples (`all`: on the whole test split).
A `--setting` is ROLE/MODEL/BATCH/LR/OPTIMIZER[/EPSILON] (repeat it); BATCH 0 is DP-SGD's
default expected batch (`edgefl.privacy.config.dp_expected_batch`); EPSILON (default
`--epsilon`) none trains without DP at BATCH.

    python bench/bench_dp_settings.py --dataset mnist --client 2 \
        --setting generator/cvae-small/16/1e-3/adam --setting generator/cvae-small/0/1e-2/adam
Writes bench/results/dp_settings.json and .md (command, date, machine, commit); ~10-40 s a
setting on one CPU.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from _record import run_header, write_record

from device_profiles import OPTIMIZERS
from edgefl.client.run import ClientJob, client_shard
from edgefl.data.datasets import load_dataset
from edgefl.data.partition import train_val_split
from edgefl.models.parse import parse_model_arg
from edgefl.privacy import DPConfig
from edgefl.privacy.config import dp_expected_batch
from edgefl.training import TrainConfig, init_model, one_thread, train

OUT = Path(__file__).resolve().parent / "results" / "dp_settings"
SHARDS = {"hapt": ("user", 18)}  # else Dirichlet(0.5) over 10 clients
DRAWS = 6000
TRAIN_BATCH = {"generator": 16, "classifier": 64}  # the wristband's and the smartphone's


def shard(dataset: str, client: int, subset: int | None = None):
    """(x, y, test x, test y, the client's classes): its training split, as `client train`
    makes it (edgefl.client.run.client_shard, then the 10 % validation split of its seed)."""
    train_set, test = load_dataset(dataset, "train"), load_dataset(dataset, "test")
    scheme, clients = SHARDS.get(dataset, ("dirichlet:0.5", 10))
    job = ClientJob(
        profile="smartphone", dataset=dataset, partition=scheme, num_clients=clients,
        client_index=client,
    )  # fmt: skip
    idx, _ = train_val_split(client_shard(job, train_set), 0.1, seed=job.seed + client)
    idx = idx[:subset] if subset else idx
    classes = int(train_set.y.max()) + 1
    counts = np.bincount(train_set.y[idx], minlength=classes)
    held = np.flatnonzero(counts >= 0.01 * counts.sum())
    return (
        train_set.x[idx],
        train_set.y[idx],
        test.x[: subset or None],
        test.y[: subset or None],
        held,
    )


def _accuracy(model, x, y) -> float:
    with torch.no_grad():
        pred = torch.cat(
            [model(torch.from_numpy(x[i : i + 512])).argmax(1) for i in range(0, len(x), 512)]
        )
    return round(100 * float((pred.numpy() == y).mean()), 2) if len(y) else float("nan")


def setting_problem(setting: str) -> str | None:
    """What is wrong with a ROLE/MODEL/BATCH/LR/OPTIMIZER[/EPSILON] setting, None if nothing."""
    parts = setting.split("/")
    if len(parts) not in (5, 6):
        return (
            "write ROLE/MODEL/BATCH/LR/OPTIMIZER[/EPSILON], e.g. generator/cvae-small/0/1e-2/adam"
        )
    role, _, batch, lr, optimizer, *eps = parts
    try:
        ok = (
            int(batch) >= 0 and float(lr) > 0 and (not eps or eps[0] == "none" or float(eps[0]) > 0)
        )
    except ValueError:
        ok = False
    if role not in TRAIN_BATCH or optimizer not in OPTIMIZERS or not ok:
        return (
            f"ROLE {' | '.join(TRAIN_BATCH)}, BATCH >= 0, LR > 0, "
            f"OPTIMIZER {' | '.join(OPTIMIZERS)}"
        )
    return None


def run_setting(setting: str, data, epsilon: str, epochs: int, draws: int = DRAWS) -> dict:
    role, model, batch, lr, optimizer, *own = setting.split("/")
    epsilon = own[0] if own else epsilon
    x, y, xt, yt, held = data
    classes = int(max(y.max(), yt.max())) + 1
    spec = parse_model_arg(model, x.shape[1:], classes)
    net = init_model(spec, 0)
    batch = int(batch) or dp_expected_batch(len(x), TRAIN_BATCH[role])
    dp = None if epsilon == "none" else DPConfig(float(epsilon), batch=batch)
    augment = "rotate" if role == "classifier" and x.shape[1:3] == (3, 1) else "none"
    cfg = TrainConfig(epochs, batch, optimizer, float(lr), dp=dp, noise_seed=1, augment=augment)
    start = time.perf_counter()
    with one_thread():
        summary = train(net, role, x, y, classes, cfg)
    row = {"setting": setting, "epsilon": epsilon, "epochs": epochs, "samples": len(x)}
    row |= {"batch": batch, "seconds": round(time.perf_counter() - start, 1)}
    row |= {k: (summary.privacy or {}).get(k) for k in ("noise_multiplier", "steps")}
    mask = np.isin(yt, held)
    if role == "classifier":
        return row | {"accuracy": _accuracy(net, xt[mask], yt[mask]), "all": _accuracy(net, xt, yt)}
    counts = np.bincount(y, minlength=classes) * np.isin(np.arange(classes), held)
    labels = torch.from_numpy(
        np.repeat(np.arange(classes), np.round(draws * counts / counts.sum()).astype(int))
    )
    with torch.no_grad():
        drawn = net.sample(labels, torch.Generator().manual_seed(0)).reshape(-1, *x.shape[1:])
    judge = init_model(parse_model_arg("cnn", x.shape[1:], classes), 0)
    with one_thread():
        train(
            judge,
            "classifier",
            drawn.numpy(),
            labels.numpy(),
            classes,
            TrainConfig(5, 64, "adam", 1e-3),
        )
    return row | {"accuracy": _accuracy(judge, xt[mask], yt[mask])}


def render(record: dict) -> str:
    meta = record["meta"]
    lines = [
        "# DP-SGD's settings on one client",
        "",
        f"Command: `{meta['command']}`  ",
        f"Date: {meta['date']}; machine: {meta['machine']}; commit {meta['commit']}.",
        "",
        "Accuracy: a generator's draws' `cnn` (or the classifier itself) on the test samples of "
        "the client's classes, %.",
        "",
        "| setting | epsilon | batch | steps | noise multiplier | seconds | accuracy |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in record["rows"]:
        sigma = f"{r['noise_multiplier']:.3f}" if r["noise_multiplier"] else "-"
        lines.append(
            f"| {r['setting']} | {r['epsilon']} | {r['batch']} | {r['steps'] or '-'} | {sigma} "
            f"| {r['seconds']} | {r['accuracy']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="mnist", help="mnist | fmnist | hapt (hapt: classifiers)")
    ap.add_argument("--client", type=int, default=2)
    ap.add_argument("--epsilon", default="8", help="a number, or none (plain training)")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument(
        "--setting",
        action="append",
        help="ROLE/MODEL/BATCH/LR/OPTIMIZER[/EPSILON], e.g. generator/cvae-small/0/1e-2/adam",
    )
    ap.add_argument("--subset", type=int, default=None, help="first N samples (a smoke run)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--render", default=None, help="only render this results JSON as markdown")
    args = ap.parse_args()
    for setting in args.setting or ():
        if problem := setting_problem(setting):
            ap.error(f"--setting {setting!r}: {problem}")  # before any data loads
    if args.render:
        print(render(json.loads(Path(args.render).read_text())))
        return
    data = shard(args.dataset, args.client, args.subset)
    meta = run_header("bench/bench_dp_settings.py") | {
        "dataset": args.dataset,
        "client": args.client,
    }
    rows = []
    for setting in args.setting or ["generator/cvae-small/0/1e-2/adam"]:
        rows.append(run_setting(setting, data, args.epsilon, args.epochs, args.subset or DRAWS))
        print(json.dumps(rows[-1]), flush=True)
    write_record(args.out, meta, rows, render({"meta": meta, "rows": rows}))


if __name__ == "__main__":
    main()
