"""The server's cost from 100 to 10,000 uploads (issue 36).

    python bench/bench_scale.py [--sizes 100,1000,10000] [--methods fedavg,ensemble,fedmho]
                                [--work DIR] [--out bench/results/scale] [--timeout 1800]

A federation of N uploads on MNIST, Dir(0.5) (`--partition`; Dir(0.5) cannot give each of
10,000 clients a sample, so that size runs `--partition dirichlet:1.0 --min-size 1`): 80 % wristband decoders (the band's planned
`cvae-mlp(hidden=24)`), 20 % phone classifiers of two architectures (`cnn`, `scnn`), each
trained 100 optimiser steps on its shard (60,000 / N samples: 600 at 100 uploads, 6 at 10,000)
with its profile's optimizer, batch and rate.
This measures the server, so the clients are made as cheaply as is honest: each is a real torch
model trained on its own data, but only the first client of each architecture goes through
torch's ONNX exporter; the others are that graph with the client's own weights and metadata
written in (the same bytes `client train` writes for those weights, up to the exporter's
naming; the server rebuilds and parity-checks every one, and the bench stops if any is
rejected).

For each size and method: `edgefl server fuse DIR --method M --eval mnist:test` in its own
process (wall time, peak RSS of the process and its workers, accuracy, the report's stages and
ingest stages), then each stage's growth exponent between consecutive sizes (log t2/t1 over log
n2/n1: 1 is linear). A method that runs past --timeout is recorded as such. Writes
OUT.json and OUT.md with command, date, machine and commit.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import onnx
import torch
from _record import RSS_WRAPPER, run_header
from onnx import numpy_helper

import exporters
from edgefl.client.run import export_model, model_metadata
from edgefl.data import load_dataset
from edgefl.data.partition import partition
from edgefl.models.zoo import make_spec, role_of, spec_label
from edgefl.profiles import get_profile
from edgefl.training import DEFAULT_LR, TrainConfig, init_model, train
from exporters.export import seal_metadata

SHAPE, CLASSES = (1, 28, 28), 10
# (profile, zoo name, params): 80 % bands, 20 % phones split between two architectures.
BAND = ("wristband", "cvae-mlp", {"hidden": 24})
PHONES = (("smartphone", "cnn", {}), ("smartphone", "scnn", {}))
STEPS = 100  # local optimiser steps per client
METHODS = "fedavg,ensemble,ensemble:robust=screen,fedmho,fedmho-md,fedmho-cw,fedcvae-ens,dense,fedhydra,pfedzkd"


def client_kind(i: int):
    """Every fifth client is a phone (alternating architectures), the rest bands."""
    if i % 5 == 0:
        return PHONES[(i // 5) % 2]
    return BAND


def _upload(template: onnx.ModelProto, state: dict, meta: dict, path: Path) -> None:
    model = onnx.ModelProto()
    model.CopyFrom(template)
    names = set()
    for t in model.graph.initializer:
        if t.name in state:
            t.CopyFrom(numpy_helper.from_array(state[t.name], t.name))
            names.add(t.name)
    missing = set(state) - names
    if missing:
        raise SystemExit(f"template lacks weights {sorted(missing)[:3]}: cannot reuse its graph")
    seal_metadata(model, meta, "graph")
    exporters.write_model_atomic(model, path)


def make_federation(n: int, out: Path, scheme: str, min_size: int | None, seed: int = 0) -> dict:
    """N uploads in out/uploads (kept if already complete); returns the manifest."""
    manifest_path = out / "federation.json"
    if manifest_path.exists():
        return json.loads(manifest_path.read_text())
    uploads = out / "uploads"
    uploads.mkdir(parents=True, exist_ok=True)
    data = load_dataset("mnist", "train")
    test = load_dataset("mnist", "test")
    tx, ty = torch.from_numpy(test.x[:1000]), test.y[:1000]
    parts = partition(data.y, n, scheme, seed, num_classes=CLASSES, min_size=min_size)
    templates: dict[str, onnx.ModelProto] = {}
    phone_acc, start = [], time.perf_counter()
    torch.set_num_threads(1)
    for i, idx in enumerate(parts):
        profile_name, name, params = client_kind(i)
        profile = get_profile(profile_name)
        spec = make_spec(name, SHAPE, CLASSES, **params)
        role = role_of(spec)
        model = init_model(spec, seed)
        # STEPS optimiser steps, whatever the shard's size (1 epoch of 6 samples teaches nothing)
        epochs = max(1, math.ceil(STEPS / math.ceil(len(idx) / profile.batch_size)))
        cfg = TrainConfig(
            epochs=epochs,
            batch_size=profile.batch_size,
            optimizer=profile.optimizer,
            lr=DEFAULT_LR[(role, profile.optimizer)],
            seed=seed * 100_000 + i,
        )
        summary = train(model, role, data.x[idx], data.y[idx], CLASSES, cfg)
        counts = np.bincount(data.y[idx], minlength=CLASSES).astype(int).tolist()
        meta = model_metadata(
            spec,
            class_names=list(data.class_names),
            label_counts=counts,
            client_id=f"client-{i:05d}",
            profile=profile.name,
            training=summary.as_dict(),
            dataset="mnist",
            partition={
                "scheme": scheme,
                "num_clients": n,
                "client_index": i,
                "seed": seed,
            },
        )
        path = uploads / f"client-{i:05d}.onnx"
        if role == "classifier":
            with torch.no_grad():
                phone_acc.append(float((model.eval()(tx).argmax(1).numpy() == ty).mean()))
        if spec_label(spec) not in templates:
            export_model(model, spec, meta, path)
            templates[spec_label(spec)] = onnx.load(path)
            continue
        module = model if role == "classifier" else model.decoder
        if role != "classifier":
            meta["latent_dim"] = model.decoder.latent_dim  # as export_model stamps a decoder
        state = {
            k: v.detach().numpy()
            for k, v in module.state_dict().items()
            if not k.endswith("num_batches_tracked")
        }
        _upload(templates[spec_label(spec)], state, meta, path)
        if (i + 1) % max(1, n // 10) == 0:
            el = time.perf_counter() - start
            print(f"  made {i + 1:,}/{n:,} uploads in {el:.0f}s", flush=True)
    sizes = [p.stat().st_size for p in uploads.glob("*.onnx")]
    manifest = {
        "uploads": n,
        "partition": scheme,
        "bands": sum(client_kind(i) == BAND for i in range(n)),
        "phones": sum(client_kind(i) != BAND for i in range(n)),
        "bytes": sum(sizes),
        "samples_per_client_mean": 60_000 / n,
        "mean_phone_accuracy_1000_test": 100 * float(np.mean(phone_acc)),
        "seconds": time.perf_counter() - start,
    }
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return manifest


def fuse(
    uploads: Path,
    method: str,
    out: Path,
    timeout: float,
    jobs: int,
    device: str = "cpu",
    resident_mib: int | None = None,
) -> dict:
    """One `server fuse` of `method` ("NAME" or "NAME:key=value", e.g. the robust screen)."""
    edgefl = Path(sys.executable).parent / "edgefl"
    name, _, opt = method.partition(":")
    extra = ["--opt", opt] if opt else []
    cmd = [
        sys.executable,
        "-c",
        RSS_WRAPPER,
        str(edgefl),
        "server",
        "fuse",
        str(uploads),
        *extra,
        "--method",
        name,
        "--out",
        str(out / f"{method.replace(':', '.')}.onnx"),
        "--eval",
        "mnist:test",
        "--device",
        device,
        "--jobs",
        str(jobs),
        "--json",
        "-q",
        "--overwrite",
        *([] if resident_mib is None else ["--resident-mib", str(resident_mib)]),
    ]
    start = time.perf_counter()
    # Its own process group: a timeout stops the server and its workers, not only the wrapper
    # (an orphaned server would go on competing with the next measurement).
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return {"method": method, "timeout_s": timeout}
    wall = time.perf_counter() - start
    rss = [int(line.split()[1]) for line in err.splitlines() if line.startswith("MAXRSS_KB")]
    row = {
        "method": method,
        "wall_s": wall,
        "peak_rss_bytes": 1024 * rss[-1] if rss else None,
        "rc": p.returncode,
    }
    if p.returncode != 0:
        row["error"] = (err.strip().splitlines() or [""])[-2 if rss else -1][:300]
        return row
    rep = json.loads(out)
    row |= {
        "accuracy": 100 * rep["accuracy"],
        "stages": rep.get("seconds", {}),
        "ingest_stages": rep.get("ingest_stages", {}),
        "used": len(rep.get("used") or []),
        "rejected": len(rep.get("rejected") or []),
        "total_s": rep.get("total_seconds"),
    }
    return row


def _timings(row: dict) -> dict[str, float]:
    """A row's seconds by stage: the method's, the ingest's (as ingest.*) and the whole wall."""
    ingest = {f"ingest.{k}": v for k, v in row["ingest_stages"].items()}
    return {**row["stages"], **ingest, "wall": row["wall_s"]}


