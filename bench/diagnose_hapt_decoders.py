"""What a wristband's decoder upload keeps of the activity (issue 32 item 1): its samples beside
the real windows of the same users, class by class.

For a simulate run on hapt (its `uploads/` holding phone classifiers and band decoders), each
decoder draws N windows per class (as the server does: z ~ N(0, I), the class one-hot, the
decoder's Bernoulli means). For each class, real windows of the decoders' own users (from the
train split, by the `user` each upload names) and the draws are compared on:

    gravity   the mean of each acc axis over a window, in g (the device's orientation: it
              separates sitting, standing and lying, which barely move)
    energy    the std of each axis within a window, in g (how much the body moves)
    spectrum  the share of each axis' power (gravity removed) in 0.4-1, 1-3, 3-8 and 8-25 Hz
              (walking's step rate sits near 2 Hz, stairs a little below)
    labelled  how the phones' logit ensemble labels them (top-1 against the class drawn), the
              same for the real windows: what a classifier-based method can learn from them

    python bench/diagnose_hapt_decoders.py RUN_DIR [--per-class 200] [--out bench/results/X]

Writes OUT.json and OUT.md (command, date, machine, code commit).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from edgefl.client.sample import decode
from edgefl.data import load_dataset
from edgefl.data.hapt import ACC_RANGE, HAPT_ACTIVITIES
from exporters import read_artifact

RATE = 50.0  # Hz
BANDS = ((0.4, 1.0), (1.0, 3.0), (3.0, 8.0), (8.0, 25.0))


def to_g(x: np.ndarray) -> np.ndarray:
    """Scaled acc windows (N, C, 1, L) in [0, 1] back to g (hapt's fixed map)."""
    return x[:, :3, 0, :] * (2 * ACC_RANGE) - ACC_RANGE


def stats(x: np.ndarray) -> dict:
    g = to_g(x)
    gravity = g.mean(axis=2)  # (N, 3)
    moving = g - gravity[:, :, None]
    power = np.abs(np.fft.rfft(moving, axis=2)) ** 2
    freqs = np.fft.rfftfreq(g.shape[2], d=1 / RATE)
    total = power.sum(axis=2) + 1e-12
    shares = [(power[:, :, (freqs >= lo) & (freqs < hi)].sum(axis=2) / total) for lo, hi in BANDS]
    return {
        "gravity": gravity.mean(axis=0).round(3).tolist(),
        "gravity_spread": gravity.std(axis=0).round(3).tolist(),
        "energy": moving.std(axis=2).mean(axis=0).round(3).tolist(),
        "band_shares": np.stack(shares, axis=-1).mean(axis=0).round(3).tolist(),  # (3, bands)
    }


def ensemble_logits(phones: list, x: np.ndarray) -> np.ndarray:
    return np.mean([p.run(x) for p in phones], axis=0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a simulate --out on hapt (holding uploads/)")
    ap.add_argument("--per-class", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench/results/hapt_decoders"))
    args = ap.parse_args(argv)

    arts = [read_artifact(p) for p in sorted((args.run / "uploads").glob("*.onnx"))]
    phones = [a for a in arts if a.metadata["kind"] == "classifier"]
    bands = [a for a in arts if a.metadata["kind"] == "decoder"]
    users = [(a.metadata.get("partition") or {}).get("user") for a in bands]
    data = load_dataset("hapt")
    if None in users:  # a run before uploads named their user: the scheme's list, in order
        scheme = bands[0].metadata["partition"]["scheme"]
        named = [int(u) for u in scheme.split(":", 1)[1].split(",")]
        users = [named[a.metadata["partition"]["client_index"]] for a in bands]
    rng = np.random.default_rng(args.seed)
    classes = len(HAPT_ACTIVITIES)
    rows = []
    confusion = {
        "real": np.zeros((classes, classes), int),
        "drawn": np.zeros((classes, classes), int),
    }
    for c, name in enumerate(HAPT_ACTIVITIES):
        real_idx = np.flatnonzero(np.isin(data.groups, users) & (data.y == c))
        real = data.x[real_idx]
        holders = [a for a in bands if a.metadata["label_counts"][c] > 0]
        per = max(1, args.per_class // max(1, len(holders)))
        drawn = (
            np.concatenate([decode(a, np.full(per, c), rng) for a in holders])
            if holders
            else np.zeros((0, *real.shape[1:]), np.float32)
        )
        row = {
            "class": name,
            "real_windows": len(real),
            "drawn": len(drawn),
            "real": stats(real),
            "drawn_stats": stats(drawn) if len(drawn) else None,
        }
        for tag, x in (("real", real), ("drawn", drawn)):
            if len(x):
                pred = ensemble_logits(phones, x.astype(np.float32)).argmax(1)
                confusion[tag][c] += np.bincount(pred, minlength=classes)
                row[f"{tag}_labelled_as_class"] = round(float((pred == c).mean()), 3)
        rows.append(row)
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], capture_output=True, text=True
    ).stdout.strip()
    out = {
        "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
        "commit": commit,
        "band_users": users,
        "phones": [a.metadata["client_id"] for a in phones],
        "decoders": [a.metadata["spec"] for a in bands],
        "classes": rows,
        "confusion": {k: v.tolist() for k, v in confusion.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(out, indent=2))
    args.out.with_suffix(".md").write_text(render(out))
    print(render(out))


def render(out: dict) -> str:
    lines = [
        f"# Wristband decoders' samples against real windows ({out['date']})",
        "",
        f"`{out['command']}`, {out['machine']}, code {out['commit']}; band users "
        f"{out['band_users']}, phones {', '.join(out['phones'])}.",
        "",
        "| class | gravity x,y,z (g) real / drawn | energy x,y,z (g) real / drawn | "
        "1-3 Hz share (x) real / drawn | phones label it right: real / drawn |",
        "|---|---|---|---|---|",
    ]
    for r in out["classes"]:
        d = r["drawn_stats"] or {}

        def fmt(v):
            return ", ".join(f"{x:+.2f}" for x in v) if v else "-"

        shares = (r["real"]["band_shares"][0][1], (d.get("band_shares") or [[0, 0]])[0][1])
        lines.append(
            f"| {r['class']} | {fmt(r['real']['gravity'])} / {fmt(d.get('gravity'))} | "
            f"{fmt(r['real']['energy'])} / {fmt(d.get('energy'))} | "
            f"{shares[0]:.2f} / {shares[1]:.2f} | "
            f"{r.get('real_labelled_as_class', 0):.2f} / {r.get('drawn_labelled_as_class', 0):.2f} |"
        )
    lines += ["", "Confusion of the phones' ensemble on drawn windows (rows: class drawn):", ""]
    for c, row in zip(out["classes"], out["confusion"]["drawn"], strict=True):
        lines.append(f"- {c['class']}: {row}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
