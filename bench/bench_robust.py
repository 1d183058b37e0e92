"""Robust one-shot fusion against poisoned clients (issue 18): MNIST, 10 clients (5 `cnn`
classifiers + 5 `cvae-small` CVAEs, the FedMHO paper's prototypes), Dir(0.5); per seed a clean
run and, for each attack kind, runs with 2 and 4 attackers (`simulate --attack KIND:N`); every
federation fused by fedmho, ensemble and feddf with and without `--robust screen`.

Honest clients are the same in every run of a seed (same data, seed and settings), so each is
trained once: the clean run's uploads are copied into every attacked run, and the 2 attackers
of a kind into its 4-attacker run; only new attackers train. Targets: with 2 attackers of each
kind, robust fusion within 2 points of the clean run; with 0, robust costs <= 0.5 point.

    python bench/bench_robust.py --out bench/results/robust [--seeds 0,1,2] [--kinds ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EDGEFL = Path(sys.executable).parent / "edgefl"
METHODS = "fedmho,ensemble,feddf"
KINDS = "flip,flip@cvae,swap,random,scale,invert,noise"
MIX = "smartphone:5,wristband:5"


def simulate(out: Path, seed: int, attack: str, robust: bool, args) -> dict:
    argv = [
        str(EDGEFL),
        "simulate",
        "--dataset",
        "mnist",
        "--clients",
        "10",
        "--mix",
        MIX,
        "--paper-models",
        "--partition",
        "dirichlet:0.5",
        "--methods",
        METHODS,
        "--seed",
        str(seed),
        "--classifier-epochs",
        str(args.classifier_epochs),
        "--generator-epochs",
        str(args.generator_epochs),
        "--jobs",
        str(args.jobs),
        "--out",
        str(out),
        "--json",
        "--quiet",
    ]
    if attack:
        argv += ["--attack", attack]
    if robust:
        argv += ["--fuse-opt", "all:robust=screen"]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"simulate failed ({out}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    rep = json.loads(r.stdout)
    if "results" not in rep:
        sys.exit(f"simulate gave no results ({out}):\n{r.stdout[-3000:]}")
    return rep


def seed_uploads(src: Path, dst: Path, attackers: dict[str, str]) -> None:
    """Copy the uploads a run can reuse: every client that is not an attacker of this run (the
    clean run's), and `attackers.json` first so simulate accepts them."""
    (dst / "uploads").mkdir(parents=True, exist_ok=True)
    (dst / "attackers.json").write_text(json.dumps(attackers, indent=2))
    for f in (src / "uploads").glob("client-*.onnx"):
        if f.stem not in attackers:
            shutil.copy2(f, dst / "uploads" / f.name)


def _attacked(work: Path, seed: int, kind: str, n: int) -> Path:
    """The folder of a seed's runs with n attackers of a kind (its plain/ and robust/ runs)."""
    return work / f"s{seed}" / f"{kind.replace('@', '-')}-{n}"


def _plain(work: Path, seed: int, kind: str, n: int) -> tuple[Path, dict[str, str]]:
    """A run without the screen (the clean run for kind none) and its attackers."""
    if kind == "none":
        return work / f"s{seed}" / "clean", {}
    run = _attacked(work, seed, kind, n) / "plain"
    return run, json.loads((run / "attackers.json").read_text())


def honest_only(seed: int, kind: str, n: int, work: Path) -> dict:
    """The bound of a defence that drops attackers: the run's honest uploads alone, fused by
    `server fuse` with each method's options as that run used them."""
    run, attackers = _plain(work, seed, kind, n)
    honest = work / f"s{seed}" / f"honest-{_attacked(work, seed, kind, n).name}"
    shutil.rmtree(honest, ignore_errors=True)
    seed_uploads(run, honest, attackers)
    argv = [
        str(EDGEFL),
        "server",
        "fuse",
        str(honest / "uploads"),
        "--method",
        METHODS,
        "--out-dir",
        str(honest / "global"),
        "--eval",
        "mnist",
        "--json",
        "--quiet",
    ]
    for m in METHODS.split(","):
        cfg = json.loads((run / "global" / f"{m}.json").read_text())["config"]
        argv += [
            a
            for k, v in cfg.items()
            if v is not None and k != "robust"
            for a in ("--opt", f"{m}:{k}={v}")
        ]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"server fuse failed ({honest}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    reports = json.loads(r.stdout)
    return {
        "seed": seed,
        "kind": kind,
        "count": n,
        "robust": "honest",
        "accuracy": {m: rep.get("accuracy") for m, rep in reports.items()},
        "attackers": attackers,
        "screened": {},
    }


def robust_again(seed: int, kind: str, n: int, work: Path, args) -> dict:
    """A robust run fused afresh on the uploads of its plain run (the same clients, the same
    attackers): for a screen changed after the uploads were made."""
    run, attackers = _plain(work, seed, kind, n)
    out = run.parent / ("clean-robust" if kind == "none" else "robust")
    shutil.rmtree(out, ignore_errors=True)
    seed_uploads(run, out, {})  # every upload, the attackers' too
    (out / "attackers.json").write_text(json.dumps(attackers, indent=2))
    t = time.monotonic()
    rep = simulate(out, seed, f"{kind}:{n}" if kind != "none" else "", True, args)
    return _row(seed, kind, n, True, rep) | {"wall_s": time.monotonic() - t}


def attackers_of(attack: str, seed: int) -> dict[str, str]:
    from edgefl.client.attacks import parse_attacks
    from edgefl.simulate.job import SimJob
    from edgefl.simulate.run import client_jobs

    job = SimJob(
        dataset="mnist",
        clients=10,
        mix=MIX,
        paper_models=True,
        seed=seed,
        attacks=parse_attacks(attack) if attack else {},
    )
    return {f"client-{c.client_index:03d}": c.sim.attack for c in client_jobs(job) if c.sim.attack}


def run_seed(seed: int, work: Path, kinds: list[str], counts: list[int], args) -> list[dict]:
    rows = []
    clean = work / f"s{seed}" / "clean"
    for robust in (False, True):
        out = clean if not robust else work / f"s{seed}" / "clean-robust"
        if robust:  # fresh, so its fusion runs with today's screen (simulate keeps results)
            shutil.rmtree(out, ignore_errors=True)
            seed_uploads(clean, out, {})
        rep = simulate(out, seed, "", robust, args)
        rows.append(_row(seed, "none", 0, robust, rep))
    for kind in kinds:
        prev = None
        for n in counts:
            attack = f"{kind}:{n}"
            who = attackers_of(attack, seed)
            for robust in (False, True):
                out = _attacked(work, seed, kind, n) / ("robust" if robust else "plain")
                shutil.rmtree(out, ignore_errors=True)
                seed_uploads(clean, out, who)
                donor = (out.parent / "plain") if robust else prev
                if donor is not None:  # attackers already trained (the plain run, or n-2)
                    theirs = json.loads((donor / "attackers.json").read_text())
                    for cid in who:  # only those that attacked there too, the same way
                        f = donor / "uploads" / f"{cid}.onnx"
                        if theirs.get(cid) == who[cid] and f.exists():
                            shutil.copy2(f, out / "uploads" / f.name)
                t = time.monotonic()
                rep = simulate(out, seed, attack, robust, args)
                rows.append(_row(seed, kind, n, robust, rep) | {"wall_s": time.monotonic() - t})
                print(
                    json.dumps(
                        {
                            k: rows[-1][k]
                            for k in ("seed", "kind", "count", "robust", "accuracy", "screened")
                        }
                    ),
                    flush=True,
                )
            prev = out.parent / "plain"
    return rows


def _row(seed, kind, n, robust, rep) -> dict:
    out = Path(rep["job"]["out"])
    screened, repaired = {}, {}
    for m in METHODS.split(","):
        path = out / "global" / f"{m}.json"
        if path.exists():
            fused = json.loads(path.read_text())
            screened[m] = [s["client_id"] for s in fused.get("screened", [])]
            # robust_notes: "<client>: outputs repaired (...)" / "<client>: logits divided by"
            repaired[m] = [
                n.split(":")[0]
                for n in fused.get("robust_notes", [])
                if ": outputs repaired" in n or ": logits divided" in n
            ]
    return {
        "seed": seed,
        "kind": kind,
        "count": n,
        "robust": robust,
        "accuracy": {r["method"]: r["accuracy"] for r in rep["results"]},
        "attackers": {c["client_id"]: c["attack"] for c in rep["clients"] if c.get("attack")},
        "screened": screened,
        "repaired": repaired,  # used changed: relabelled, negated or tempered
    }


def markdown(rows: list[dict], meta: dict) -> str:
    methods = METHODS.split(",")
    seeds = sorted({r["seed"] for r in rows})

    def mean(kind, n, robust, m):
        v = [
            r["accuracy"].get(m)
            for r in rows
            if (r["kind"], r["count"], r["robust"]) == (kind, n, robust)
        ]
        v = [x for x in v if x is not None]
        return (100 * float(np.mean(v)), len(v)) if v else (None, 0)

    said = [f"{meta['date_utc']}, {meta['machine']}; `{meta['command']}`"]
    if "robust_again" in meta:
        again = meta["robust_again"]
        said.append(
            f"robust runs fused again with the screen as it landed {again['date_utc']}: "
            f"`{again['command']}`" + (f" (code at {again['code']})" if "code" in again else "")
        )
    if "honest_only" in meta:
        said.append(
            f"honest-only bound {meta['honest_only']['date_utc']}: "
            f"`{meta['honest_only']['command']}`"
        )
    lines = [
        "# Poisoned clients and robust fusion (bench/bench_robust.py)",
        "",
        "; ".join(said) + ".",
        "MNIST, 10 clients (5 `cnn` classifiers, 5 `cvae-small` CVAEs), Dir(0.5), seeds "
        f"{', '.join(map(str, seeds))}; top-1 % on the MNIST test split, mean over seeds; "
        "plain / robust (`--robust screen`) / honest only (the run's attackers removed before "
        "fusing: the best a defence that drops them can reach; only one that repairs an upload "
        "can pass it), and in brackets robust minus the clean run (no attacker, no screen).",
        "",
        "| attack | attackers | "
        + " | ".join(f"{m} plain / robust / honest only (robust vs clean)" for m in methods)
        + " |",
        "|---|---:|" + "---|" * len(methods),
    ]
    keys = sorted({(r["kind"], r["count"]) for r in rows}, key=lambda k: (k[0] != "none", k))
    for kind, n in keys:
        cells = []
        for m in methods:
            plain, _ = mean(kind, n, False, m)
            rob, _ = mean(kind, n, True, m)
            clean, _ = mean("none", 0, False, m)
            if plain is None or rob is None or clean is None:
                cells.append("-")
                continue
            honest, _ = mean(kind, n, "honest", m)
            bound = f" / {honest:.2f}" if honest is not None else " / -"
            cells.append(f"{plain:.2f} / {rob:.2f}{bound} ({rob - clean:+.2f})")
        lines.append(f"| {kind} | {n} | " + " | ".join(cells) + " |")
    lines += ["", "Screened out / used repaired or tempered (robust runs), per seed:"]

    def verdicts(r):
        return "; ".join(
            f"{m}: {', '.join(v) or 'none'} / "
            f"{', '.join(r.get('repaired', {}).get(m, [])) or 'none'}"
            for m, v in r["screened"].items()
        )

    for r in rows:
        if r["robust"] is True and r["kind"] != "none":
            lines.append(
                f"- seed {r['seed']} {r['kind']}:{r['count']} (attackers "
                f"{', '.join(sorted(r['attackers']))}): {verdicts(r)}"
            )
    for r in rows:
        if r["robust"] is True and r["kind"] == "none":
            lines.append(f"- seed {r['seed']} clean run: {verdicts(r)}")
    return "\n".join(lines) + "\n"


def _commit() -> str:
    """The commit of the code this run measured (the bench is run from a clone of it), marked
    -dirty when tracked files other than the results it writes differ from it."""

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)

    head = git("rev-parse", "--short", "HEAD")
    if head.returncode != 0:
        return "unknown"
    changed = git(
        "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results"
    )
    return head.stdout.strip() + ("-dirty" if changed.stdout.strip() else "")


