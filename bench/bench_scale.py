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

Against the machine's own peak (issue 59): the run measures the dense fp32 matmul rate and the
copy bandwidth (bench/_peak.py) at the `server fuse` child's torch thread count, before its first
federation and again after its last (the machine is shared and noisy), and each stage whose work
edgefl's cost model counts (`stage_work`: multiply-adds, or bytes for the ingest and the
averaging) is reported beside its time as GMAC/s (GB/s) and a fraction of the larger of the two
measurements. A stage it cannot count shows "-", as do runs recorded before the measurement.
The peak is the CPU's: with --device cuda the fractions say nothing of the GPU's use.
"""

from __future__ import annotations

import argparse
import functools
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
from _peak import gpu_peaks, machine_peak  # bench/ is on sys.path when run as a script
from _record import RSS_WRAPPER, run_header
from onnx import numpy_helper

import exporters
from edgefl.client.run import export_model, model_metadata
from edgefl.data import load_dataset
from edgefl.data.partition import partition
from edgefl.models.cost import costs, layer_table
from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import make_spec, role_of, spec_label
from edgefl.profiles import get_profile
from edgefl.server.ingest import upload_bytes
from edgefl.training import DEFAULT_LR, TrainConfig, init_model, train
from exporters.export import seal_metadata

SHAPE, CLASSES = (1, 28, 28), 10
# (profile, zoo name, params): 80 % bands, 20 % phones split between two architectures.
BAND = ("wristband", "cvae-mlp", {"hidden": 24})
PHONES = (("smartphone", "cnn", {}), ("smartphone", "scnn", {}))
STEPS = 100  # local optimiser steps per client
LAUNCH = "import sys; from edgefl.cli import main; sys.argv[0] = 'edgefl'; sys.exit(main())"
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


def _make_client(i, idx, n, scheme, seed, data, test, templates, uploads) -> float | None:
    """Client i's upload in `uploads`; its accuracy on `test` if it is a phone's classifier."""
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
        partition={"scheme": scheme, "num_clients": n, "client_index": i, "seed": seed},
    )
    path = uploads / f"client-{i:05d}.onnx"
    acc = None
    if role == "classifier":
        with torch.no_grad():
            tx, ty = test
            acc = float((model.eval()(tx).argmax(1).numpy() == ty).mean())
    if spec_label(spec) not in templates:
        export_model(model, spec, meta, path)
        templates[spec_label(spec)] = onnx.load(path)
        return acc
    module = model if role == "classifier" else model.decoder
    if role != "classifier":
        meta["latent_dim"] = model.decoder.latent_dim  # as export_model stamps a decoder
    state = {
        k: v.detach().numpy()
        for k, v in module.state_dict().items()
        if not k.endswith("num_batches_tracked")
    }
    _upload(templates[spec_label(spec)], state, meta, path)
    return acc


def _make_share(job) -> dict[int, float]:
    """Clients w, w+k, w+2k, ... of the federation (one build worker's share): {i: phone acc}."""
    w, k, n, uploads, scheme, min_size, seed = job
    torch.set_num_threads(1)
    data = load_dataset("mnist", "train")
    test = load_dataset("mnist", "test")
    held = (torch.from_numpy(test.x[:1000]), test.y[:1000])
    parts = partition(data.y, n, scheme, seed, num_classes=CLASSES, min_size=min_size)
    templates: dict[str, onnx.ModelProto] = {}  # each worker exports its own first of each
    accs, start = {}, time.perf_counter()
    for i in range(w, n, k):
        acc = _make_client(i, parts[i], n, scheme, seed, data, held, templates, uploads)
        if acc is not None:
            accs[i] = acc
        if w == 0 and (i + k) % max(k, n // 10) < k:
            done = min(n, i + k)
            el = time.perf_counter() - start
            print(f"  made ~{done:,}/{n:,} uploads in {el:.0f}s", flush=True)
    return accs


def make_federation(
    n: int, out: Path, scheme: str, min_size: int | None, seed: int = 0, jobs: int = 1
) -> dict:
    """N uploads in out/uploads (kept if already complete), made by `jobs` processes; returns
    the manifest. The uploads do not depend on `jobs`: each client's seed is its own."""
    manifest_path = out / "federation.json"
    if manifest_path.exists():
        return json.loads(manifest_path.read_text())
    uploads = out / "uploads"
    uploads.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    shares = [(w, jobs, n, uploads, scheme, min_size, seed) for w in range(jobs)]
    if jobs == 1:
        accs = [_make_share(shares[0])]
    else:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            accs = pool.map(_make_share, shares)
    phone_acc = [a for share in accs for a in share.values()]
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
        "build_jobs": jobs,
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
    """One `server fuse` of `method` ("NAME" or "NAME:key=value[+key=value...]", e.g. the
    robust screen)."""
    edgefl = Path(sys.executable).parent / "edgefl"
    # where edgefl is not installed (a GPU machine's own Python): the CLI from the source tree
    launch = [str(edgefl)] if edgefl.exists() else [sys.executable, "-c", LAUNCH]
    name, _, opts = method.partition(":")
    extra = [arg for opt in opts.split("+") if opt for arg in ("--opt", opt)]
    model = out / f"{method.replace(':', '.')}.onnx"
    cmd = [
        sys.executable,
        "-c",
        RSS_WRAPPER,
        *launch,
        "server",
        "fuse",
        str(uploads),
        *extra,
        "--method",
        name,
        "--out",
        str(model),
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
        "device": device,
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
        # what each stage computed, counted (rates against the run's peak: `write`)
        "work": stage_work(name, rep, global_spec(model), upload_bytes(uploads)),
    }
    return row


# --- what each stage computes, counted from edgefl's cost model (issue 59) ------------------
#
# Multiply-adds (MACs) are `edgefl.models.cost.costs(spec).macs` per sample forward (conv and
# linear layers; activations, pools, norms, softmax and losses are not counted), of the specs
# this bench gave its clients (`client_kind`) and of the global model the report names. What a
# stage also does and is not counted: Python and data movement between the layers, the
# optimiser's steps, the jitter of a student's samples, the teacher mixtures' softmax (fedmho-cw)
# and Bernoulli draws of pixels. A teacher pass, a decode and an evaluation are forward passes:
# models x samples x MACs. A student's training is the cost model's `train_macs`: about 3 x
# samples x epochs x MACs for forward + backward (the backward computes no gradient for the
# input, so the true count is a little lower). Bytes, where a stage moves memory rather than
# multiplying: the ingest reads every upload file once (`upload_bytes`, the ingest's own
# listing: a lower bound, the checks parse and rebuild each again); an average reads each
# averaged classifier's fp32 weights once (a lower bound: the float64 running sum moves more).
# Not counted ("-"): the export (tracing and serialising), the class-mean filter, the robust
# screen (a probe, repairs and inversions whose sizes the report does not give), and the
# generator games of dense and fedhydra and pFedZKD's inversion (steps of generators and
# input gradients through the teachers that the report does not give in enough detail).


@functools.cache
def _kind_spec(kind: tuple) -> ModelSpec:
    _, name, params = kind
    return make_spec(name, SHAPE, CLASSES, **dict(params))


def _spec(client_id: str) -> ModelSpec:
    """The spec this bench gave client i ("client-0000i")."""
    i = int(client_id.rsplit("-", 1)[1])
    profile, name, params = client_kind(i)
    return _kind_spec((profile, name, tuple(sorted(params.items()))))


@functools.cache
def _decoder_macs(spec_json: str) -> int:
    """MACs per sample of a CVAE's decoder alone (`costs` counts encoder + decoder)."""
    calls = layer_table(ModelSpec.from_json(spec_json))
    return sum(c.macs for c in calls if c.name.startswith("decoder."))


def _macs(client_ids) -> int:
    """One forward pass of each of these clients' models, summed (per sample)."""
    return sum(costs(_spec(c)).macs for c in client_ids)


def global_spec(model: Path) -> ModelSpec | None:
    """The spec the global model's metadata names (None for an ensemble of members)."""
    meta = exporters.peek_metadata(model) if model.exists() else None
    spec = (meta or {}).get("spec")
    return ModelSpec.from_dict(spec) if isinstance(spec, dict) else None


def stage_work(method: str, rep: dict, spec: ModelSpec | None, ingest_bytes: int) -> dict:
    """stage -> {"macs": n} or {"bytes": n}: what `method`'s report (`rep`) says each stage
    computed, counted as the comment above says; a stage left out is not counted."""
    work: dict[str, dict] = {"ingest": {"bytes": ingest_bytes}}
    kinds = {a["client_id"]: a["kind"] for a in rep.get("accepted", [])}
    teachers = [c for c in rep.get("used") or [] if kinds.get(c) == "classifier"]
    epochs = len(rep.get("loss_history") or [])
    if method == "fedavg" and rep.get("averaged"):
        work["average"] = {"bytes": sum(costs(_spec(c)).weight_bytes for c in rep["averaged"])}
    if method in ("fedmho", "fedmho-md", "fedmho-sd", "fedmho-cw"):
        w0 = rep.get("initialised_from") or []
        if method != "fedmho-cw":  # fedmho-cw averages outside a stage
            work["initialise"] = {"bytes": sum(costs(_spec(c)).weight_bytes for c in w0)}
        drawn = rep.get("synthetic_per_decoder") or {}
        work["generate"] = {
            "macs": sum(_decoder_macs(_spec(c).to_json()) * sum(r) for c, r in drawn.items())
        }
        # the teacher pass and the training see the samples the filter kept (fedmho-cw: all)
        kept = sum(rep.get("synthetic_kept_per_class") or rep.get("synthetic_per_class") or [])
        if method in ("fedmho-md", "fedmho-cw"):  # every classifier used teaches
            work["teacher"] = {"macs": _macs(teachers) * kept}
        if method == "fedmho-sd" and spec is not None:  # the frozen w0 alone
            work["teacher"] = {"macs": costs(spec).macs * kept}
        if spec is not None and epochs:
            work["train"] = {"macs": costs(spec).train_macs(kept * epochs)}
    if method == "fedcvae-ens":
        drawn = rep.get("synthetic_per_client") or {}
        work["generate"] = {
            "macs": sum(_decoder_macs(_spec(c).to_json()) * k for c, k in drawn.items())
        }
        samples = sum(rep.get("synthetic_per_class") or [])
        if spec is not None and epochs:
            work["train"] = {"macs": costs(spec).train_macs(samples * epochs)}
    if method == "pfedzkd" and rep.get("teachers"):
        inverted = rep["teachers"]  # each teacher's pseudo-images, then as many mixes
        samples = sum(t["images"] for t in inverted) + rep.get("mixes", 0)
        work["label"] = {"macs": _macs([t["client_id"] for t in inverted]) * samples}
        if spec is not None and epochs:
            work["distill"] = {"macs": costs(spec).train_macs(samples * epochs)}
    tested = (rep.get("eval") or {}).get("samples")
    # onnxruntime runs the exported model, on its own pool of threads (a core each by default),
    # not torch's: on more cores than the run's torch threads its fraction can pass 100 %.
    if tested:
        if spec is not None:
            work["eval"] = {"macs": costs(spec).macs * tested}
        elif rep.get("members"):  # an ensemble: every member on every test sample
            work["eval"] = {"macs": _macs(rep["members"]) * tested}
    return work


# The fusion's multiply-adds (a teacher pass, a decode, a student's training, the evaluation) run
# on `server fuse --device`; the ingest and the weight reads run on the CPU.
DEVICE_STAGES = ("generate", "teacher", "train", "eval")


def stage_rates(row: dict, peak: dict) -> dict:
    """stage -> its achieved rate and fraction of the run's peak (the larger of the before and
    after measurements): {"gmac_s", "of_matmul"} for counted MACs, {"gb_s", "of_copy"} for
    counted bytes; a stage without counted work or time is left out. A fusion on a GPU is
    measured against the GPU's matmul (`peak["device"]`); where the run measured none,
    "of_matmul" is None (a CPU peak says nothing of a GPU stage)."""
    matmul = max(peak["matmul_gmacs"], peak.get("matmul_gmacs_after") or 0)
    copy = max(peak["copy_gbs"], peak.get("copy_gbs_after") or 0)
    on_gpu = row.get("device", "cpu") != "cpu"
    gpu = peak.get("device") or {}
    gpu_matmul = max(gpu.get("matmul_gmacs") or 0, gpu.get("matmul_gmacs_after") or 0)
    seconds = row.get("stages", {})
    out = {}
    for stage, work in row.get("work", {}).items():
        t = seconds.get(stage)
        if not t or t <= 0:
            continue
        if "macs" in work:
            rate = work["macs"] / t / 1e9
            of = matmul
            if on_gpu and stage in DEVICE_STAGES:
                of = gpu_matmul or None
            out[stage] = {"gmac_s": _sig(rate), "of_matmul": _sig(rate / of) if of else None}
        elif "bytes" in work:
            rate = work["bytes"] / t / 1e9
            out[stage] = {"gb_s": _sig(rate), "of_copy": _sig(rate / copy)}
    return out


def _sig(x: float) -> float:
    """`x` to 4 significant digits (a tiny run's rates are small, not zero)."""
    return float(f"{x:.4g}")


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
    ap.add_argument("--build-jobs", type=int, default=1, help="processes making a federation")
    ap.add_argument("--device", default="cpu", help="server fuse --device (cuda on a GPU machine)")
    ap.add_argument(
        "--resident-mib", type=int, default=None, help="server fuse --resident-mib (0: park all)"
    )
    ap.add_argument(
        "--merge", nargs="+", metavar="JSON", help="only write --out from earlier runs' JSON"
    )
    args = ap.parse_args()
    if args.build_jobs < 1:
        ap.error(f"--build-jobs {args.build_jobs}: give 1 or more (1 by default)")
    if args.merge:
        runs = [json.loads(Path(f).read_text()) for f in args.merge]
        for r in runs:
            _mark_gpu_rows(r)
        federations = {int(n): f for r in runs for n, f in r["federations"].items()}
        rows = [row for r in runs for row in r["rows"]]
        heads = [h for r in runs for h in r.get("runs", [r])]  # a merged record's runs, in turn
        commands = [h["command"] for h in heads]
        heads = [
            {k: h[k] for k in HEADER} | ({"peak": h["peak"]} if "peak" in h else {}) for h in heads
        ]
        write(args, rows, federations, {"runs": heads})
        print("\n".join(commands))
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="edgefl-scale-"))
    rows, federations = [], {}
    threads = fuse_threads()
    peak = machine_peak(threads) | device_peak(args.device)
    print(f"peak before: {json.dumps(peak)}", flush=True)
    for n in [int(s) for s in args.sizes.split(",")]:
        fed = work / f"n{n}"
        print(f"[{n}] making the federation in {fed}", flush=True)
        federations[n] = make_federation(n, fed, args.partition, args.min_size, 0, args.build_jobs)
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
            write(args, rows, federations, peak=peak)
    after = machine_peak(threads) | device_peak(args.device)
    print(f"peak after: {json.dumps(after)}", flush=True)
    peak |= {"matmul_gmacs_after": after["matmul_gmacs"], "copy_gbs_after": after["copy_gbs"]}
    if "device" in peak:
        peak["device"] |= {f"{k}_after": after["device"][k] for k in ("matmul_gmacs", "copy_gbs")}
    write(args, rows, federations, peak=peak)


