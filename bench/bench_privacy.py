"""What an upload reveals about the person who trained it (issue 57, item 5): membership inference
against each upload kind, without DP and under DP-SGD, on MNIST and on one HAPT user's windows.

    python bench/bench_privacy.py --out bench/results/privacy_audit
        [--datasets mnist,hapt] [--epsilons none,8,4,1] [--samples 1000] [--epochs N]
        [--shadows 4] [--restarts 4] [--steps 100] [--hapt-users 1] [--seed 0]

Per dataset, one client: MNIST, `--samples` random training images (members) against as many
held-out training images of the same class mix (non-members); HAPT, the training user with the
most windows, whose windows are dealt in blocks of 4 to members and non-members alternately
(the first window of each block dropped: windows overlap by half, so no member shares a sample
with a non-member); `--hapt-users K` makes each of the K users with the most windows a client
with its own models and pools their scores (one user's ~170 + 170 queries leave AUC intervals
about +-0.06 wide). Per privacy setting (no DP; DP-SGD at each epsilon, delta 1/n), the client
trains the dataset's classifier and CVAE with the same recipe (Adam, batch 64, enough epochs for
the profiles' 300 optimiser steps; under DP at DP-SGD's own expected batch and rate), and every attack of `edgefl.privacy.audit` runs on what
would be uploaded: the classifier (loss threshold; offline LiRA with `--shadows` shadow models
trained by the same recipe on other data of the distribution) and the CVAE's decoder
(reconstruction by latent optimisation; nearest of 2,000 samples per class; each also calibrated
by a reference decoder trained by the same recipe on other data). Label counts: how often a
client's histogram of half its data picks out its own other half among the federation's clients
(HAPT's 21 training users; MNIST Dir(0.5) over 10 clients), exact and under the Laplace
mechanism. Writes `<out>.json` and `<out>.md`.
"""

from __future__ import annotations

from edgefl.threads import share_cores_politely

# What the edgefl command does first: thread settings before numpy and torch load (a
# 2-thread DP-SGD step on 2 busy cores was measured 35x slower than one thread).
share_cores_politely()

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgefl.data import load_dataset, partition
from edgefl.models.zoo import make_spec
from edgefl.privacy import DPConfig, audit
from edgefl.privacy.config import DP_LR
from edgefl.training import TrainConfig, evaluate, init_model, one_thread, train

ROOT = Path(__file__).resolve().parents[1]
MIN_STEPS, BATCH = 300, 64  # the device profiles' min_steps and batch size
# Adam (the profiles' optimizer for small devices): edgefl.training.DEFAULT_LR without DP; under
# DP what `client train --dp` trains with (edgefl.privacy.config: DP_LR, and DP-SGD's default
# expected batch, n/6 of at least BATCH), so the audit attacks what a device uploads.
LR = {("classifier", False): 1e-3, ("generator", False): 1e-3}
LR |= {("classifier", True): DP_LR, ("generator", True): DP_LR}
BLOCK = 4  # HAPT windows dealt to members / non-members in blocks of this many
SAMPLES_PER_CLASS = 2000  # sample-distance attack: draws of each class from the decoder
LINK_EPSILONS = (8.0, 1.0)  # label counts released under Laplace noise of scale 1/epsilon
# Issue 57's target: at epsilon 8 (delta 1/n) every attack's AUC <= 0.55, TPR at 1 % FPR <= 2 %.
TARGET_EPSILON, AUC_MAX, TPR_MAX = 8.0, 0.55, 0.02


@dataclass(frozen=True)
class Setup:
    """A dataset's client: what it trains (a classifier and a CVAE, as edgefl's two roles)."""

    dataset: str
    classifier: str
    generator: str


SETUPS = {
    "mnist": Setup("mnist", "cnn", "cvae-small"),  # FedMHO's phone and wristband models
    "hapt": Setup("hapt", "cnn1d", "cvae1d"),  # the reference HAR classifier; the 1-D CVAE
}


@dataclass
class Split:
    """One client's members and non-members, the population it is drawn from (shadow and
    reference training data, none of it a query) and the test split (utility)."""

    members: tuple[np.ndarray, np.ndarray]
    nonmembers: tuple[np.ndarray, np.ndarray]
    pool: tuple[np.ndarray, np.ndarray]
    test: tuple[np.ndarray, np.ndarray]
    num_classes: int
    shape: tuple[int, int, int]
    note: str