def growth(rows: list[dict]) -> dict:
    """method -> stage -> exponent between consecutive sizes (t ~ n^k)."""
    by = {}
    for r in rows:
        if "stages" in r:
            by.setdefault(r["method"], []).append(r)
    out = {}
    for method, rs in by.items():
        rs.sort(key=lambda r: r["n"])
        for a, b in zip(rs, rs[1:], strict=False):
            if a["n"] == b["n"]:  # merged runs of one size (held vs parked): no growth to fit
                continue
            span = f"{a['n']}->{b['n']}"
            stages, later = _timings(a), _timings(b)
            ks = {}
            for s, t1 in stages.items():
                t2 = later.get(s)
                if t2 and t1 and t1 > 0.05 and t2 > 0.05:  # below 50 ms the ratio is noise
                    ks[s] = round(math.log(t2 / t1) / math.log(b["n"] / a["n"]), 2)
            out.setdefault(method, {})[span] = ks
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--methods", default=METHODS)
    ap.add_argument(
        "--partition", default="dirichlet:0.5", help="dirichlet:1.0 at 10,000 (0.5 cannot fill)"
    )
    ap.add_argument("--min-size", type=int, default=None, help="fewest samples per client")
    ap.add_argument("--work", default=None, help="federations are kept here and reused")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "scale"))
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per method and size")
    ap.add_argument("--jobs", type=int, default=2, help="server fuse --jobs")
    ap.add_argument("--device", default="cpu", help="server fuse --device (cuda on a GPU machine)")
    ap.add_argument(
        "--resident-mib", type=int, default=None, help="server fuse --resident-mib (0: park all)"
    )
    ap.add_argument(
        "--merge", nargs="+", metavar="JSON", help="only write --out from earlier runs' JSON"
    )
    args = ap.parse_args()
    if args.merge:
        runs = [json.loads(Path(f).read_text()) for f in args.merge]
        federations = {int(n): f for r in runs for n, f in r["federations"].items()}
        rows = [row for r in runs for row in r["rows"]]
        commands = [r["command"] for r in runs]
        write(args, rows, federations, {"runs": [{k: r[k] for k in HEADER} for r in runs]})
        print("\n".join(commands))
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="edgefl-scale-"))
    rows, federations = [], {}
    for n in [int(s) for s in args.sizes.split(",")]:
        fed = work / f"n{n}"
        print(f"[{n}] making the federation in {fed}", flush=True)
        federations[n] = make_federation(n, fed, args.partition, args.min_size)
        print(f"[{n}] {json.dumps(federations[n])}", flush=True)
        for method in filter(None, args.methods.split(",")):
            row = {"n": n} | fuse(
                fed / "uploads",
                method,
                fed / "global",
                args.timeout,
                args.jobs,
                args.device,
                args.resident_mib,
            )
            print(f"[{n}] {json.dumps(row)}", flush=True)
            rows.append(row)
            write(args, rows, federations)


