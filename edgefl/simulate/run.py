"""A one-shot federation on one machine, through the same code paths as real devices and server:
clients via `run_client` (as `edgefl client train`), fusion via the server pipeline (as `edgefl
server fuse`), every method from one ingest of each upload folder. Every client trains
single-threaded (as a device would), so results do not depend on `--jobs`. Resumable: a
finished upload or global model is never redone or overwritten (edgefl.simulate.resume).
The methods are read through their contract; this module never names one.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

import exporters
from edgefl.chance import classifier_warnings
from edgefl.client.attacks import assign
from edgefl.client.job import ClientJob, SimSettings
from edgefl.client.privacy import whole_shard_warnings
from edgefl.client.run import preflight
from edgefl.data.registry import DATASETS
from edgefl.errors import ConfigError, EdgeflError, FusionError
from edgefl.fusion import METHODS, paper_reference
from edgefl.fusion.caps import over_caps
from edgefl.fusion.config import PublicSetConfig
from edgefl.models.parse import parse_model_arg
from edgefl.models.plan import dp_untrainable, plan
from edgefl.models.zoo import role_of
from edgefl.outputs import lock_outputs
from edgefl.profiles import get_profile
from edgefl.progress import log_lines, no_progress, printable
from edgefl.server.fuse import fuse_methods, refused_report
from edgefl.server.plan import plan as plan_fuse
from edgefl.server.plan import resolve_device
from edgefl.simulate.job import SEARCH, SimJob, parse_mix
from edgefl.simulate.personalized import run_per_client
from edgefl.simulate.pool import train_jobs
from edgefl.simulate.render import pictures, results_markdown, upload_bytes
from edgefl.simulate.resume import changed_uploads, finished, reuse_global, upload_path


def _model_for(job: SimJob, profile: str, info, n_train: int) -> str:
    """One architecture per device class (FedAvg and FedMHO's w0 need it): the one named for it
    (--client-model), else planned once per profile on the nominal shard size, or the paper's
    prototypes with --paper-models."""
    if profile in job.client_models:
        return job.client_models[profile]
    dp = job.dp is not None  # DP-SGD's memory and its BatchNorm-free models
    if job.paper_models:
        # The paper's roles (large devices classifiers, small ones CVAEs), as planned without
        # DP: under DP the phone's planned VGG-9 does not fit, which turned the paper's `cnn`
        # phones into CVAEs (the `cnn` itself fits them under DP).
        role = plan(get_profile(profile), info, samples=n_train // job.clients).role
        return job.paper_classifier if role == "classifier" else "cvae-small"
    role = plan(get_profile(profile), info, samples=n_train // job.clients, dp=dp).role
    cap = job.max_classifier_macs if role == "classifier" else None
    p = plan(
        get_profile(profile), info, samples=max(1, n_train // job.clients), max_macs=cap, dp=dp
    )
    return p.spec.name + (
        ":" + ",".join(f"{k}={_fmt(v)}" for k, v in p.spec.params.items()) if p.spec.params else ""
    )


def _fmt(v) -> str:
    if isinstance(v, list):
        return "x".join(str(i) for i in v)
    return str(v).lower() if isinstance(v, bool) else str(v)


def _roles(job: SimJob) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """(each client's profile, each profile's model, each profile's role)."""
    profiles = parse_mix(job.mix, job.clients)
    info = DATASETS.get(job.dataset)  # unknown name: UnknownNameError listing the datasets
    n_train = job.subset or info.train_size
    models = {p: _model_for(job, p, info, n_train) for p in dict.fromkeys(profiles)}
    roles = {
        p: "classifier"
        if m.startswith(SEARCH)
        else role_of(parse_model_arg(m, info.input_shape, info.num_classes))
        for p, m in models.items()
    }
    return profiles, models, roles


def _input_shape(job: SimJob) -> tuple[int, ...]:
    return tuple(DATASETS.get(job.dataset).input_shape)


def check_dp_models(job: SimJob) -> None:
    """Under --dp, a model a device class is made to train (--client-model, --paper-models)
    that DP-SGD cannot train, refused before any client trains: it was refused at that
    client's turn, after the others had trained (the planner's own picks are DP-ready)."""
    if job.dp is None:
        return
    info = DATASETS.get(job.dataset)
    _, models, _ = _roles(job)
    for prof, model in models.items():
        if model.startswith(SEARCH):
            continue  # refused with --dp by SimJob.validate
        why = dp_untrainable(parse_model_arg(model, info.input_shape, info.num_classes))
        if why is not None:
            raise ConfigError(
                f"--dp cannot train {prof}'s model {model} ({why})",
                hint=f"name one without BatchNorm (e.g. --client-model {prof}=scnn:bn=false), "
                f"or leave {prof} to the planner",
            )


def check_dp_clients(job: SimJob) -> None:
    """Under --dp, each client's refusals before the first client trains: a delta above 1/n of
    a small shard, a DP batch a device cannot hold (without this they came when that client's
    turn did, after the others had trained). Uploads already finished are not checked again."""
    if job.dp is None:
        return
    for cjob in client_jobs(job):
        if finished(cjob) is not None:
            continue
        try:
            preflight(cjob)
        except EdgeflError as exc:
            raise ConfigError(
                f"client {cjob.client_index} ({cjob.profile}): {exc.message}",
                hint="in simulate: --dp EPS,delta=D,batch=B sets the DP plan (leave delta out "
                "for 1/n), --client-model PROFILE=MODEL a device class's model",
            ) from None


def client_jobs(job: SimJob) -> list[ClientJob]:
    profiles, models, roles = _roles(job)
    train_device = resolve_device(job.train_device, "--train-device").type
    attacks = assign(job.attacks, [roles[p] for p in profiles])
    return [
        _client_job(
            job, i, prof, models[prof], roles[prof] != "classifier", attacks[i], train_device
        )
        for i, prof in enumerate(profiles)
    ]


def _client_job(
    job: SimJob, i: int, prof: str, model: str, is_gen: bool, attack, train_device: str
) -> ClientJob:
    """Client `i` (a `prof`, training `model`): its data, its schedule by role, its attack."""
    search = model[len(SEARCH) :] if model.startswith(SEARCH) else None
    if search:  # the client finds its classifier; search options as the job's
        model = None
    # Classifier clients of a FedOL run train once and send predictions; their model stays
    # on the device (kept in uploads/ so model-based methods can run side by side).
    predictions = job.needs_predictions and not is_gen
    extra = (
        dict(
            kind="predictions",
            public=f"{job.dataset}:public",
            keep_model=str(Path(job.out) / "uploads"),
        )
        if predictions
        else {}
    )
    return ClientJob(
        **extra,
        public_size=job.public,
        profile=prof,
        dataset=job.dataset,
        out_dir=str(Path(job.out) / ("uploads-predictions" if predictions else "uploads")),
        data_dir=job.data_dir,
        partition=job.partition,
        num_clients=job.clients,
        client_index=i,
        partition_seed=job.seed,
        model=model,
        seed=job.seed,
        fed_seed=job.seed,
        force=job.paper_models or prof in job.client_models,
        epochs=job.generator_epochs if is_gen else job.classifier_epochs,
        lr=job.generator_lr if is_gen else job.classifier_lr,
        optimizer=job.generator_optimizer if is_gen else job.classifier_optimizer,
        batch_size=job.generator_batch_size if is_gen else job.classifier_batch_size,
        subset=job.subset,
        search=search,
        search_options=dict(job.search_options) if search else None,
        dp=job.dp,
        label_counts=job.label_counts,
        # Reproducible label noise: a simulation's seed is its own (a device's is secret).
        sim=SimSettings(train_device, attack, noise_seed=job.seed * 1000 + i),
    )


def train_clients(job: SimJob, log, progress=no_progress) -> list[dict]:
    cjobs = client_jobs(job)
    check_attackers(job, cjobs)
    results: list[dict | None] = [finished(c) for c in cjobs]
    todo = [i for i, r in enumerate(results) if r is None]
    if len(todo) < len(cjobs):
        log(f"reusing {len(cjobs) - len(todo)} finished upload(s)")
    done = len(cjobs) - len(todo)
    for i, result in train_jobs(cjobs, todo, job.jobs, log, progress, done).items():
        results[i] = result
    return with_attacks(results, cjobs)  # type: ignore[arg-type]


def with_attacks(results: list[dict], cjobs: list[ClientJob]) -> list[dict]:
    """Each client's result with the attack it ran: the run says who attacked; uploads never do."""
    return [r | {"attack": c.sim.attack} for r, c in zip(results, cjobs, strict=True)]


def check_attackers(job: SimJob, cjobs: list[ClientJob]) -> None:
    """Uploads carry no mark of an attack, so a rerun in the same --out may reuse them only if it
    asks for the same attackers: `attackers.json` records them."""
    path = Path(job.out) / "attackers.json"
    want = {f"client-{c.client_index:03d}": c.sim.attack for c in cjobs if c.sim.attack}
    have = json.loads(path.read_text()) if path.exists() else {}
    if have == want:
        return
    if not path.exists() and not any(upload_path(c).exists() for c in cjobs):
        Path(job.out).mkdir(parents=True, exist_ok=True)  # a fresh run: record its attackers
        exporters.atomic_write_text(path, json.dumps(want, indent=2))
        return
    raise ConfigError(
        f"{job.out} holds uploads of a run with other attackers ({have or 'none'}, now "
        f"{want or 'none'})",
        hint="use a fresh --out for a different --attack",
    )


def upload_folder(out: Path, kinds: tuple[str, ...]) -> Path:
    """Where the uploads a method consumes are: model uploads, or one folder per data kind."""
    data = [k for k in kinds if k in ("predictions", "prototypes")]
    return out / (f"uploads-{data[0]}" if data else "uploads")


def method_options(job: SimJob, name: str) -> dict[str, Any]:
    """The options a method fuses with in this run: the job's, its seed, and the public slice
    the clients carved (for a method that reads public data)."""
    method = METHODS.get(name)
    options = dict(job.fuse_options.get(name, {})) | {"seed": job.seed}
    if method.public_data and method.judged == "global":
        options |= PublicSetConfig.carved(
            f"{job.dataset}:public", job.public, job.seed, job.subset, str(job.partition)
        )
    return options


def refused_by_plan(job: SimJob) -> dict[str, FusionError]:
    """The methods whose max_teachers this job's classifier clients exceed, known from the mix
    before any client trains (the refusal after training is the same, from the files)."""
    methods = [METHODS.get(name) for name in job.methods]
    configured = [
        (m, m.make_config(method_options(job, m.name))) for m in methods if m.judged == "global"
    ]
    if not any(m.teacher_cap(cfg) for m, cfg in configured):
        return {}
    profiles, _, roles = _roles(job)
    classifiers = sum(roles[p] == "classifier" for p in profiles)
    return over_caps(configured, classifiers, flag="--fuse-opt")


def refused_by_kinds(job: SimJob) -> dict[str, FusionError]:
    """The methods that read no kind of upload this job's mix plans (classifier clients send
    classifiers, predictions or prototypes; CVAE clients decoders): an all-wristband mix, or
    one the DP planner made all CVAEs, gave every classifier method nothing to fuse, and it
    was found after every client had trained."""
    _, _, roles = _roles(job)
    planned = set()
    if "classifier" in roles.values():
        planned |= {"classifier", "predictions", "prototypes"}
    if any(r != "classifier" for r in roles.values()):
        planned.add("decoder")
    every = "classifier" if "decoder" not in planned else "CVAE (decoder uploads)"
    why = f"every client of --mix {job.mix} trains a {every}"
    fix = "add a device class that trains the other kind to --mix (e.g. smartphone for "
    fix += "classifiers, wristband for CVAEs)"
    if job.dp is not None and set(_roles(replace(job, dp=None))[2].values()) != set(roles.values()):
        why += " under --dp (without it some would not)"
        first = next(iter(roles))  # the mix's first device class
        fix = f"name a DP-trainable model for a device class (e.g. --client-model {first}=cnn)"
    return {
        name: FusionError(
            f"{name} reads {', '.join(m.consumes)} uploads, and {why}",
            hint=f"{fix}, or choose --methods that read what this mix uploads (`edgefl "
            "server methods` lists what each reads)",
        )
        for name in job.methods
        if not set((m := METHODS.get(name)).consumes) & planned
    }


def check_role_options(job: SimJob, given: frozenset[str] = frozenset()) -> None:
    """--classifier-* / --generator-* set one role's training: with no client of that role in
    the plan they were passed over (the CLI's check; a table's settings name both roles).
    `given`: which of --paper-models, --paper-classifier, --max-classifier-macs the user
    gave; each picks the models of classes --client-model leaves unnamed, and is refused
    where it names them all (the caps: all its classifier classes)."""
    _, _, roles = _roles(job)
    unnamed = {r for p, r in roles.items() if p not in job.client_models}
    for flag in sorted(given):
        whose = "device class" if flag == "--paper-models" else "classifier class"
        if not (unnamed if flag == "--paper-models" else "classifier" in unnamed):
            raise ConfigError(
                f"{flag} picks the models of the device classes --client-model does not name, "
                f"and --client-model names every {whose} of --mix {job.mix}",
                hint=f"drop {flag}, or a --client-model",
            )
    kinds = set(roles.values())
    present = {"classifier": "classifier" in kinds, "generator": bool(kinds - {"classifier"})}
    for role, name, other in (("classifier", "classifier", "smartphone"),
                              ("generator", "CVAE", "wristband")):  # fmt: skip
        if present[role]:
            continue
        for what in ("epochs", "lr", "optimizer", "batch_size"):
            if getattr(job, f"{role}_{what}") is not None:
                flag = f"--{role}-{what.replace('_', '-')}"
                raise ConfigError(
                    f"{flag} sets how the {name} clients train, and no client of --mix "
                    f"{job.mix} trains a {name}",
                    hint=f"drop {flag}, or add a device class that trains one (e.g. {other})",
                )


def check_caps(job: SimJob, log) -> None:
    """Before any client trains: every method that cannot fuse what the mix plans (over its cap,
    or reading no planned kind of upload) refused together is an error (exit 2, nothing would
    be fused); some of them, a line each now (their reports say it again after training)."""
    refused = refused_by_kinds(job) | refused_by_plan(job)
    if refused and len(refused) == len(job.methods):
        raise next(iter(refused.values()))
    for name, exc in refused.items():
        log_lines(log, f"{name} will be refused: {exc.message}")


def check_results_kept(job: SimJob) -> None:
    """A run's results.json and results.md name every method of the run that made them: a
    run of fewer methods into the same --out would replace them with its own few rows
    (README: nothing is replaced silently), so it stops first and says which to name."""
    path = Path(job.out) / "results.json"
    try:
        had = json.loads(path.read_text())["job"]["methods"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # none, or not a run's: nothing of a run's to lose
    dropped = [m for m in had if isinstance(m, str) and m not in job.methods]
    if dropped:
        raise ConfigError(
            f"{path} holds the results of {', '.join(map(printable, dropped))} as well; this "
            "run would replace them with its own rows",
            hint=f"name them too (--methods {','.join(dict.fromkeys([*job.methods, *dropped]))}"
            "; finished ones are reused), or use a fresh --out",
        )


def check_run_files(out: str | Path) -> None:
    """The files a run writes at the top of --out are a run's own (an earlier run's, which
    this one replaces) or absent: a results.md, results.json or picture edgefl did not write
    there was replaced without a word."""
    from edgefl.outputs import saved_by_edgefl

    out = Path(out)
    foreign = [f for f in (out / "results.json", out / "results.md") if not _runs_own(f)]
    pictures = [out / "accuracy.png", out / "label_distribution.png", *out.glob("samples_*.png")]
    foreign += [f for f in pictures if f.is_file() and not saved_by_edgefl(f)]
    if foreign:
        raise ConfigError(
            f"{printable(foreign[0])} is not an earlier run's file; this run would replace it"
            + (f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""),
            hint="use a fresh --out, or move those files away first",
        )


def _runs_own(path: Path) -> bool:
    """Absent, or a run's results.json (its job's methods) or results.md (its title line)."""
    if not path.exists():
        return True
    try:
        if path.suffix == ".json":
            return isinstance(json.loads(path.read_text())["job"]["methods"], list)
        with path.open("rb") as f:
            return f.read(16).startswith(b"# edgefl ")
    except (OSError, ValueError, KeyError, TypeError):
        return False


def check_resumable(job: SimJob) -> None:
    """Refuse now, before any work, what `simulate(job)` would refuse later: uploads or global
    models in `job.out` that were made with other settings, results of more methods, files of
    its own names that no run wrote."""
    job.validate()
    check_run_files(job.out)
    check_results_kept(job)
    for cjob in client_jobs(job):
        finished(cjob)
    for name in job.methods:
        model = Path(job.out) / "global" / f"{name}.onnx"
        report = model.with_suffix(".json")
        if METHODS.get(name).judged == "global" and model.exists() and report.exists():
            reuse_global(name, method_options(job, name), report, _input_shape(job), job.dataset)


def fuse_all(
    job: SimJob, log, clients: list[dict] | None = None, progress=no_progress
) -> dict[str, dict]:
    """Every method: a per-client method on its own, a finished one reused, and all the methods
    that read one upload folder through one `fuse_methods` call (the many-method path of
    `server fuse`), the folder ingested once for all of them. Batched by folder, not by runs of
    the job's order: FedOL's predictions between them split the HAR bench's methods in three
    calls, and the last, of three methods on two workers, waited 424 s on FedHydra alone."""
    out = Path(job.out)
    reports: dict[str, dict] = {}
    batches: dict[Path, list] = {}  # upload folder -> (name, planned) of the methods reading it
    classes = job.classes()
    for name in job.methods:
        method = METHODS.get(name)
        options = method_options(job, name)
        if method.judged == "per-client":
            progress("methods fused", len(reports), len(job.methods), f"next: {name}")
            log(f"{name}: client artifacts -> server -> personalized client models")
            try:
                reports[name] = run_per_client(
                    job, method, client_jobs(job), clients or [], options, log
                )
            except FusionError as exc:
                reports[name] = refused_report(name, exc)
            continue
        model = out / "global" / f"{name}.onnx"
        report = model.with_suffix(".json")
        done = [model, report] + [path for _, path in (classes.targets(model) if classes else [])]
        folder = upload_folder(out, method.consumes)
        if all(path.exists() for path in done):
            reused = _still_finished(job, name, options, report, folder, log)
            if reused is not None:
                reports[name] = reused
                continue
        planned = plan_fuse(name, options, model, folder, classes=classes)
        batches.setdefault(folder, []).append((name, planned))
    for folder, batch in batches.items():
        names = ", ".join(name for name, _ in batch)
        progress("methods fused", len(reports), len(job.methods), f"next: {names}")
        reports.update(_fuse_batch(job, batch, folder, log, progress))
    progress("methods fused", len(reports), len(job.methods))
    return {name: reports[name] for name in job.methods}


def _still_finished(job: SimJob, name: str, options, report: Path, folder: Path, log):
    """The report of a global model a previous run finished, if it was fused with these options
    (else the run stops: `reuse_global`) from the uploads now in `folder`; None: fuse it again."""
    reused = reuse_global(name, options, report, _input_shape(job), job.dataset)
    changed = changed_uploads(reused, folder, report.stat().st_mtime_ns)
    if not changed:
        log(f"reusing finished {name}")
        return reused | {"reused": True}
    shown = ", ".join(printable(n) for n in changed[:3]) + (", ..." if changed[3:] else "")
    log(f"{name}: fusing again: {len(changed)} upload(s) differ from those it used ({shown})")
    return None


def _fuse_batch(job: SimJob, batch, folder: Path, log, progress) -> dict[str, dict]:
    """The planned methods of `batch` as `server fuse --method A,B,..` fuses them with its
    defaults: those over their max_teachers refused before the folder's one ingest, the rest
    on a CPU side by side in forked workers (one per core, up to 4, and no more than the methods
    that train: the cores' threads shared among those), the longest first. Not by `--jobs`, so that the result of a method does not
    depend on it. Small models cannot keep two cores busy: the HAPT bench's twelve methods
    fused in 575 s one after another and in 318 s side by side, every accuracy the same
    (bench/results/hapt.md, seed 0)."""
    plans = [planned for _, planned in batch]
    log(f"fusing {folder.name}/ with {', '.join(p.method.name for p in plans)}")
    try:
        return fuse_methods(
            plans,
            str(folder),
            device=job.device,
            eval=f"{job.dataset}:test",
            data_dir=job.data_dir,
            log=log,
            progress=progress,
        )
    except FusionError as exc:  # no usable uploads in the folder: every method's result
        for p in plans:
            log_lines(log, f"{p.method.name} refused: {exc.message}")
        return {p.method.name: refused_report(p.method.name, exc) for p in plans}


def chance_warnings(clients: list[dict], reports: dict[str, dict]) -> list[str]:
    """Every client classifier and global model at or near chance, with its likely cause, and
    every client whose DP-SGD steps each took its whole shard."""
    out = classifier_warnings(clients) + whole_shard_warnings(clients)
    for rep in reports.values():
        out += rep.get("warnings", [])
    return out


def kept_timings(
    out: Path,
    clients: list[dict],
    reports: dict[str, dict],
    t_clients: float,
    t_fuse: float,
    total: float,
) -> dict:
    """The run's seconds. A stage this run reused whole (every upload, or every global model)
    keeps the seconds the run that made it recorded (results.json), named in "reused": a
    resumed run reports what the work took, not the instant it took to find it done."""
    seconds: dict = {"clients": t_clients, "fusion": t_fuse, "total": total}
    try:
        before = json.loads((out / "results.json").read_text())["seconds"]
        before = {k: float(before[k]) for k in ("clients", "fusion")}
    except (OSError, ValueError, KeyError, TypeError):
        return seconds
    whole = {
        "clients": bool(clients) and all(c.get("reused") for c in clients),
        "fusion": bool(reports) and all(r.get("reused") for r in reports.values()),
    }
    reused = [stage for stage, done in whole.items() if done]
    if not reused:
        return seconds
    for stage in reused:
        seconds[stage] = before[stage]
    seconds["total"] = total + sum(
        seconds[s] - now for s, now in (("clients", t_clients), ("fusion", t_fuse))
    )
    seconds["reused"] = reused
    seconds["this_run"] = total
    return seconds


def simulate(job: SimJob, log=None, progress=None, trainer=None) -> dict:
    """`log(text)` gets one-off lines; `progress(task, done, total, note)` clients and methods
    as they finish, and each method's own steps. `trainer(job, log, progress)` trains the
    clients (default: local worker processes; edgefl.flower's runs them on Flower)."""
    log = log or (lambda m: None)
    progress = progress or no_progress
    job.validate()
    # Held from the first check of what --out holds to the last file written: a second run on
    # the same --out (other settings or not) stops at once, before it trains a client there.
    with lock_outputs([Path(job.out) / "results.json"]):  # in --out: one lock however spelt
        return _simulate(job, log, progress, trainer)


def _simulate(job: SimJob, log, progress, trainer) -> dict:
    check_run_files(job.out)
    check_results_kept(job)
    check_dp_models(job)
    check_dp_clients(job)
    check_caps(job, log)
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    clients = (trainer or train_clients)(job, log, progress)
    t_clients = time.perf_counter() - t0
    t1 = time.perf_counter()
    reports = fuse_all(job, log, clients, progress)
    t_fuse = time.perf_counter() - t1
    reference = paper_reference(job.dataset, job.partition, job.clients)
    rows = _rows(reports, clients, reference, out)
    results = {
        "job": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(job).items()},
        "engine": getattr(trainer, "engine", "local"),  # where the clients ran
        "clients": clients,
        "results": rows,
        "warnings": chance_warnings(clients, reports),
        "seconds": kept_timings(out, clients, reports, t_clients, t_fuse, time.perf_counter() - t0),
        "paper_reference": reference,
        "host": {
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            # A method refused before fusing has no device in its report.
            "device": next((r["device"] for r in reports.values() if "device" in r), None),
        },
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    results["pictures"] = pictures(job, results, out)
    results["files"] = [str(out / "results.json"), str(out / "results.md"), *results["pictures"]]
    exporters.atomic_write_text(out / "results.json", json.dumps(results, indent=2, default=str))
    exporters.atomic_write_text(out / "results.md", results_markdown(results))
    return results


def _rows(reports: dict[str, dict], clients: list[dict], reference: dict, out: Path) -> list[dict]:
    """Each method's line of results.json, from its report."""
    models = {c["client_id"]: c["upload_bytes"] for c in clients}
    pred_bytes = {c["client_id"]: c.get("predictions_bytes", 0) for c in clients}
    rows = []
    for m, rep in reports.items():
        rows.append(
            {
                "method": m,
                "accuracy": rep.get("accuracy"),
                "fuse_seconds": rep["total_seconds"],
                "upload_bytes": sum(
                    upload_bytes(m, c, models, pred_bytes, out) for c in rep["used"]
                ),
                "clients_used": len(rep["used"]),
                "error": rep.get("error"),
                # Part of the federation only ("5 of 10: vgg9 only"): not the paper's row's number.
                "scope": rep.get("scope"),
                "paper": None if rep.get("scope") else reference.get(m),
                "standalone_accuracy": rep.get("standalone_accuracy"),
                "metric": rep.get("metric"),
                # --robust screen: who was left out and why, who was used repaired or tempered
                "screened": [f"{x['client_id']}: {x['reason']}" for x in rep.get("screened", [])],
                "robust_notes": rep.get("robust_notes", []),
                "for_classes": rep.get("for_classes"),  # --for: a model per device class
                "privacy": rep.get("privacy"),  # what the uploads it used spent, recomputed
            }
        )
    return rows
