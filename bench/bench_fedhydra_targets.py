"""Where FedHydra loses to its teachers: the target its student distils, or the synthetic
images it distils it on (issue 56)?

For each uploads folder, on a real labelled split (never seen by the fusion), the accuracy of:
the teachers' logit mean (the `ensemble` of the tables) and probability mean; FedHydra's
class-weighted target (`distill_target class-weighted`: U_c's weighting, the image alone), the
best the student can reach by distilling it; SA with the true label (Eq. 8-11 with U_r[y]: what
the generator aims at, which the student never sees); and with `--fuse` the student FedHydra
keeps (the same options and seed). U comes from the same code and seed as the fusion's.
A student far under its class-weighted target: the synthetic images miss the real ones; a
target far under SA-with-y: no weighting of the teachers that sees only the input tells which
one to believe.

    python bench/bench_fedhydra_targets.py CELL/uploads [...] --eval fmnist:test --seed 0 \\
        --fuse --out bench/results/x
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import page_head, run_header, write_record  # noqa: E402

COLUMNS = {
    "logit_mean": "teachers' logit mean",
    "prob_mean": "probability mean",
    "cw_target": "class-weighted target",
    "sa_true_label": "SA with the true label",
    "student": "student kept",
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("uploads", nargs="+", type=Path, help="uploads folders (one federation each)")
    ap.add_argument("--eval", required=True, help="the real labelled split, e.g. fmnist:test")
    ap.add_argument("--seed", type=int, default=0, help="FedHydra's seed (the fusion's)")
    ap.add_argument("--opt", action="append", default=[], help="FedHydra option KEY=VALUE")
    ap.add_argument("--fuse", action="store_true", help="also run FedHydra and score its student")
    ap.add_argument("--out", required=True, help="write OUT.json and OUT.md")
    return ap.parse_args(argv)


def top1(logits: torch.Tensor, y: torch.Tensor) -> float:
    return round(100 * float((logits.argmax(1) == y).float().mean()), 2)


def score(folder: Path, args, test) -> dict:
    from edgefl.fusion import METHODS
    from edgefl.fusion import fedhydra as fh
    from edgefl.fusion.averaging import combine_outputs
    from edgefl.fusion.base import FusionContext
    from edgefl.fusion.generator import seeded_teachers, teacher_forward
    from edgefl.models.spec import parse_value
    from edgefl.server.ingest import ingest

    m = METHODS.get("fedhydra")
    opts = dict(o.split("=", 1) for o in args.opt) | {"seed": str(args.seed)}
    cfg = m.effective_config({k: parse_value(v) for k, v in opts.items()}, test.input_shape)
    found = [u for u in ingest(folder, max_upload_bytes=10**8).uploads if u.kind == "classifier"]
    ctx = FusionContext(found, device=torch.device("cpu"), seed=cfg.seed)
    uploads, teachers = seeded_teachers(ctx, cfg, fh.TEACHER_COST)
    strata = fh.stratification(ctx, cfg, uploads, teachers)
    u_r, u_c = (torch.tensor(w, dtype=torch.float32) for w in (strata.u_r, strata.hasa_u_c))
    x, y = torch.from_numpy(test.x).float(), torch.from_numpy(test.y).long()
    with torch.no_grad():
        lg = torch.cat(
            [teacher_forward(teachers, x[i : i + 512]) for i in range(0, len(x), 512)], 1
        )
        preds = {  # the `ensemble` method's two combinations, then FedHydra's aggregates
            "logit_mean": combine_outputs(lg, "logits"),
            "prob_mean": combine_outputs(lg, "probabilities"),
            "cw_target": fh.stratified_aggregate(lg, y, torch.ones_like(u_r), u_c),
            "sa_true_label": fh.stratified_aggregate(lg, y, u_r, u_c),
        }
    row = {k: top1(p, y) for k, p in preds.items()}
    if args.fuse:
        start = time.monotonic()
        result = m.fuse(FusionContext(found, device=torch.device("cpu"), seed=cfg.seed), cfg)
        with torch.no_grad():
            row["student"] = top1(result.model.cpu().eval()(x), y)
        row["kept"] = result.info.get("student")
        row["fuse_seconds"] = round(time.monotonic() - start, 1)
    return {"uploads": str(folder), "teachers": len(teachers)} | row


def markdown(header: dict, rows: list[dict], eval_ref: str) -> str:
    cols = [c for c in COLUMNS if any(c in r for r in rows)]
    lines = page_head(f"FedHydra's targets on {eval_ref}, against its student", header)
    lines += [
        "| uploads | teachers | " + " | ".join(COLUMNS[c] for c in cols) + " |",
        "|---|---:|" + "---:|" * len(cols),
    ]
    for r in rows:
        cells = " | ".join(f"{r[c]:.2f}" if c in r else "-" for c in cols)
        lines.append(f"| {r['uploads']} | {r['teachers']} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)
    header = run_header("bench/bench_fedhydra_targets.py")
    from edgefl.data.datasets import load_dataset

    test = load_dataset(args.eval, "test")  # DATASET[:SPLIT], as `server fuse --eval`
    rows = []
    for folder in args.uploads:
        rows.append(score(folder, args, test))
        print(rows[-1], flush=True)
    header["threads"] = torch.get_num_threads()
    write_record(args.out, header | {"eval": args.eval}, rows, markdown(header, rows, args.eval))
    print(f"wrote {args.out}.json and {args.out}.md")


if __name__ == "__main__":
    main()