def mnist_split(samples: int, seed: int) -> Split:
    """`samples` random training images; as many others with the same count of each class."""
    ds, test = load_dataset("mnist"), load_dataset("mnist:test")
    rng = np.random.default_rng(seed)
    members = rng.choice(len(ds), samples, replace=False)
    rest = np.setdiff1d(np.arange(len(ds)), members)
    nonmembers = np.concatenate(
        [
            rng.choice(rest[ds.y[rest] == c], int(np.sum(ds.y[members] == c)), replace=False)
            for c in range(ds.num_classes)
        ]
    )
    pool = np.setdiff1d(rest, nonmembers)
    t = rng.choice(len(test), 2000, replace=False)
    return Split(
        (ds.x[members], ds.y[members]),
        (ds.x[nonmembers], ds.y[nonmembers]),
        (ds.x[pool], ds.y[pool]),
        (test.x[t], test.y[t]),
        ds.num_classes,
        ds.input_shape,
        f"{samples} random training images; non-members: {samples} others of the same class "
        f"counts; shadow/reference data: the other {len(pool):,}; test: 2,000 test images",
    )


def hapt_users(user: int | None, count: int) -> list[int]:
    """`user`, or the `count` training users with the most windows."""
    if user is not None:
        return [user]
    users, counts = np.unique(load_dataset("hapt").groups, return_counts=True)
    return [int(u) for u in users[np.argsort(-counts, kind="stable")[:count]]]


def hapt_split(user: int) -> Split:
    """One training user's windows, dealt in blocks to members and non-members."""
    ds, test = load_dataset("hapt"), load_dataset("hapt:test")
    users = np.unique(ds.groups)
    own = np.flatnonzero(ds.groups == user)  # in time order within each recording
    if len(own) < 4 * BLOCK:
        raise SystemExit(f"HAPT user {user} has {len(own)} training windows: pick another")
    block = np.arange(len(own)) // BLOCK
    keep = np.arange(len(own)) % BLOCK != 0  # the first window of a block overlaps the last
    members, nonmembers = own[keep & (block % 2 == 0)], own[keep & (block % 2 == 1)]
    n = min(len(members), len(nonmembers))
    members, nonmembers = members[:n], nonmembers[:n]
    pool = np.flatnonzero(ds.groups != user)
    return Split(
        (ds.x[members], ds.y[members]),
        (ds.x[nonmembers], ds.y[nonmembers]),
        (ds.x[pool], ds.y[pool]),
        (test.x, test.y),
        ds.num_classes,
        ds.input_shape,
        f"user {user}'s {len(own)} windows in blocks of {BLOCK}, alternately members and "
        f"non-members, the first window of each block dropped: {n} + {n}; shadow/reference "
        f"data: the other {len(users) - 1} training users' {len(pool):,} windows; test: the "
        f"{len(test):,} windows of the test users",
    )


def epochs_for(samples: int, epochs: int | None) -> int:
    """`epochs`, or enough of them for MIN_STEPS optimiser steps (the profiles' rule)."""
    return epochs or max(1, math.ceil(MIN_STEPS / math.ceil(samples / BATCH)))


def trainer(setup: Setup, split: Split, role: str, eps: float | None, epochs: int | None):
    """The client's recipe as an `audit.Trainer`: (x, y, seed) -> a trained model."""
    name = setup.classifier if role == "classifier" else setup.generator
    spec = make_spec(name, split.shape, split.num_classes)

    def fit(x: np.ndarray, y: np.ndarray, seed: int):
        model = init_model(spec, seed)
        dp = DPConfig(eps) if eps is not None else None
        lr = LR[role, dp is not None]
        # Seeded DP noise (a simulation's choice): the run repeats; a device draws it secretly.
        cfg = TrainConfig(
            epochs_for(len(y), epochs), BATCH, "adam", lr, seed=seed, dp=dp, noise_seed=seed
        )
        train(model, role, x, y, split.num_classes, cfg)
        return model

    return fit


def row(dataset, upload, eps, attack, metrics: audit.AttackMetrics, utility: str) -> dict:
    return {
        "dataset": dataset,
        "upload": upload,
        "epsilon": eps,
        "attack": attack,
        "metrics": metrics.as_dict(),
        "utility": utility,
    }


# attack -> (member scores, non-member scores) of one client; utility: "acc test" -> 0.93, ...
Scores = dict[str, tuple[np.ndarray, np.ndarray]]


def _queries(split: Split) -> tuple[np.ndarray, np.ndarray, int]:
    """Members then non-members as one query set, and where the non-members start."""
    x = np.concatenate([split.members[0], split.nonmembers[0]])
    y = np.concatenate([split.members[1], split.nonmembers[1]])
    return x, y, len(split.members[1])


