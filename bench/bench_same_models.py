"""Behaviour unchanged across a refactor (issue 58): the digits check's models at two commits.

Runs `edgefl demo --quick` (the README's first command at smoke size: 10 MNIST clients, every
FedMHO-paper method; `--full`: the whole demo) from a detached worktree of each commit, one client at a time, and compares
every ONNX file the runs wrote: each global model byte for byte (SHA-256 of the file), each
upload by its graph, weights and metadata with the training's wall-clock seconds left out (the
only field that differs between two runs of one commit). A refactor that moves code without
changing behaviour gives the same fingerprints for every file.

    python bench/bench_same_models.py --commits 5b19113,HEAD --out bench/results/same_models
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _record import ROOT, run_header, write_record

# Upload metadata that measures the run rather than states what it made.
TIMING = ("seconds",)
CLI = "import sys; from edgefl.cli import main; sys.argv[0] = 'edgefl'; sys.exit(main())"


def fingerprint(path: Path) -> str:
    """A global model: its file's SHA-256. An upload: the SHA-256 of its graph and weights and
    of its metadata with every timing field removed."""
    if path.parent.name != "uploads":
        return hashlib.sha256(path.read_bytes()).hexdigest()
    import onnx

    model = onnx.load(str(path))
    meta = {p.key: p.value for p in model.metadata_props}
    del model.metadata_props[:]
    record = {k: _untimed(json.loads(v)) if k == "edgefl" else v for k, v in meta.items()}
    digest = hashlib.sha256(model.SerializeToString(deterministic=True))
    digest.update(json.dumps(record, sort_keys=True).encode())
    return digest.hexdigest()


def _untimed(value):
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def weights_fingerprint(path: Path) -> str:
    """The SHA-256 of a file's graph and weights alone (its metadata left out): what two commits
    that record different metadata (a field added) still share when they compute the same."""
    import onnx

    model = onnx.load(str(path))
    del model.metadata_props[:]
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


def fingerprints(run: Path) -> dict[str, str]:
    """file -> "FINGERPRINT WEIGHTS_FINGERPRINT" for every ONNX file of a run."""
    return {
        str(p.relative_to(run)): f"{fingerprint(p)} {weights_fingerprint(p)}"
        for p in sorted(run.rglob("*.onnx"))
    }


def demo_at(commit: str, scratch: Path, quick: bool = True) -> tuple[str, dict[str, str]]:
    """The full commit id and the fingerprints of `edgefl demo [--quick]` run at it."""
    full = _git("rev-parse", commit)
    tree = scratch / f"tree-{full[:10]}"
    _git("worktree", "add", "--detach", "--force", str(tree), full)
    try:
        run = scratch / f"run-{full[:10]}"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        size = ["--quick"] if quick else []
        argv = [sys.executable, "-c", CLI, "demo", *size, "--jobs", "1", "--out", str(run)]
        done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"demo at {commit} failed:\n{done.stderr[-3000:]}")
        return full, fingerprints(run)
    finally:
        _git("worktree", "remove", "--force", str(tree))


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def compare(runs: dict[str, dict[str, str]]) -> list[dict]:
    """One row a file: its fingerprint at each commit and whether they all agree."""
    names = sorted(set().union(*(r.keys() for r in runs.values())))
    rows = []
    for name in names:
        prints = {c: r.get(name) for c, r in runs.items()}
        weights = {(p or "- missing").split()[1] for p in prints.values()}
        rows.append(
            {
                "file": name,
                "prints": prints,
                "same": len(set(prints.values())) == 1,
                "same_weights": len(weights) == 1 and "missing" not in weights,
            }
        )
    return rows


def markdown(meta: dict, rows: list[dict]) -> str:
    commits = meta["commits"]
    head = "| file | " + " | ".join(c[:10] for c in commits) + " | same | same weights |"
    lines = [
        "# The digits check's models at two commits (bench/bench_same_models.py)",
        "",
        f"`{meta['command']}`, {meta['date']}, {meta['machine']}.",
        "",
        head,
        "|---|" + "---|" * len(commits) + ":-:|:-:|",
    ]
    for r in rows:
        prints = " | ".join((r["prints"][c] or "missing")[:12] for c in commits)
        weights = "yes" if r.get("same_weights", r["same"]) else "NO"
        lines.append(f"| {r['file']} | {prints} | {'yes' if r['same'] else 'NO'} | {weights} |")
    same = sum(r["same"] for r in rows)
    weights = sum(r.get("same_weights", r["same"]) for r in rows)
    lines += [
        "",
        f"{same} of {len(rows)} files the same at every commit; {weights} of {len(rows)} with "
        "the same graph and weights (their metadata aside).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", default="HEAD~1,HEAD", help="commits to compare, e.g. A,B")
    ap.add_argument("--out", default="bench/results/same_models", help="STEM of STEM.json/.md")
    ap.add_argument(
        "--full", action="store_true", help="the full demo (older commits lack --quick)"
    )
    args = ap.parse_args()
    meta = run_header("bench/bench_same_models.py")
    runs = {}
    with tempfile.TemporaryDirectory() as scratch:
        for commit in args.commits.split(","):
            full, prints = demo_at(commit.strip(), Path(scratch), quick=not args.full)
            runs[full] = prints
            print(f"{commit}: {len(prints)} models", flush=True)
    meta["commits"] = list(runs)
    rows = compare(runs)
    write_record(args.out, meta, rows, markdown(meta, rows))
    print(markdown(meta, rows))
    sys.exit(0 if all(r["same"] for r in rows) else 1)


if __name__ == "__main__":
    main()
