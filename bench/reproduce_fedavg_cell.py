"""FedMHO Table 3's classifier setting at the cpu budget (scnn:width=16,hidden=128 on the 5 large
clients, cnn on the 5 small), Dir(0.5) seed 0, fused with fedavg and ensemble only: the cell
`edgefl reproduce fedmho-table3 --federation classifiers --partitions dirichlet:0.5 --seeds 0`
makes for those two methods, rendered as the table renders it (OUT/cell.md).

    python bench/reproduce_fedavg_cell.py OUT
"""

from __future__ import annotations

from edgefl.threads import share_cores_politely

# What the edgefl CLI does first: thread settings before numpy and torch load, and MKL's
# fork-safe allocator before this script forks (docs/development.md).
share_cores_politely()

import dataclasses
import json
import sys
import time
from pathlib import Path

METHODS = ("fedavg", "ensemble")


def main(out: str) -> None:
    import torch

    from edgefl.reproduce import run as rep
    from edgefl.reproduce.render import table_markdown

    torch.set_num_threads(1)
    job = rep.ReproduceJob(
        table="fedmho-table3",
        out=out,
        budget="cpu",
        seeds=(0,),
        partitions=("dirichlet:0.5",),
        federation="classifiers",
    )
    table, budget = rep.resolve(job)
    cell = rep.cells(job, table, budget)[0]
    sim = dataclasses.replace(
        cell.sim, methods=METHODS, fuse_options={m: cell.sim.fuse_options[m] for m in METHODS}
    )
    cell = rep.Cell(cell.setting, cell.partition, cell.seed, sim)
    start = time.time()
    done = rep.simulate(sim, log=lambda m: print(m, flush=True))
    print(f"{time.time() - start:.0f} s")
    record = rep.cell_record(cell, done, skipped=False)
    print(json.dumps(record["results"], indent=1))
    summary = rep.summarize(job, table, budget, [record])
    summary["rows"] = [r for r in summary["rows"] if r["method"] in METHODS]
    text = table_markdown(summary)
    print(text)
    Path(out, "cell.md").write_text(text)


if __name__ == "__main__":
    main(sys.argv[1])