def _save(saved: dict, what: str, out: str) -> None:
    """Record which pass changed the rows (when, with what command), then OUT.json and OUT.md."""
    saved["meta"][what] = {
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python bench/bench_robust.py " + " ".join(sys.argv[1:]),
        "code": _commit(),
    }
    Path(f"{out}.json").write_text(json.dumps(saved, indent=2))
    Path(f"{out}.md").write_text(markdown(saved["rows"], saved["meta"]))


# --- Clean federations (issue 55, item 6): does the screen keep every honest upload? ---------
# Each federation mixes weak clients (WEAK optimiser steps) with strong ones (STRONG steps),
# every other client of each device class, so a rule relative to the median client meets
# both. No attacker: whatever the screen sets aside is an honest upload.
WEAK, STRONG = 100, 500  # 100: the clients issue 55 saw screened (bench/results/scale.md)
CLEAN = {
    "mnist-d05": dict(
        dataset="mnist",
        partition="dirichlet:0.5",
        clients=20,
        mix="smartphone:10,wristband:10",
        paper_models=True,
        subset=12_000,
    ),
    "mnist-d01": dict(
        dataset="mnist",
        partition="dirichlet:0.1",
        clients=20,
        mix="smartphone:10,wristband:10",
        paper_models=True,
        subset=12_000,
    ),
    # bench_hapt's federation: 1,000 windows of whole users public, one client per other user
    "hapt-users": dict(
        dataset="hapt",
        partition="user",
        clients=18,
        mix="smartphone:9,wristband:9",
        public_size=1_000,
    ),
}
CLEAN_METHODS = "ensemble,fedmho"