def device_peak(device: str) -> dict:
    """{"device": {"name", "matmul_gmacs", "copy_gbs"}} of the GPU a `--device cuda` fusion runs
    on (`_peak.gpu_peaks`; strict fp32, as edgefl leaves torch's matmul precision); {} on the
    CPU."""
    if torch.device(device).type != "cuda":
        return {}
    gpu = gpu_peaks(device)
    return {
        "device": {
            "name": gpu["gpu"],
            "matmul_gmacs": gpu["matmul_gmacs_fp32"],
            "copy_gbs": gpu["copy_gbs"],
        }
    }


def _mark_gpu_rows(record: dict) -> None:
    """Rows of a record made before rows named their device: a `--device cuda` run's (every run
    of a merged record so) get "device" cuda, and without a GPU peak in the record their fusion
    stages' fraction of peak becomes None (they were once divided by the CPU's matmul)."""
    heads = record.get("runs", [record])
    if not all(" --device cuda" in h["command"] for h in heads):
        return
    gpu_peak = all((h.get("peak") or {}).get("device") for h in heads)
    for row in record["rows"]:
        if "device" in row:
            continue
        row["device"] = "cuda"
        for stage, rate in row.get("rates", {}).items():
            if stage in DEVICE_STAGES and "of_matmul" in rate and not gpu_peak:
                rate["of_matmul"] = None