def classifier_scores(setup, split, eps, args) -> tuple[Scores, dict[str, float]]:
    fit = trainer(setup, split, "classifier", eps, args.epochs)
    model = fit(*split.members, args.seed)
    parts = (("train", split.members), ("held-out", split.nonmembers), ("test", split.test))
    utility = {
        f"acc {part}": evaluate(model, "classifier", *data, split.num_classes)[0]
        for part, data in parts
    }
    qx, qy, n = _queries(split)
    loss = audit.loss_scores(model, qx, qy)
    shadow = audit.shadow_confidences(
        fit, *split.pool, qx, qy, shadows=args.shadows, size=n, seed=args.seed + 100
    )
    lira = audit.lira_offline_scores(audit.logit_confidence(model, qx, qy), shadow)
    return {
        "loss": (loss[:n], loss[n:]),
        f"LiRA offline, {args.shadows} shadows": (lira[:n], lira[n:]),
    }, utility


def decoder_scores(setup, split, eps, args) -> tuple[Scores, dict[str, float]]:
    fit = trainer(setup, split, "generator", eps, args.epochs)
    qx, qy, n = _queries(split)
    cvae = fit(*split.members, args.seed)
    # The attacker's reference: the same recipe on other data of the distribution.
    rng = np.random.default_rng(args.seed + 200)
    pick = rng.choice(len(split.pool[1]), n, replace=False)
    reference = fit(split.pool[0][pick], split.pool[1][pick], args.seed + 200)
    utility = {
        f"loss {part}": evaluate(cvae, "generator", *data, split.num_classes)[1]
        for part, data in (("train", split.members), ("held-out", split.nonmembers))
    }
    how = audit.Reconstruction(restarts=args.restarts, steps=args.steps)
    distances = {}
    for who, model in (("target", cvae), ("reference", reference)):
        distances[who, "reconstruction"] = audit.reconstruction_distances(
            model.decoder, qx, qy, split.num_classes, how, seed=args.seed
        )
        distances[who, "sample distance"] = audit.sample_distances(
            model.decoder, qx, qy, split.num_classes, samples=SAMPLES_PER_CLASS, seed=args.seed
        )
    scores = {}
    for attack in ("reconstruction", "sample distance"):
        for calibrated in (False, True):
            ref = distances["reference", attack] if calibrated else None
            s = audit.distance_scores(distances["target", attack], ref)
            scores[attack + (" (calibrated)" if calibrated else "")] = (s[:n], s[n:])
    return scores, utility


def pooled_rows(dataset, upload, eps, clients: list[tuple[Scores, dict]], seed) -> list[dict]:
    """One row per attack over every client's members and non-members together (each client's
    scores come from its own model); utility: the mean over the clients."""
    utility = {key: float(np.mean([u[key] for _, u in clients])) for key in clients[0][1]}
    text = ", ".join(
        f"{key} {value:.3f}" if key.startswith("acc") else f"{key} {value:.1f}"
        for key, value in utility.items()
    )
    rows = []
    for attack in clients[0][0]:
        members = np.concatenate([scores[attack][0] for scores, _ in clients])
        nonmembers = np.concatenate([scores[attack][1] for scores, _ in clients])
        metrics = audit.evaluate_attack(members, nonmembers, seed=seed)
        rows.append(row(dataset, upload, eps, attack, metrics, text))
    return rows