def clean_jobs(name: str, seed: int, out: Path, steps: tuple[int, int] = (WEAK, STRONG)) -> list:
    """The federation's client jobs as `simulate` makes them, each given WEAK or STRONG steps
    (epochs for its shard's size; at least one)."""
    from dataclasses import replace

    from edgefl.client.run import client_shard
    from edgefl.data import load_dataset
    from edgefl.profiles import get_profile
    from edgefl.simulate.job import SimJob
    from edgefl.simulate.run import client_jobs

    job = SimJob(**CLEAN[name], seed=seed, out=str(out))
    jobs = client_jobs(job)
    data = load_dataset(jobs[0].dataset, "train")
    out_jobs, seen = [], {}
    for cj in jobs:
        k = seen[cj.profile] = seen.get(cj.profile, -1) + 1
        n = steps[k % 2]
        batch = cj.batch_size or get_profile(cj.profile).batch_size
        train = max(1, round(0.9 * len(client_shard(cj, data))))  # the 10 % kept for val
        epochs = max(1, math.ceil(n / math.ceil(train / batch)))
        out_jobs.append((replace(cj, epochs=epochs, force=True), n))
    return out_jobs


def _train_clean(args: tuple) -> dict:
    from edgefl.client.run import run_client
    from edgefl.training import one_thread

    cj, steps = args
    with one_thread():
        r = run_client(cj)
    return {
        "client_id": r.client_id,
        "role": r.role,
        "profile": cj.profile,
        "planned_steps": steps,
        "epochs": cj.epochs,
        "samples": r.summary.samples,
        "val_accuracy": r.summary.val_accuracy,
    }


