"""Peak memory of a teacher pass over many classifiers: the logits held a group of teachers at a
time (`edgefl.fusion.teachers.TEACHER_GROUP`) against all at once (the pass before the grouping).

Each setting runs in its own process (peak RSS is per process). The teachers are linear
classifiers on MNIST-shaped inputs: what the grouping changes is the memory of the logits
(teachers x samples x classes floats), not the cost of a forward, so cheap teachers measure it.

    python bench/bench_teacher_groups.py --teachers 2000 --samples 6000 --out bench/results/teacher_groups
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path
from types import SimpleNamespace

from _record import child_row, page_head, run_header


def _one(teachers: int, samples: int, group: int, kind: str) -> dict:
    """In this process: `teachers` linear classifiers' pass over `samples` inputs."""
    import torch
    from torch import nn

    from edgefl.fusion import fedmho_cw
    from edgefl.fusion import teachers as passes  # not `teachers`: the count's name

    torch.set_num_threads(1)
    passes.TEACHER_GROUP = group
    torch.manual_seed(0)
    ups = [
        SimpleNamespace(
            module=nn.Linear(784, 10),
            meta={"num_classes": 10},
            label_counts=torch.randint(0, 60, (10,)).numpy(),
        )
        for _ in range(teachers)
    ]
    x = torch.rand(samples, 784)
    y = torch.randint(0, 10, (samples,))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if kind == "mean":
        out = passes.mean_teacher_logits(ups, x, torch.device("cpu"))
    else:
        out = fedmho_cw._teacher(kind, ups, x, y, torch.device("cpu"))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "teachers": teachers,
        "samples": samples,
        "group": group,
        "kind": kind,
        "seconds": round(seconds, 2),
        "rss_before_mib": round(before / 1024, 1),
        "peak_rss_mib": round(peak / 1024, 1),
        "pass_mib": round((peak - before) / 1024, 1),
        "checksum": float(out.double().sum()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teachers", type=int, default=2000)
    ap.add_argument("--samples", type=int, default=6000)
    ap.add_argument("--groups", default="64,1000000", help="TEACHER_GROUP values (1000000: all)")
    ap.add_argument("--kinds", default="mean,both", help="mean (FedMHO-MD, FedDF) | both (CW)")
    ap.add_argument("--out", help="STEM: write STEM.json and STEM.md")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # GROUP,KIND: run one setting, print JSON
    args = ap.parse_args()
    if args.one:
        group, kind = args.one.split(",")
        print(json.dumps(_one(args.teachers, args.samples, int(group), kind)))
        return
    header = run_header("bench/bench_teacher_groups.py")
    rows = []
    for kind in args.kinds.split(","):
        for group in args.groups.split(","):
            cmd = [__file__, "--teachers", str(args.teachers)]
            cmd += ["--samples", str(args.samples), "--one", f"{group},{kind}"]
            rows.append(child_row(cmd))
            print(rows[-1], flush=True)
    if args.out:
        Path(args.out).with_suffix(".json").write_text(
            json.dumps(header | {"rows": rows}, indent=2)
        )
        Path(args.out).with_suffix(".md").write_text(_markdown(header, rows))


def _markdown(header: dict, rows: list[dict]) -> str:
    title = "A teacher pass's memory, a group of teachers at a time (bench/bench_teacher_groups.py)"
    lines = [
        *page_head(title, header),
        "| teachers | samples | teacher kind | group | pass s | peak RSS MiB | of it the pass MiB |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        group = "all" if r["group"] >= r["teachers"] else r["group"]
        lines.append(
            f"| {r['teachers']} | {r['samples']} | {r['kind']} | {group} | {r['seconds']} | "
            f"{r['peak_rss_mib']} | {r['pass_mib']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