HEADER = ("command", "date", "machine", "commit")


def write(args, rows: list[dict], federations: dict, merged: dict | None = None) -> None:
    # Merged: the runs' own headers, each line naming its command, date and commit.
    header = merged or run_header("bench/bench_scale.py")
    g = growth(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({**header, "federations": federations, "rows": rows, "growth": g}, indent=1)
        + "\n"
    )
    runs = header.get("runs", [header])
    lines = [
        "# The server from 100 to 10,000 uploads (issue 36)",
        "",
        *[
            f"`{r['command']}` on {r['date']}, {r['machine']}, commit {r['commit']}.  "
            for r in runs
        ],
        "",
        "| uploads | partition | bands / phones | MB | mean phone model % | made in s |",
        "|---:|---|---|---:|---:|---:|",
    ]
    for n, f in federations.items():
        lines.append(
            f"| {n:,} | {f.get('partition', 'dirichlet:0.5')} | {f['bands']:,} / {f['phones']:,} | "
            f"{f['bytes'] / 1e6:,.1f} | "
            f"{f['mean_phone_accuracy_1000_test']:.2f} | {f['seconds']:.0f} |"
        )
    lines += [
        "",
        "| uploads | method | wall s | ingest s | fusion s (stages) | peak RSS MiB | "
        "accuracy % | used / rejected |",
        "|---:|---|---:|---:|---|---:|---:|---|",
    ]
    for r in rows:
        if "timeout_s" in r:
            lines.append(
                f"| {r['n']:,} | {r['method']} | > {r['timeout_s']:.0f} (timeout) | | | | | |"
            )
            continue
        if "error" in r:
            lines.append(
                f"| {r['n']:,} | {r['method']} | {r['wall_s']:.0f} | | error: {r['error']} | | | |"
            )
            continue
        st = r["stages"]
        rest = ", ".join(f"{k} {v:.1f}" for k, v in st.items() if k != "ingest" and v >= 0.05)
        rss = r["peak_rss_bytes"] / 2**20 if r["peak_rss_bytes"] else float("nan")
        lines.append(
            f"| {r['n']:,} | {r['method']} | {r['wall_s']:.1f} | "
            f"{st.get('ingest', 0):.1f} | {rest} | {rss:,.0f} | {r['accuracy']:.2f} | "
            f"{r['used']} / {r['rejected']} |"
        )
    lines += [
        "",
        "Growth exponents (time ~ uploads^k; 1 is linear; stages under 50 ms left out):",
        "",
    ]
    for method, spans in g.items():
        for span, ks in spans.items():
            shown = ", ".join(f"{k} {v:+.2f}" for k, v in ks.items())
            lines.append(f"- {method} {span}: {shown}")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