def fuse_clean(uploads: Path, out: Path, dataset: str, robust: bool) -> dict:
    """`server fuse` of CLEAN_METHODS on the uploads, with or without the screen."""
    argv = [
        str(EDGEFL),
        "server",
        "fuse",
        str(uploads),
        "--method",
        CLEAN_METHODS,
        "--out-dir",
        str(out),
        "--eval",
        f"{dataset}:test",
        "--json",
        "--quiet",
    ]
    if robust:
        argv += ["--robust", "screen"]
    t = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"server fuse failed ({out}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    reports = json.loads(r.stdout)
    return {
        "wall_s": time.monotonic() - t,
        "accuracy": {m: rep.get("accuracy") for m, rep in reports.items()},
        "screened": {
            m: {s["client_id"]: s["reason"] for s in rep.get("screened", [])}
            for m, rep in reports.items()
        },
        "notes": {m: rep.get("robust_notes", []) for m, rep in reports.items()},
    }


def clean_run(name: str, seed: int, work: Path, jobs: int, steps: tuple[int, int]) -> dict:
    """One clean federation: its clients trained (kept if already made), fused plain and
    screened."""
    from concurrent.futures import ProcessPoolExecutor

    run = work / "clean" / f"{name}-s{seed}-{steps[0]}-{steps[1]}"
    todo = clean_jobs(name, seed, run, steps)
    made = run / "clients.json"
    if made.exists():
        clients = json.loads(made.read_text())
    else:
        shutil.rmtree(run / "uploads", ignore_errors=True)
        with ProcessPoolExecutor(jobs) as pool:
            clients = list(pool.map(_train_clean, todo))
        made.write_text(json.dumps(clients, indent=1))
    dataset = CLEAN[name]["dataset"]
    plain = fuse_clean(run / "uploads", run / "plain", dataset, False)
    robust = fuse_clean(run / "uploads", run / "robust", dataset, True)
    return {"federation": name, "seed": seed, "clients": clients, "plain": plain, "robust": robust}


