"""Where FedHydra's time goes on HAPT windows (issue 32): one seed's fusion through
`bench_datafree_hapt.py`'s `fuse` with the options named, printing its test accuracy, the
seconds in the generator and in the student, and the generator steps each epoch took (`finish`
keeps stepping up to `max_gen_steps`). A diagnostic: it reads the uploads that
`bench/bench_datafree_hapt.py` made (WORK/sS/uploads) and prints one JSON line.

    python bench/cost_fedhydra_hapt.py --work /tmp/hydra --seed 0 [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_datafree_hapt  # noqa: E402

from edgefl.data import load_dataset  # noqa: E402
from edgefl.errors import EdgeflError  # noqa: E402
from edgefl.fusion import fedhydra  # noqa: E402


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not key=value (e.g. mix=true)")
    return key, value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/tmp/bench-datafree-hapt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("options", nargs="*", type=key_value, help="fedhydra options as key=value")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    steps: list[int] = []
    spent = {"generator_s": 0.0, "student_s": 0.0}
    generate, distill = fedhydra.Hasa.generate, fedhydra.Hasa.distill

    def timed_generate(self):
        start = time.monotonic()
        batches = generate(self)
        spent["generator_s"] += time.monotonic() - start
        steps.append(len(batches))
        return batches

    def timed_distill(self, intermediates):
        start = time.monotonic()
        distill(self, intermediates)
        spent["student_s"] += time.monotonic() - start

    fedhydra.Hasa.generate, fedhydra.Hasa.distill = timed_generate, timed_distill
    overrides = dict(args.options)
    folder = Path(args.work) / f"s{args.seed}" / "uploads"
    try:
        r = bench_datafree_hapt.fuse("fedhydra", folder, overrides, load_dataset("hapt:test"))
    except EdgeflError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    line = {"seed": args.seed, "options": overrides, "accuracy": round(100 * r["accuracy"], 2)}
    line |= {"seconds": r["seconds"], **{k: round(v, 1) for k, v in spent.items()}}
    print(json.dumps(line | {"generator_steps": steps}))


if __name__ == "__main__":
    main()
