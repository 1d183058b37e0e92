"""FedHydra on HAPT windows traced epoch by epoch (issue 32): the student scored on the 3,384
windows of the 9 UCI test users after every epoch, with per-class recall, and the
stratification it used. A diagnostic, not a result table: it reads the uploads that
`bench/bench_datafree_hapt.py` made (WORK/sS/uploads) and prints one line per epoch.

    python bench/trace_fedhydra_hapt.py --work /tmp/hydra --seed 0 [--weights uniform] [key=value ...]

`--weights uniform` replaces the stratification's U_r and U_c by uniform weights (every client
heard alike for every class: the aggregate is the clients' mean probability), to measure what
the stratification adds on a federation without label skew.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from edgefl.data import load_dataset
from edgefl.fusion import METHODS, fedhydra
from edgefl.fusion.base import FusionContext
from edgefl.models.spec import parse_value
from edgefl.server.ingest import ingest


def _uniform(u, relative=True):
    c, m = np.asarray(u).shape
    return np.full((c, m), 1.0 / m), np.full((c, m), 1.0 / c)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/tmp/bench-datafree-hapt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--weights", choices=("stratified", "uniform"), default="stratified")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("options", nargs="*", help="fedhydra options as key=value")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    test = load_dataset("hapt", "test")
    x, y = torch.from_numpy(test.x), torch.from_numpy(test.y)
    folder = Path(args.work) / f"s{args.seed}" / "uploads"
    teachers = [u for u in ingest(folder, max_upload_bytes=10**8).uploads if u.kind == "classifier"]
    if args.weights == "uniform":
        fedhydra.stratification_weights = _uniform
    distill = fedhydra.Hasa.distill

    def traced(game, intermediates):
        distill(game, intermediates)
        was = game.student.training
        game.student.eval()
        with torch.no_grad():
            p = game.student(x).argmax(1)
        game.student.train(was)
        recall = [round(float((p[y == c] == c).float().mean()), 2) for c in range(int(y.max()) + 1)]
        print(
            f"epoch {len(game.hist['global'])}: {float((p == y).float().mean()) * 100:.2f} % "
            f"recall {recall}",
            flush=True,
        )

    fedhydra.Hasa.distill = traced
    method = METHODS.get("fedhydra")
    cfg = method.make_config(
        dict((k, parse_value(v)) for k, v in (o.split("=", 1) for o in args.options))
    )
    result = method.fuse(FusionContext(teachers, device=torch.device("cpu"), seed=cfg.seed), cfg)
    with torch.no_grad():
        p = result.model.eval()(x).argmax(1)
    print(f"returned student: {float((p == y).float().mean()) * 100:.2f} %")
    print(
        "U_r (rows classes, columns clients):",
        json.dumps(np.round(result.info["stratification"]["U_r"], 3).tolist()),
    )


if __name__ == "__main__":
    main()