def clean_markdown(rows: list[dict], meta: dict) -> str:
    methods = CLEAN_METHODS.split(",")
    lines = [
        "# The robust screen on clean federations (bench/bench_robust.py --clean)",
        "",
        f"{meta['date_utc']}, {meta['machine']}, commit {meta['code']}; `{meta['command']}`.",
        "No attacker: every upload is honest. Each federation mixes weak clients and strong "
        "ones (optimiser steps in the table), every other client of each device class; "
        "`--paper-models` on MNIST (`cnn` phones, `cvae-small` bands; 12,000 training images), "
        "the planner's models on HAPT (one client per user, 1,000 windows of whole users "
        "public). Top-1 % on the test split; set aside: uploads the screen left out (all "
        "honest).",
        "",
        "| federation | seed | steps weak / strong | uploads | "
        + " | ".join(f"{m} plain / screened (cost)" for m in methods)
        + " | set aside | used changed |",
        "|---|---:|---|---:|" + "---|" * len(methods) + "---|---|",
    ]
    for r in rows:
        cells = []
        for m in methods:
            p, s = r["plain"]["accuracy"].get(m), r["robust"]["accuracy"].get(m)
            cells.append(
                "-"
                if p is None or s is None
                else f"{100 * p:.2f} / {100 * s:.2f} ({100 * (p - s):+.2f})"
            )
        out = sorted({c for v in r["robust"]["screened"].values() for c in v})
        changed = sorted(
            {
                n.split(":")[0]
                for v in r["robust"]["notes"].values()
                for n in v
                if ": outputs repaired" in n or ": logits divided" in n or ": draws repaired" in n
            }
        )
        weak_steps, strong_steps = r["steps"]
        weak = {c["client_id"] for c in r["clients"] if c["planned_steps"] == weak_steps}
        lines.append(
            f"| {r['federation']} | {r['seed']} | {weak_steps} / {strong_steps} | "
            f"{len(r['clients'])} | "
            + " | ".join(cells)
            + f" | {len(out)}"
            + (f" ({', '.join(c + (' weak' if c in weak else '') for c in out)})" if out else "")
            + f" | {', '.join(changed) or 'none'} |"
        )
    lines += ["", "Why each set-aside upload was left out (screened runs):"]
    for r in rows:
        for m, who in r["robust"]["screened"].items():
            for c, why in who.items():
                lines.append(f"- {r['federation']} seed {r['seed']} {m}: {c}: {why}")
    lines += ["", "Clients (local validation accuracy of the classifiers, weak / strong):"]
    for r in rows:
        acc = {
            s: [
                100 * c["val_accuracy"]
                for c in r["clients"]
                if c["planned_steps"] == s and c["val_accuracy"] is not None
            ]
            for s in r["steps"]
        }
        lines.append(
            f"- {r['federation']} seed {r['seed']}, {r['steps'][0]} / {r['steps'][1]} steps: "
            + "; ".join(
                f"{s} steps: {np.mean(v):.1f}% (min {min(v):.1f}%)" for s, v in acc.items() if v
            )
        )
    return "\n".join(lines) + "\n"


