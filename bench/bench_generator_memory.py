"""Peak memory of a data-free generator step over many teachers: each group of
`edgefl.fusion.generator.CHECKPOINT_GROUP` teachers checkpointed (its activations dropped after
its forward, recomputed in the backward) against the plain pass that keeps every teacher's.

One DENSE-style step (cross-entropy of the teachers' mean logits + the BatchNorm-statistics
term, backward into the generator) at the cpu budget's generator (nz 256, ngf 16) and batch,
each setting in its own process (peak RSS is per process). The teachers are untrained, of the
`--archs` in turn (default `cnn` and `scnn`; `nas-cnn` has BatchNorm, whose term then enters the
loss): memory and time do not depend on the weights. Each row gives the generator's gradients'
SHA-256, so rows of one teacher count must agree bit for bit.

    python bench/bench_generator_memory.py --teachers 50,200,800,2000 --groups 0,64 \
        --out bench/results/generator_memory
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import time

from _record import child_row, run_header, write_record


def _one(teachers: int, group: int, batch: int, steps: int, archs: str = "cnn,scnn") -> dict:
    """In this process: `steps` generator steps through `teachers` teachers."""
    import torch

    from edgefl.fusion import generator as gen_mod

    torch.set_num_threads(1)
    kept = gen_mod.CHECKPOINT_GROUP
    gen_mod.CHECKPOINT_GROUP = group or 10**9  # 0: the plain pass
    try:
        return _steps(gen_mod, teachers, group, batch, steps, archs)
    finally:
        gen_mod.CHECKPOINT_GROUP = kept


def _steps(gen_mod, teachers: int, group: int, batch: int, steps: int, archs: str) -> dict:
    import torch
    from torch.nn import functional as F

    from edgefl.models.zoo import build_model, make_spec

    torch.manual_seed(0)
    specs = [make_spec(a, (1, 28, 28), 10) for a in archs.split(",")]
    nets = [
        build_model(specs[k % len(specs)]).eval().requires_grad_(False) for k in range(teachers)
    ]
    gen = gen_mod.make_generator(256, 16, (1, 28, 28), 0, torch.device("cpu"))
    bn = gen_mod.BNStatLoss(nets)
    z = torch.randn(batch, 256, generator=torch.Generator().manual_seed(1))
    y = torch.arange(batch) % 10
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    for _ in range(steps):
        gen.zero_grad()
        logits = gen_mod.teacher_forward(nets, gen(z), bn)
        (F.cross_entropy(logits.mean(0), y) + bn.value("cpu")).backward()
    seconds = (time.perf_counter() - start) / steps
    grads = torch.cat([p.grad.flatten() for p in gen.parameters()]).numpy().tobytes()
    return {
        "teachers": teachers,
        "archs": archs,
        "group": group,
        "batch": batch,
        "s_per_step": round(seconds, 2),
        "rss_before_mib": round(before / 1024, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "grads_sha256": hashlib.sha256(grads).hexdigest()[:16],
    }


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        "# A generator step's peak memory: teachers checkpointed in groups vs all kept",
        "",
        f"{meta['date']}, {meta['machine']}, commit {meta['commit']}: `{meta['command']}`.",
        "",
        "| teachers | archs | group (0: plain) | batch | s / step | peak RSS MiB "
        "| gradients' SHA-256 |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['teachers']:,} | {r.get('archs', 'cnn,scnn')} | {r['group']} | {r['batch']} "
            f"| {r['s_per_step']} | "
            f"{r['peak_rss_mib']:,.0f} | `{r['grads_sha256']}` |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teachers", default="50,200,800,2000")
    ap.add_argument("--groups", default="0,64", help="checkpoint groups; 0 = the plain pass")
    ap.add_argument("--batch", type=int, default=64, help="the cpu budget's synthesis batch")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--archs", default="cnn,scnn", help="teachers' zoo models, in turn")
    ap.add_argument("--out", default="bench/results/generator_memory")
    ap.add_argument("--one", nargs=4, type=int, help=argparse.SUPPRESS)  # a child's setting
    args = ap.parse_args()
    if args.one:
        print(json.dumps(_one(*args.one, archs=args.archs)))
        return
    rows = []
    for k in (int(t) for t in args.teachers.split(",")):
        for g in (int(g) for g in args.groups.split(",")):
            one = [str(v) for v in (k, g, args.batch, args.steps)]
            rows.append(child_row([__file__, "--one", *one, "--archs", args.archs]))
            print(rows[-1], flush=True)
    meta = run_header("bench/bench_generator_memory.py")
    write_record(args.out, meta, rows, markdown(rows, meta))


if __name__ == "__main__":
    main()