def fuse_threads() -> int:
    """The torch threads of the `server fuse` child: it inherits OMP_NUM_THREADS (set to 1 above
    unless given), which torch reads when it starts and edgefl does not change for one method."""
    try:
        return max(1, int(os.environ["OMP_NUM_THREADS"].split(",")[0]))
    except (KeyError, ValueError):
        return torch.get_num_threads()


HEADER = ("command", "date", "machine", "commit")


def write(
    args, rows: list[dict], federations: dict, merged: dict | None = None, peak: dict | None = None
) -> None:
    # Merged: the runs' own headers, each line naming its command, date and commit (and peak);
    # their rows keep the rates their own run wrote.
    header = merged or (run_header("bench/bench_scale.py") | ({"peak": peak} if peak else {}))
    if peak and not merged:
        for r in rows:
            if "work" in r:
                r["rates"] = stage_rates(r, peak)
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
    lines += ["", *peak_lines(runs, rows)]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def _peak_text(peak: dict | None) -> str:
    if not peak:
        return "not measured (recorded before bench/_peak.py)"

    text = (
        f"dense fp32 matmul {_pair(peak, 'matmul_gmacs')} GMAC/s, copy "
        f"{_pair(peak, 'copy_gbs')} GB/s (CPU, before / after the run, {peak['threads']} torch "
        "thread(s))"
    )
    gpu = peak.get("device")
    if gpu:
        text += (
            f"; {gpu['name']}: dense fp32 matmul {_pair(gpu, 'matmul_gmacs')} GMAC/s, copy "
            f"{_pair(gpu, 'copy_gbs')} GB/s"
        )
    return text