def label_count_rows(seed: int) -> list[dict]:
    """Each client's counts of half its data (the upload) against every client's counts of the
    other half: how often the nearest is its own, exact and under Laplace noise."""
    hapt = load_dataset("hapt")
    users = np.unique(hapt.groups)
    halves = []
    for part in (0, 1):  # HAPT: the first and the second half of each user's windows, in time
        counts = []
        for u in users:
            own = np.flatnonzero(hapt.groups == u)
            half = own[: len(own) // 2] if part == 0 else own[len(own) // 2 :]
            counts.append(np.bincount(hapt.y[half], minlength=hapt.num_classes))
        halves.append(np.stack(counts))
    mnist = load_dataset("mnist")
    rng = np.random.default_rng(seed)
    shards = partition(mnist.y, 10, "dirichlet:0.5", seed, num_classes=10)
    mnist_halves = [[], []]
    for shard in shards:  # MNIST: a random half of each Dir(0.5) client's shard and the rest
        shard = rng.permutation(shard)
        for part, idx in enumerate((shard[: len(shard) // 2], shard[len(shard) // 2 :])):
            mnist_halves[part].append(np.bincount(mnist.y[idx], minlength=10))
    federations = {
        f"hapt: {len(users)} training users, first vs second half of their windows": halves,
        "mnist: Dir(0.5) over 10 clients, a random half of each shard vs the rest": [
            np.stack(h) for h in mnist_halves
        ],
    }
    rows = []
    for name, (first, second) in federations.items():
        for eps in (None, *LINK_EPSILONS):
            released = first.astype(np.float64)
            if eps is not None:  # one sample moves one count by 1: L1 sensitivity 1
                released = released + rng.laplace(0.0, 1.0 / eps, released.shape)
                released = np.clip(released, 0.0, None) + 1e-9  # a histogram stays a histogram
            link = audit.histogram_linkage(released, second)
            rows.append({"federation": name, "epsilon": eps, **link.as_dict()})
    return rows


def header() -> dict:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    return {
        "command": " ".join(["python", "bench/bench_privacy.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared with other jobs), "
        f"{platform.platform()}",
        "commit": commit,
    }


def _eps(value) -> str:
    return "none" if value is None else f"{value:g}"


def _ci(value: float, ci) -> str:
    return f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def _verdict(value: float, ci, limit: float) -> str:
    """'met' / 'missed' when the whole interval is on one side of `limit`, else the estimate's
    side and that the interval straddles it (more queries would decide)."""
    if ci[1] <= limit:
        return "met"
    if ci[0] > limit:
        return "missed"
    side = "met" if value <= limit else "missed"
    return f"{side} by the estimate ({value:.3f}); the interval straddles {limit:g}"


def target_lines(rows: list[dict]) -> list[str]:
    """Issue 57's target checked on every attack at TARGET_EPSILON."""
    at = [r for r in rows if r["epsilon"] == TARGET_EPSILON]
    if not at:
        return []
    lines = [
        "",
        f"## Issue 57's target at epsilon {TARGET_EPSILON:g}: AUC <= {AUC_MAX:g} and "
        f"TPR@1%FPR <= {TPR_MAX:.0%}",
        "",
        "met / missed: the whole 95 % interval lies on that side of the limit.",
        "",
        f"| dataset | upload | attack | AUC <= {AUC_MAX:g} | TPR@1%FPR <= {TPR_MAX:.0%} |",
        "|---|---|---|---|---|",
    ]
    for r in at:
        m = r["metrics"]
        tpr = (
            _verdict(m["tpr"]["0.01"], m["tpr_ci"]["0.01"], TPR_MAX) if "0.01" in m["tpr"] else "-"
        )
        lines.append(
            f"| {r['dataset']} | {r['upload']} | {r['attack']} | "
            f"{_verdict(m['auc'], m['auc_ci'], AUC_MAX)} | {tpr} |"
        )
    return lines


def render(result: dict) -> str:
    head = result["header"]
    lines = [
        "# Membership inference against edgefl's uploads (issue 57, item 5)",
        "",
        f"`{head.get('command', '')}`; {head.get('date', '')}; {head.get('machine', '')}; "
        f"commit {head.get('commit', '')}"
        + (f"; {result['seconds']:.0f} s" if "seconds" in result else ""),
        "",
    ]
    for dataset, note in result.get("splits", {}).items():
        lines.append(f"- {dataset}: {note}")
    if result.get("settings"):
        lines += ["", f"Settings: {json.dumps(result['settings'])}"]
    lines += [
        "",
        "AUC and TPR with 95 % bootstrap intervals (1,000 resamples of members and non-members "
        "apart); TPR at 0.1 % FPR only where 1,000 non-members or more resolve it.",
        "",
        "| dataset | upload | epsilon | attack | AUC [95% CI] | TPR@1%FPR [95% CI] "
        "| TPR@0.1%FPR [95% CI] | utility |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        m = r["metrics"]
        tpr = {key: _ci(m["tpr"][key], m["tpr_ci"][key]) for key in m["tpr"]}
        lines.append(
            f"| {r['dataset']} | {r['upload']} | {_eps(r['epsilon'])} | {r['attack']} | "
            f"{_ci(m['auc'], m['auc_ci'])} | {tpr.get('0.01', '-')} | {tpr.get('0.001', '-')} | "
            f"{r['utility']} |"
        )
    lines += target_lines(result["rows"])
    if result.get("label_counts"):
        lines += [
            "",
            "## Label counts: does a client's histogram pick it out?",
            "",
            "Each client's counts of one half of its data (what it uploads) matched to the "
            "nearest (total variation of class proportions) of every client's counts of the other "
            "half; epsilon: the uploaded counts under the Laplace mechanism (scale 1/epsilon, "
            "sample-level sensitivity 1).",
            "",
            "| federation | epsilon | linked | rate | chance | unique exact histograms |",
            "|---|---|---|---|---|---|",
        ]
        for r in result["label_counts"]:
            # Noised counts are all distinct reals: uniqueness is read from the exact ones.
            unique = "-" if r["epsilon"] is not None else f"{r['unique']}/{r['clients']}"
            lines.append(
                f"| {r['federation']} | {_eps(r['epsilon'])} | {r['linked']}/{r['clients']} | "
                f"{r['rate']:.2f} | {r['chance']:.2f} | {unique} |"
            )
    if result.get("notes"):
        lines += ["", *result["notes"]]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results/privacy_audit", help="writes OUT.json, OUT.md")
    p.add_argument("--datasets", default="mnist,hapt")
    p.add_argument("--epsilons", default="none,8,4,1", help="'none' trains without DP")
    p.add_argument("--samples", type=int, default=1000, help="MNIST members (and non-members)")
    p.add_argument("--hapt-user", type=int, default=None, help="one HAPT user (a client)")
    p.add_argument(
        "--hapt-users",
        type=int,
        default=1,
        help="without --hapt-user: this many HAPT users with the most windows, each a client "
        "of its own, their scores pooled (narrower intervals; each user adds ~6 minutes)",
    )
    p.add_argument("--epochs", type=int, default=None, help="default: 300 optimiser steps")
    p.add_argument("--shadows", type=int, default=4, help="LiRA shadow models per setting")
    p.add_argument("--restarts", type=int, default=4, help="reconstruction: latent restarts")
    p.add_argument("--steps", type=int, default=100, help="reconstruction: Adam steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--render", metavar="JSON", help="only write the .md of a recorded run's JSON")
    args = p.parse_args(argv)
    args.datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    unknown = set(args.datasets) - set(SETUPS)
    if unknown:
        p.error(f"--datasets: unknown {sorted(unknown)}; known: {', '.join(SETUPS)}")
    try:
        args.epsilons = [
            None if e.strip() == "none" else float(e) for e in args.epsilons.split(",")
        ]
    except ValueError:
        p.error(f"--epsilons: numbers or none, comma-separated (got {args.epsilons!r})")
    if any(e is not None and not 0 < e < math.inf for e in args.epsilons):
        p.error("--epsilons: each must be a number > 0 (or none: no DP), e.g. none,8,4,1")
    # said now, not after the settings before the bad one have trained
    for flag, value, low in (
        ("--samples", args.samples, 1),
        ("--shadows", args.shadows, 2),  # LiRA fits a Gaussian to the shadows' scores
        ("--restarts", args.restarts, 1),
        ("--steps", args.steps, 1),
        ("--hapt-users", args.hapt_users, 1),
    ):
        if value < low:
            p.error(f"{flag} must be >= {low}, got {value}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.render:
        recorded = Path(args.render)
        recorded.with_suffix(".md").write_text(render(json.loads(recorded.read_text())))
        return
    start = time.perf_counter()
    result = {
        "header": header(),
        "settings": {
            "samples": args.samples,
            "epochs": args.epochs or f"enough for {MIN_STEPS} steps",
            "batch": BATCH,
            "optimizer": "adam",
            "lr": {f"{role}{' DP' if dp else ''}": lr for (role, dp), lr in LR.items()},
            "shadows": args.shadows,
            "reconstruction": {"restarts": args.restarts, "steps": args.steps},
            "samples_per_class": SAMPLES_PER_CLASS,
            "seed": args.seed,
        },
        "splits": {},
        "rows": [],
    }
    with one_thread():  # as a device trains; two threads on two busy cores only wait
        for name in args.datasets:
            setup = SETUPS[name]
            if name == "mnist":
                splits = [mnist_split(args.samples, args.seed)]
            else:  # each user its own client, with its own models; the scores pooled
                splits = [hapt_split(u) for u in hapt_users(args.hapt_user, args.hapt_users)]
            result["splits"][name] = " | ".join(split.note for split in splits)
            for eps in args.epsilons:
                t0 = time.perf_counter()
                for upload, scores in (("classifier", classifier_scores),
                                       ("CVAE decoder", decoder_scores)):  # fmt: skip
                    clients = [scores(setup, split, eps, args) for split in splits]
                    result["rows"] += pooled_rows(name, upload, eps, clients, args.seed)
                print(f"{name} epsilon {_eps(eps)}: {time.perf_counter() - t0:.0f} s", flush=True)
        result["label_counts"] = label_count_rows(args.seed)
    result["seconds"] = time.perf_counter() - start
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(render(result))
    print(render(result))


if __name__ == "__main__":
    main()
