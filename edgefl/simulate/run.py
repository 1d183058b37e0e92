"""A one-shot federation on one machine, through the same code paths as real devices and server:
clients via `run_client` (as `edgefl client train`), fusion via `run_fuse` (as `edgefl server
fuse`). Every client trains single-threaded (as a device would), so results do not depend on
`--jobs`. Resumable: a finished upload or global model is never redone or overwritten.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

import exporters
from edgefl.client.run import ClientJob, local_schedule, parse_model_arg, run_client
from edgefl.data.registry import DATASETS
from edgefl.errors import ConfigError, FusionError
from edgefl.fusion import METHODS
from edgefl.models.plan import plan
from edgefl.models.spec import ModelSpec
from edgefl.profiles import get_profile
from edgefl.server.fuse import FuseJob, resolve_device, run_fuse
from edgefl.simulate.reference import paper_reference

# Budget-true classifiers are capped so a 10-client CPU simulation of every method stays within
# minutes (bench/ records the effect); the cap never lets a model exceed its device's budget.
DEFAULT_MAX_CLASSIFIER_MACS = 2_000_000


@dataclass(frozen=True)
class SimJob:
    dataset: str = "mnist"
    clients: int = 10
    partition: str = "dirichlet:0.5"
    mix: str = "smartphone:5,wristband:5"
    methods: tuple[str, ...] = ("fedavg", "ensemble", "fedcvae-ens", "fedmho", "fedmho-md",
                                "fedmho-sd")  # fmt: skip
    seed: int = 0
    out: str = "runs/sim"
    jobs: int = 1
    device: str = "auto"  # fusion
    train_device: str = "cpu"  # client training: cpu (device-like) | cuda | auto
    paper_models: bool = False
    paper_classifier: str = "cnn"  # with --paper-models: cnn (small prototype) or vgg9
    max_classifier_macs: int | None = DEFAULT_MAX_CLASSIFIER_MACS
    classifier_epochs: int | None = None  # default: the profile's
    generator_epochs: int | None = None
    classifier_lr: float | None = None  # default: the client's for the profile's optimizer
    generator_lr: float | None = None
    subset: int | None = None  # use only this many training samples (quick runs)
    data_dir: str | None = None
    fuse_options: dict[str, dict[str, Any]] = field(default_factory=dict)  # method -> options
    public_size: int | None = None  # public split carved from train (default 5,000 if needed)

    def validate(self) -> None:
        if self.clients < 1:
            raise ConfigError(f"--clients must be >= 1, got {self.clients}")
        if self.jobs < 1:
            raise ConfigError(f"--jobs must be >= 1, got {self.jobs}")
        for m in self.methods:
            METHODS.get(m)
        for m in self.fuse_options:
            METHODS.get(m)
        resolve_device(self.train_device, "--train-device")
        # Checked here, by the simulate flag's name, before any client trains.
        schedule = (
            ("--classifier-lr", self.classifier_lr, "1e-3"),
            ("--generator-lr", self.generator_lr, "1e-3"),
            ("--classifier-epochs", self.classifier_epochs, "10"),
            ("--generator-epochs", self.generator_epochs, "10"),
        )
        for flag, value, example in schedule:
            if value is not None and not value > 0:
                raise ConfigError(
                    f"{flag} must be > 0, got {value}",
                    hint=f"e.g. {flag} {example}, or leave it out for the default",
                )

    @property
    def needs_predictions(self) -> bool:
        return any("predictions" in METHODS.get(m).consumes for m in self.methods)

    @property
    def needs_public(self) -> bool:
        return any(m in ("feddf", "fedol") for m in self.methods)

    @property
    def public(self) -> int:
        """Samples carved out of train as the unlabeled public set (0 when no method uses it)."""
        if self.public_size is not None:
            return self.public_size
        return 5_000 if self.needs_public else 0


def parse_mix(mix: str, clients: int) -> list[str]:
    """'smartphone:5,wristband:5' -> a profile name per client, in order."""
    out: list[str] = []
    for part in filter(None, (p.strip() for p in mix.split(","))):
        name, _, count = part.rpartition(":")
        if not name or not count.isdigit():
            raise ConfigError(f"--mix expects PROFILE:COUNT,..., got {part!r}",
                              hint="e.g. --mix smartphone:5,wristband:5")  # fmt: skip
        get_profile(name)
        out += [name] * int(count)
    if len(out) != clients:
        raise ConfigError(
            f"--mix assigns {len(out)} clients but --clients is {clients}",
            hint="make the counts in --mix add up to --clients",
        )
    return out


def _model_for(job: SimJob, profile: str, info, n_train: int) -> str:
    """One architecture per device class (FedAvg and FedMHO's w0 need it): planned once per
    profile on the nominal shard size, or the paper's prototypes with --paper-models."""
    role = plan(get_profile(profile), info, samples=n_train // job.clients).role
    if job.paper_models:
        return job.paper_classifier if role == "classifier" else "cvae-small"
    cap = job.max_classifier_macs if role == "classifier" else None
    p = plan(get_profile(profile), info, samples=max(1, n_train // job.clients), max_macs=cap)
    return p.spec.name + (":" + ",".join(f"{k}={_fmt(v)}" for k, v in p.spec.params.items())
                          if p.spec.params else "")  # fmt: skip


def _fmt(v) -> str:
    if isinstance(v, list):
        return "x".join(str(i) for i in v)
    return str(v).lower() if isinstance(v, bool) else str(v)


def client_jobs(job: SimJob) -> list[ClientJob]:
    profiles = parse_mix(job.mix, job.clients)
    info = DATASETS.get(job.dataset)  # unknown name: UnknownNameError listing the datasets
    n_train = job.subset or info.train_size
    models = {p: _model_for(job, p, info, n_train) for p in dict.fromkeys(profiles)}
    train_device = resolve_device(job.train_device, "--train-device").type
    jobs = []
    for i, prof in enumerate(profiles):
        model = models[prof]
        is_gen = model.startswith("cvae")
        # Classifier clients of a FedOL run train once and send predictions; their model stays
        # on the device (kept in uploads/ so model-based methods can run side by side).
        predictions = job.needs_predictions and not is_gen
        extra = dict(kind="predictions", public=f"{job.dataset}:public",
                     keep_model=str(Path(job.out) / "uploads")) if predictions else {}  # fmt: skip
        jobs.append(ClientJob(
            **extra, public_size=job.public,
            profile=prof, dataset=job.dataset,
            out_dir=str(Path(job.out) / ("uploads-predictions" if predictions else "uploads")),
            data_dir=job.data_dir, partition=job.partition, num_clients=job.clients,
            client_index=i, partition_seed=job.seed, model=model, seed=job.seed,
            fed_seed=job.seed, force=job.paper_models,
            epochs=job.generator_epochs if is_gen else job.classifier_epochs,
            lr=job.generator_lr if is_gen else job.classifier_lr,
            train_device=train_device,
            subset=job.subset,
        ))  # fmt: skip
    return jobs


def _train_one(cjob: ClientJob) -> dict:
    # Single-threaded like a device, and so that --jobs never changes a result bit.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = run_client(cjob)
    finally:
        torch.set_num_threads(threads)
    if not cjob.keep_model:
        return result.as_dict()
    # Report the kept model as the client's model upload, the predictions beside it.
    summary = _finished(cjob)
    return summary | {"reused": False}


def _finished(cjob: ClientJob) -> dict | None:
    """The summary of an upload a previous run finished (exports are atomic: a file that exists
    is complete), if it was made by the same job."""
    path = Path(cjob.out_dir) / f"client-{cjob.client_index:03d}.onnx"
    if cjob.keep_model:  # a predictions client: its kept model is written first, then the upload
        pred, path = path, Path(cjob.keep_model) / path.name
        if not (pred.exists() and path.exists()):
            return None
        summary = _finished(replace(cjob, keep_model=None, kind="model",
                                    out_dir=cjob.keep_model))  # fmt: skip
        return summary | {"predictions_path": str(pred),
                          "predictions_bytes": pred.stat().st_size}  # fmt: skip
    if not path.exists():
        return None
    meta = exporters.read_artifact(path).metadata
    part = meta.get("partition", {})
    if part.get("scheme") != cjob.partition or part.get("seed") != cjob.partition_seed or \
            meta.get("profile") != cjob.profile:  # fmt: skip
        raise ConfigError(
            f"{path} was made by a different run (partition/profile differ)",
            hint="use a fresh --out directory for a different setting",
        )
    spec = ModelSpec.from_dict(meta["spec"])
    role = "classifier" if meta["kind"] == "classifier" else "generator"
    differs = _training_differs(cjob, spec, role, meta["training"])
    if differs:  # reusing it would report a model trained otherwise than asked
        raise ConfigError(
            f"{path} was trained with other settings ({differs})",
            hint="use a fresh --out directory, or delete that upload to retrain it",
        )
    return {"path": str(path), "client_id": meta["client_id"], "role": role, "model": spec.label,
            "profile": meta["profile"], "training": meta["training"],
            "label_counts": meta["label_counts"], "upload_bytes": path.stat().st_size,
            "costs": meta["costs"], "reused": True}  # fmt: skip


def _training_differs(cjob: ClientJob, made: ModelSpec, role: str, trained: dict) -> str:
    """What an existing upload (its spec, role and training metadata) has differently from the
    job ('' if nothing)."""
    diffs = []
    if cjob.model is not None:
        want = parse_model_arg(cjob.model, made.input_shape, made.num_classes)
        if want.to_dict() != made.to_dict():
            diffs.append(f"model {made.label} -> {want.label}")
    epochs, lr = local_schedule(cjob, get_profile(cjob.profile), role)
    for key, want in (("epochs", epochs), ("lr", lr)):
        if trained.get(key) != want:
            diffs.append(f"{key} {trained.get(key)} -> {want}")
    return ", ".join(diffs)


def train_clients(job: SimJob, log) -> list[dict]:
    cjobs = client_jobs(job)
    results: list[dict | None] = [_finished(c) for c in cjobs]
    todo = [i for i, r in enumerate(results) if r is None]
    if len(todo) < len(cjobs):
        log(f"reusing {len(cjobs) - len(todo)} finished upload(s)")
    if job.jobs == 1 or len(todo) <= 1:
        for i in todo:
            log(f"training client {i} ({cjobs[i].profile}, {cjobs[i].model})")
            results[i] = _train_one(cjobs[i])
    else:
        ctx = multiprocessing.get_context("spawn")  # fork + torch threads is unsafe
        with ProcessPoolExecutor(max_workers=job.jobs, mp_context=ctx) as pool:
            futures = {i: pool.submit(_train_one, cjobs[i]) for i in todo}
            for i, fut in futures.items():
                results[i] = fut.result()
                log(f"client {i} done ({cjobs[i].profile}, {results[i]['model']})")
    return results  # type: ignore[return-value]


def fuse_all(job: SimJob, log, clients: list[dict] | None = None) -> dict[str, dict]:
    out = Path(job.out)
    reports = {}
    for method in job.methods:
        if method == "fedgh":  # judged per client, not by one global model
            from edgefl.simulate.fedgh import run_fedgh

            log("fedgh: prototypes -> shared header -> personalized models")
            try:
                reports[method] = run_fedgh(job, client_jobs(job), clients or [],
                                            dict(job.fuse_options.get(method, {})), log)  # fmt: skip
            except FusionError as exc:
                reports[method] = {"error": exc.message, "used": [], "total_seconds": 0.0}
            continue
        model = out / "global" / f"{method}.onnx"
        report = model.with_suffix(".json")
        options = dict(job.fuse_options.get(method, {})) | {"seed": job.seed}
        if method in ("feddf", "fedol"):  # the server carves the same public split
            options |= {"public": f"{job.dataset}:public", "public_size": job.public,
                        "public_seed": job.seed, "public_subset": job.subset}  # fmt: skip
        if model.exists() and report.exists():
            reports[method] = _reuse_global(method, options, report)
            log(f"reusing finished {method}")
            continue
        log(f"fusing with {method}")
        consumes = METHODS.get(method).consumes
        folder = "uploads-predictions" if "predictions" in consumes else "uploads"
        try:
            reports[method] = run_fuse(FuseJob(
                uploads=str(out / folder), method=method, out=str(model), options=options,
                device=job.device, eval=f"{job.dataset}:test", data_dir=job.data_dir,
            ))  # fmt: skip
        except FusionError as exc:  # e.g. fedavg over mixed architectures: a result, not a crash
            log(f"{method} refused: {exc.message}")
            reports[method] = {"error": exc.message, "used": [], "total_seconds": 0.0}
    return reports


def _reuse_global(method: str, options: dict, report: Path) -> dict:
    """A finished global model is reused only if it was fused with the same configuration."""
    done = json.loads(report.read_text())
    want = json.loads(json.dumps(METHODS.get(method).make_config(options).as_dict(), default=str))
    have = done.get("config", {})
    diff = sorted(k for k in want.keys() | have.keys() if want.get(k) != have.get(k))
    if diff:
        changes = ", ".join(f"{k} {have.get(k)!r} -> {want.get(k)!r}" for k in diff)
        raise ConfigError(
            f"{report.with_suffix('.onnx')} was fused with other options ({changes})",
            hint=f"use a fresh --out, or delete {report.parent} to fuse again with the new options",
        )
    return done


def simulate(job: SimJob, log=None) -> dict:
    log = log or (lambda m: None)
    job.validate()
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    clients = train_clients(job, log)
    t_clients = time.perf_counter() - t0
    t1 = time.perf_counter()
    reports = fuse_all(job, log, clients)
    t_fuse = time.perf_counter() - t1
    upload = {c["client_id"]: c["upload_bytes"] for c in clients}
    pred_bytes = {c["client_id"]: c.get("predictions_bytes", 0) for c in clients}
    reference = paper_reference(job.dataset, job.partition, job.clients)
    rows = []
    for m, rep in reports.items():
        rows.append({
            "method": m, "accuracy": rep.get("accuracy"), "fuse_seconds": rep["total_seconds"],
            "upload_bytes": sum(_upload_bytes(m, c, upload, pred_bytes, out) for c in rep["used"]),
            "clients_used": len(rep["used"]), "paper": reference.get(m), "error": rep.get("error"),
            "standalone_accuracy": rep.get("standalone_accuracy"), "metric": rep.get("metric"),
        })  # fmt: skip
    results = {
        "job": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(job).items()},
        "clients": clients,
        "results": rows,
        "seconds": {"clients": t_clients, "fusion": t_fuse, "total": time.perf_counter() - t0},
        "paper_reference": reference,
        "host": {
            "cpu_count": __import__("os").cpu_count(),
            "torch": torch.__version__,
            # A method refused before fusing has no device in its report.
            "device": next((r["device"] for r in reports.values() if "device" in r), None),
        },  # fmt: skip
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    exporters.atomic_write_text(out / "results.json", json.dumps(results, indent=2, default=str))
    exporters.atomic_write_text(out / "results.md", results_markdown(results))
    _pictures(job, results, out)
    return results


def _upload_bytes(method: str, client: str, models: dict, predictions: dict, out: Path) -> int:
    consumes = METHODS.get(method).consumes
    if "predictions" in consumes:
        return predictions.get(client, 0)
    if "prototypes" in consumes:
        path = out / "uploads-prototypes" / f"{client}.onnx"
        return path.stat().st_size if path.exists() else 0
    return models.get(client, 0)


def accuracy_text(row: dict) -> str:
    if row["accuracy"] is None:
        return f"refused: {row['error']}"
    text = f"{100 * row['accuracy']:.2f}"
    if row.get("standalone_accuracy") is not None:  # FedGH: local test splits, vs alone
        text += f" (local; standalone {100 * row['standalone_accuracy']:.2f})"
    return text


def results_markdown(results: dict) -> str:
    j = results["job"]
    lines = [
        f"# edgefl simulate: {j['dataset']}, {j['clients']} clients, {j['partition']}, "
        f"mix {j['mix']}, seed {j['seed']}" + (" (paper models)" if j["paper_models"] else ""),
        "",
        f"Run {results['date_utc']} UTC; clients {results['seconds']['clients']:.0f} s, "
        f"fusion {results['seconds']['fusion']:.0f} s.",
        "",
        "| method | accuracy (%) | paper (%) | fuse time (s) | upload bytes |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results["results"]:
        acc = accuracy_text(r)
        paper = f"{r['paper']:.2f}" if r.get("paper") is not None else "-"
        lines.append(f"| {r['method']} | {acc} | {paper} | {r['fuse_seconds']:.1f} | "
                     f"{r['upload_bytes']:,} |")  # fmt: skip
    lines += ["", "| client | profile | role | model | val acc | upload bytes |",
              "|---|---|---|---|---:|---:|"]  # fmt: skip
    for c in results["clients"]:
        va = c["training"].get("val_accuracy")
        lines.append(f"| {c['client_id']} | {c['profile']} | {c['role']} | {c['model']} | "
                     f"{'-' if va is None else f'{100 * va:.1f}'} | {c['upload_bytes']:,} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _pictures(job: SimJob, results: dict, out: Path) -> None:
    from edgefl.client.sample import sample_grid
    from edgefl.data.plots import plot_label_heatmap
    from edgefl.plots import plot_accuracy_bars

    rows = [r for r in results["results"] if r["accuracy"] is not None]
    if rows:
        plot_accuracy_bars([r["method"] for r in rows], [r["accuracy"] for r in rows],
                           out / "accuracy.png", title=f"{job.dataset} {job.partition}",
                           reference=results["paper_reference"] or None)  # fmt: skip
    counts = np.array([c["label_counts"] for c in results["clients"]])
    plot_label_heatmap(counts, out / "label_distribution.png",
                       title=f"{job.dataset} {job.partition}: labels per client")  # fmt: skip
    for c in results["clients"]:
        if c["role"] == "generator":
            sample_grid(c["path"], per_class=8, out=str(out / f"samples_{c['client_id']}.png"))
