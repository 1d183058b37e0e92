"""How much of bench_fuzz's downstream stage the accepted items reach: which sources they come
from, and how often the robust screen's verdict changes a method's share (so that the method is
fused again on it). Items 0..N-1 of a seed, through bench_fuzz's own functions.

    python bench/fuzz_screen_coverage.py 10000
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import bench_fuzz  # noqa: E402


def main(n: int, seed: int = 0) -> None:
    import torch

    import edgefl.fusion.screen as robust

    torch.set_num_threads(1)
    folder = Path(__file__).parent / "results" / "fuzz_sources"
    sources = {p.name: p.read_bytes() for p in sorted(folder.glob("*.onnx"))}
    real, changed = robust.apply, Counter()

    def counting(verdict, usable, log=None):
        kept, screened, notes = real(verdict, usable, log)
        changed["shares"] += [id(u) for u in kept] != [id(u) for u in usable]
        return kept, screened, notes

    robust.apply = counting  # downstream() imports it from the module when it runs
    accepted: Counter = Counter()
    with tempfile.TemporaryDirectory() as scratch:
        companions = bench_fuzz._companions_folder(sources, scratch)
        for i in range(n):
            data, name, _ = bench_fuzz.make_item(sources, seed, i)
            path = Path(scratch, "item.onnx")
            path.write_bytes(data)
            if bench_fuzz.check(path)[0] != "accepted":
                continue
            before = changed["shares"]
            outcome = bench_fuzz.downstream(companions, data, None)[0]
            accepted[name, outcome] += 1
            changed["items"] += changed["shares"] > before
    print(
        f"items 0-{n - 1}, seed {seed}: accepted by source and downstream outcome "
        f"{dict(accepted)}; method shares changed by the screen {changed['shares']} times, "
        f"on {changed['items']} items"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]))