def _pair(m: dict, key: str) -> str:
    """A measurement, "before / after" where the run measured it again at its end."""
    after = m.get(key + "_after")
    return f"{m[key]}" if after is None else f"{m[key]} / {after}"


def _counted(work: dict) -> str:
    if "macs" in work:
        return f"{work['macs'] / 1e9:,.2f} GMAC"
    if "bytes" in work:
        return f"{work['bytes'] / 1e6:,.1f} MB"
    return "-"


def _achieved(rate: dict) -> tuple[str, str]:
    if "gmac_s" in rate:
        if rate["of_matmul"] is None:
            return f"{rate['gmac_s']:.3g} GMAC/s", "- (on the GPU; no GPU peak in this run)"
        return f"{rate['gmac_s']:.3g} GMAC/s", f"{100 * rate['of_matmul']:.3g} % of matmul"
    if "gb_s" in rate:
        return f"{rate['gb_s']:.3g} GB/s", f"{100 * rate['of_copy']:.3g} % of copy"
    return "-", "-"


def peak_lines(runs: list[dict], rows: list[dict]) -> list[str]:
    """Each stage of at least 50 ms against the machine's peak: its time, the work counted
    (`stage_work`), the rate achieved and its fraction of the run's matmul peak (MACs) or copy
    bandwidth (bytes); "-" where nothing is counted or the run measured no peak."""
    lines = [
        "Each stage against the machine's own peak, measured in the same run "
        "(bench/_peak.py; fractions of the larger of before and after):",
        "",
        *[f"- `{r['command']}`: {_peak_text(r.get('peak'))}" for r in runs],
        "",
        "| uploads | method | stage | s | work counted | achieved | of peak |",
        "|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "stages" not in r:
            continue
        work, rates = r.get("work", {}), r.get("rates", {})
        for stage, t in r["stages"].items():
            if t < 0.05:
                continue
            achieved, of = _achieved(rates.get(stage, {}))
            counted = _counted(work.get(stage, {}))
            lines.append(
                f"| {r['n']:,} | {r['method']} | {stage} | {t:.2f} | {counted} | {achieved} | {of} |"
            )
    return lines


if __name__ == "__main__":
    main()