def clean_main(args) -> None:
    meta = {
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": args.machine,
        "command": "python bench/bench_robust.py " + " ".join(sys.argv[1:]),
        "code": _commit(),
    }
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for name in args.federations.split(","):
            steps = (args.weak_steps, args.strong_steps)
            rows.append(clean_run(name, seed, Path(args.work), args.jobs, steps) | {"steps": steps})
            r = rows[-1]
            print(
                json.dumps(
                    {
                        "federation": name,
                        "seed": seed,
                        "plain": r["plain"]["accuracy"],
                        "robust": r["robust"]["accuracy"],
                        "screened": r["robust"]["screened"],
                    }
                ),
                flush=True,
            )
            Path(f"{args.out}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
            Path(f"{args.out}.md").write_text(clean_markdown(rows, meta))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--kinds", default=KINDS)
    ap.add_argument("--counts", default="2,4")
    ap.add_argument("--classifier-epochs", type=int, default=5)
    ap.add_argument("--generator-epochs", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--work", default="/tmp/bench-robust")
    ap.add_argument("--out", default=str(ROOT / "bench/results/robust"))
    ap.add_argument("--render", action="store_true", help="only rewrite OUT.md from OUT.json")
    ap.add_argument(
        "--honest-only",
        action="store_true",
        help="only add the honest-only bound (2 attackers) to OUT.json's runs",
    )
    ap.add_argument(
        "--robust-only",
        action="store_true",
        help="only fuse OUT.json's robust runs again (those of --seeds, --kinds and --counts, "
        "and the clean run), on their plain runs' uploads",
    )
    ap.add_argument(
        "--clean",
        action="store_true",
        help="the clean federations (no attacker, weak and strong clients): what the screen "
        "sets aside and costs; writes OUT (default bench/results/robust_clean)",
    )
    ap.add_argument("--federations", default=",".join(CLEAN))
    ap.add_argument("--weak-steps", type=int, default=WEAK)
    ap.add_argument("--strong-steps", type=int, default=STRONG)
    ap.add_argument("--machine", default=f"{platform.machine()}, {os.cpu_count()} CPUs")
    args = ap.parse_args()
    if args.clean:
        if args.out == str(ROOT / "bench/results/robust"):
            args.out = str(ROOT / "bench/results/robust_clean")
        clean_main(args)
        return
    if args.robust_only:
        saved = json.loads(Path(f"{args.out}.json").read_text())
        counts = {0, *(int(c) for c in args.counts.split(","))}  # the clean run always
        kinds = {"none", *args.kinds.split(",")}
        seeds = {int(s) for s in args.seeds.split(",")}
        for i, r in enumerate(saved["rows"]):
            chosen = r["count"] in counts and r["kind"] in kinds and r["seed"] in seeds
            if r["robust"] is True and chosen:
                saved["rows"][i] = robust_again(
                    r["seed"], r["kind"], r["count"], Path(args.work), args
                )
                print(
                    json.dumps(
                        {k: saved["rows"][i][k] for k in ("seed", "kind", "count", "accuracy")}
                    ),
                    flush=True,
                )
                Path(f"{args.out}.json").write_text(json.dumps(saved, indent=2))
        _save(saved, "robust_again", args.out)
        return
    if args.render or args.honest_only:
        saved = json.loads(Path(f"{args.out}.json").read_text())
        if args.honest_only:
            saved["rows"] = [r for r in saved["rows"] if r["robust"] != "honest"]
            keys = sorted(
                {(r["seed"], r["kind"], r["count"]) for r in saved["rows"] if r["count"] in (0, 2)}
            )
            for seed, kind, n in keys:
                saved["rows"].append(honest_only(seed, kind, n, Path(args.work)))
                print(json.dumps(saved["rows"][-1]["accuracy"] | {"seed": seed, "kind": kind}))
            _save(saved, "honest_only", args.out)
            return
        Path(f"{args.out}.md").write_text(markdown(saved["rows"], saved["meta"]))
        return
    meta = {
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "command": "python bench/bench_robust.py " + " ".join(sys.argv[1:]),
    }
    rows: list[dict] = []
    for seed in (int(s) for s in args.seeds.split(",")):
        rows += run_seed(
            seed,
            Path(args.work),
            args.kinds.split(","),
            [int(c) for c in args.counts.split(",")],
            args,
        )
        Path(f"{args.out}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
        Path(f"{args.out}.md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))


if __name__ == "__main__":
    main()
