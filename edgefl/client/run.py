"""One device's whole job: data shard -> model that fits -> local training -> one ONNX artifact.

`edgefl client train` and `edgefl simulate` both call `run_client`, so a simulated client is
trained exactly as a real one would be.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import edgefl
import exporters
from edgefl.bounds import Range
from edgefl.client import weightless
from edgefl.client.attacks import ATTACKS, attack_for
from edgefl.client.export import export_model
from edgefl.client.job import (
    ClientJob,
    job_augment,
    job_optimizer,
    local_schedule,
    window_treatment,
)
from edgefl.client.privacy import (
    PROTO_CLIP,
    SEARCH_UNDER_DP,
    Budget,
    check_request,
    privacy_record,
    release_counts,
    release_prototypes,
    split_budget,
)
from edgefl.client.rerun import check_upload_target, search_record
from edgefl.data import (
    ArrayDataset,
    carve_public,
    client_users,
    load_dataset,
    parse_scheme,
    partition,
    train_val_split,
)
from edgefl.data.align import align_windows
from edgefl.data.registry import DATASETS, DatasetInfo
from edgefl.errors import ConfigError
from edgefl.models.augment import check_choice as check_augment
from edgefl.models.cost import costs
from edgefl.models.parse import load_spec_file, parse_model_arg
from edgefl.models.plan import Fit, check_fit, plan, require_fit
from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import role_of, spec_label
from edgefl.outputs import check_writable, lock_outputs
from edgefl.privacy import plan_dp
from edgefl.profiles import Profile, get_profile
from edgefl.search import PSOConfig, SearchResult, run_search, search_architecture
from edgefl.search.pso import SHORTEN_FLAGS
from edgefl.training import TrainConfig, TrainSummary, init_model, stop_if_interrupted, train


@dataclass
class ClientResult:
    path: Path
    client_id: str
    role: str
    spec: ModelSpec
    fit: Fit
    profile: Profile
    summary: TrainSummary
    label_counts: list[int] | None  # as the upload states them (None: --label-counts absent)
    upload_bytes: int
    export_seconds: float
    quantization: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    # An attacker's upload on its validation split's true labels: its header claims what its
    # (poisoned) training measured, as a compromised device's would; the run says the truth.
    upload_val_accuracy: float | None = None

    def as_dict(self) -> dict:
        return (
            {
                "path": str(self.path),
                "client_id": self.client_id,
                "role": self.role,
                "model": spec_label(self.spec),
                "profile": self.profile.name,
                "fit": self.fit.as_dict(),
                "budget_ram_bytes": self.profile.ram_budget_bytes,
                "costs": costs(self.spec).as_dict(),
                # As recorded in the upload (with optimizer, lr, batch size): a resumed simulate
                # reads the same dict back from the metadata.
                "training": self.metadata.get("training") or self.summary.as_dict(),
                "label_counts": self.label_counts,
                # the upload's whole privacy record: DP-SGD's part, the counts', the total
                "privacy": self.metadata.get("privacy"),
                "num_classes": self.spec.num_classes,
                "upload_bytes": self.upload_bytes,
                "export_seconds": self.export_seconds,
                "quantization": self.quantization,
            }
            | (
                {}
                if self.upload_val_accuracy is None
                else {"upload_val_accuracy": self.upload_val_accuracy}
            )
            | _user_of(self.metadata)
        )


def dataset_info_for(ref: str, data: ArrayDataset) -> DatasetInfo:
    if ref in DATASETS:
        return DATASETS.get(ref)
    return DatasetInfo(
        name=data.name,
        input_shape=data.input_shape,
        num_classes=data.num_classes,
        class_names=data.class_names,
        train_size=len(data),
        test_size=0,
        reference_classifier="vgg9",
        description="user dataset",
        builtin=False,
    )


def client_shard(job: ClientJob, data: ArrayDataset) -> np.ndarray:
    """Indices of this client's samples: carve the public set, then partition the rest."""
    if not 0 <= job.client_index < job.num_clients:
        raise ConfigError(
            f"--client-index {job.client_index} is outside 0..{job.num_clients - 1}",
            hint="pick an index below --num-clients",
        )
    rest = np.arange(len(data))
    if job.subset is not None:
        Range(1, len(data), integer=True).check("--subset", job.subset)
        perm = np.random.default_rng(job.partition_seed).permutation(len(data))
        rest = np.sort(perm[: job.subset])
    public = ()
    if job.public_size:
        keep, public = carve_public(
            len(rest),
            job.public_size,
            job.partition_seed,
            None if data.groups is None else data.groups[rest],
            job.partition,
        )
        public, rest = rest[public], rest[keep]
        if len(rest) < job.num_clients:  # the carve, not the clients, left too little
            raise ConfigError(
                f"--public-size {job.public_size} leaves {len(rest)} training sample(s) for "
                f"{job.num_clients} clients",
                hint=f"lower --public-size (the training set has {len(data)} samples)",
            )
    try:
        parts = partition(
            data.y[rest],
            job.num_clients,
            job.partition,
            job.partition_seed,
            num_classes=data.num_classes,
            groups=None if data.groups is None else data.groups[rest],
        )
    except ConfigError as exc:
        if len(public) and data.groups is not None:  # say where the missing users went
            users = sorted(set(data.groups[public].tolist()))
            raise ConfigError(
                f"{exc.message}; users {', '.join(map(str, users))} hold the public set",
                hint=exc.hint,
            ) from None
        raise
    return rest[parts[job.client_index]]


def device_split(job: ClientJob, data: ArrayDataset) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) indices of this client's shard: the split the device trains on (and
    what simulate's derived uploads and `edgefl audit` recover)."""
    return train_val_split(client_shard(job, data), 0.1, seed=job.seed + job.client_index)


def choose_model(
    job: ClientJob,
    profile: Profile,
    info: DatasetInfo,
    samples: int,
    local=None,
    status=None,
    progress=None,
):
    """The spec to train: --model, an architecture search (--search), or the planner's pick.
    `local` = (x_train, y_train, x_val, y_val) for a search."""
    # the memory of the optimizer the job trains with (named, else DP-SGD's, else the profile's)
    budget = {
        "samples": samples,
        "batch_size": _budget_batch(job, profile, samples),
        "dp": job.dp is not None,
        "optimizer": job.optimizer,
    }
    if job.search:
        spec = run_search(
            job.search,
            profile=profile,
            info=info,
            local=local,
            samples=samples,
            batch_size=job.batch_size,
            seed=job.seed * 1000 + job.client_index,
            options=dict(job.search_options or {}),
            on_status=status,
            on_progress=progress,
        )
        fit = check_fit(spec, profile, **budget)
        require_fit(spec, profile, fit)
        return spec, fit
    if job.model or job.spec_file:
        spec = (
            load_spec_file(job.spec_file, info.input_shape, info.num_classes)
            if job.spec_file
            else parse_model_arg(job.model, info.input_shape, info.num_classes)
        )
        # --role and the model disagree: not silently the model's role (predict and prototypes
        # set the role themselves and say so in weightless.prepare)
        if job.kind == "model" and job.role != "auto" and role_of(spec) != job.role:
            raise ConfigError(
                f"--role {job.role} with {'--spec' if job.spec_file else '--model'} "
                f"{job.spec_file or job.model}, a {role_of(spec)}",
                hint="drop --role (the model says its role), or name a model of that role",
            )
        fit = check_fit(spec, profile, **budget)
        if not job.force:
            require_fit(spec, profile, fit)
        return spec, fit
    p = plan(profile, info, role=job.role, max_macs=job.max_macs, **budget)
    return p.spec, p.fit


def _budget_batch(job: ClientJob, profile: Profile, samples: int) -> int | None:
    """The batch the memory budget must hold: DP-SGD's expected batch under `--dp` (its indices
    are held whole), else the training batch (None: the profile's)."""
    dp, _ = check_request(job.dp, job.label_counts)
    if dp is None:  # a batch past the shard holds the shard (what the loader gives)
        return None if job.batch_size is None else min(job.batch_size, max(1, samples))
    return dp.expected_batch(job.batch_size or profile.batch_size, samples)


def _local_data(job: ClientJob):
    """(profile, data, info, train_idx, val_idx, (x_train, y_train, x_val, y_val)): the shard
    and the train/validation split this device holds; the same for training and search."""
    profile = get_profile(job.profile)
    data = load_dataset(job.dataset, "train", data_dir=job.data_dir)
    info = dataset_info_for(job.dataset, data)
    train_idx, val_idx = device_split(job, data)
    local = (data.x[train_idx], data.y[train_idx], data.x[val_idx], data.y[val_idx])
    return profile, data, info, train_idx, val_idx, local


def _user_of(meta: dict) -> dict:
    user = (meta.get("partition") or {}).get("user")
    return {} if user is None else {"user": user}


def _whose(job: ClientJob, data, shard: np.ndarray) -> dict:
    """{"user": id} for a client of a user partition (a draw of users names whom it holds)."""
    if parse_scheme(job.partition).kind != "user":
        return {}
    users = client_users(data.groups, [shard])
    return {"user": users[0]} if users else {}


def upload_val_accuracy(job: ClientJob, path: Path, data=None, val_idx=None) -> float:
    """A classifier upload's accuracy on the true labels of its client's validation split, run
    as the server runs it (onnxruntime; quantized or not): what simulate reports of an
    attacker, whose header claims what its poisoned training measured."""
    if data is None:
        _, data, _, _, val_idx, _ = _local_data(job)
    out = exporters.read_artifact(path).run(data.x[val_idx])
    return float((out.argmax(1) == data.y[val_idx]).mean())


def run_client(job: ClientJob, *, on_epoch=None, on_status=None, on_progress=None) -> ClientResult:
    _check_job(job)
    client_id = job.client_id or f"client-{job.client_index:03d}"
    # Held from the check of what is at the output paths to the write: a second run writing
    # the same upload (another model, or the same) stops at once instead of replacing it.
    with lock_outputs(path for path, _, _ in _targets(job, client_id)):
        return _run_client(job, client_id, on_epoch, on_status, on_progress)


def _run_client(job: ClientJob, client_id: str, on_epoch, on_status, on_progress) -> ClientResult:
    status = on_status or (lambda msg: None)
    profile, data, info, train_idx, val_idx, local = _local_data(job)
    if job.search:  # what is at the output path, before the search: its result is not known yet
        _check_targets(job, client_id, None, info.name)
    spec, fit = choose_model(job, profile, info, len(train_idx), local, status, on_progress)
    role = role_of(spec)
    attack = attack_for(job.sim.attack, role)
    status(f"{client_id}: {role} {spec_label(spec)} on {len(train_idx)} samples ({profile.name})")

    public = weightless.prepare(job, role)  # before training: fail fast on a bad --public
    if not job.search:  # what this run's inputs allow, then what is at the output path
        _check_targets(job, client_id, spec, info.name)
    # An image jitter on sensor windows (or the reverse) is said here, before training.
    augment = job_augment(job, spec, role)

    model = init_model(spec, job.fed_seed)
    cfg, budget = _train_config(job, profile, role, len(train_idx), augment)
    cfg = _with_dp_chunk(cfg, fit)
    own = _device_data(data, train_idx, val_idx, attack, job.seed * 1000 + job.client_index)
    windows = window_treatment(spec, role)
    summary = _train_local(model, role, cfg, own, windows, on_epoch, on_progress)
    if attack is not None and attack.weights:
        attack.weights(model, job.seed * 1000 + job.client_index)

    counts, privacy, protos = _releases(job, model, own, budget, summary)
    meta = model_metadata(
        spec,
        class_names=list(data.class_names),
        label_counts=counts,
        client_id=client_id,
        profile=profile.name,
        costs_extra={"train_bytes_used": fit.train_bytes},
        training=_training_record(job, summary, cfg, augment, windows),
        dataset=info.name,
        partition=_partition_record(job, data, own.shard),
        privacy=privacy,
    )
    path, meta, quant, export_seconds = _timed_upload(
        job, client_id, model, spec, meta, own, role, (public, protos)
    )
    status(f"{client_id}: wrote {path} ({path.stat().st_size:,} bytes)")
    return ClientResult(
        path,
        client_id,
        role,
        spec,
        fit,
        profile,
        summary,
        counts,
        path.stat().st_size,
        export_seconds,
        quant,
        meta,
        _attacker_upload_accuracy(job, attack, role, path, own),
    )


def preflight(job: ClientJob) -> None:
    """What `run_client` would refuse for `job` before training it, without training: its
    inputs, its data, the model's fit to the budget and its DP-SGD plan (a delta above 1/n of
    its shard). Simulate checks every client so (a shard far smaller than the others, a DP batch
    a band cannot hold) before the first one trains. A search is checked up to the search."""
    _check_job(job)
    profile, _, info, train_idx, _, local = _local_data(job)
    if job.search:
        return
    spec, _ = choose_model(job, profile, info, len(train_idx), local)
    role = role_of(spec)
    cfg, _ = _train_config(job, profile, role, len(train_idx), job_augment(job, spec, role))
    if cfg.dp is not None:
        plan_dp(cfg.dp, len(train_idx), cfg.batch_size, cfg.epochs)


def _with_dp_chunk(cfg: TrainConfig, fit: Fit) -> TrainConfig:
    """`cfg` with DP-SGD's chunk from the fit (unchanged without DP)."""
    if fit.dp_chunk is None:
        return cfg
    # DP-SGD clips as many samples at once as the budget holds
    return dataclasses.replace(cfg, dp_chunk=max(1, fit.dp_chunk))


def _timed_upload(job: ClientJob, client_id: str, model, spec, meta, own, role, data_inputs):
    """(path, metadata, quantization, export seconds): the upload written under job.out_dir.
    `data_inputs`: (the public set of a predictions job, a DP prototypes job's release)."""
    Path(job.out_dir).mkdir(parents=True, exist_ok=True)
    path = Path(job.out_dir) / f"{client_id}.onnx"
    start = time.perf_counter()
    meta, quant = _write_upload(job, model, spec, meta, path, own, role, data_inputs)
    return path, meta, quant, time.perf_counter() - start


def _released_counts(job: ClientJob, own: _DeviceData, budget: Budget):
    """(the label counts the upload states, or None; their release record): the shard's
    class histogram as --label-counts releases it (edgefl.client.privacy)."""
    counts = np.bincount(own.y[own.shard], minlength=own.data.num_classes).astype(int).tolist()
    return release_counts(counts, budget, np.random.default_rng(job.sim.noise_seed))


def _releases(job: ClientJob, model, own: _DeviceData, budget: Budget, summary: TrainSummary):
    """(the label counts stated, the upload's privacy record, a DP prototypes job's released
    prototypes or None): what leaves the device besides the model, and what it spent."""
    counts, released = _released_counts(job, own, budget)
    protos, protos_record = _released_prototypes(job, model, own, budget)
    seeded = job.sim.noise_seed is not None
    return counts, privacy_record(summary.privacy, released, seeded, protos_record), protos


def _released_prototypes(job: ClientJob, model, own: _DeviceData, budget: Budget):
    """((classes, means, counts), their release record) of a prototypes job under --dp (the
    Gaussian mechanism: edgefl.client.privacy), else (None, None): exact prototypes are
    computed at export."""
    if job.kind != "prototypes" or budget.prototypes is None:
        return None, None
    held = own.held()
    sums, counts = weightless.class_sums(
        model, held.x[own.train_idx], held.y[own.train_idx], held.num_classes, clip=PROTO_CLIP
    )
    # a stream of its own: the label counts' noise comes from default_rng(noise_seed)
    rng = np.random.default_rng(None if job.sim.noise_seed is None else [job.sim.noise_seed, 1])
    *released, record = release_prototypes(sums, counts, budget, rng)
    return tuple(released), record


def _check_job(job: ClientJob) -> None:
    """What the job names, checked before the data loads."""
    check_writable(job.out_dir, "--out", "uploads", folder_ok=True)  # before the training
    if job.keep_model:
        check_writable(job.keep_model, "--keep-model", "local", folder_ok=True)
    if job.augment:
        check_augment(job.augment)  # before the data; its kind is checked once the model is known
    if job.sim.attack:
        ATTACKS.get(job.sim.attack)  # an unknown name, before the data loads
    check_request(job.dp, job.label_counts)  # a bad --dp or --label-counts, before the data
    if job.dp is not None and job.search:
        raise ConfigError(
            f"--search with --dp: {SEARCH_UNDER_DP}",
            hint="drop --search (the planner picks from the budget alone), or train without --dp",
        )


def _attacker_upload_accuracy(
    job: ClientJob, attack, role: str, path: Path, own: _DeviceData
) -> float | None:
    """An attacker's classifier upload on true labels (ClientResult.upload_val_accuracy)."""
    if attack is not None and role == "classifier" and job.kind == "model" and len(own.val_idx):
        return upload_val_accuracy(job, path, own.data, own.val_idx)
    return None


def _train_config(
    job: ClientJob, profile: Profile, role: str, samples: int, augment: str
) -> tuple[TrainConfig, Budget]:
    """How the job trains, and its privacy budget (DP-SGD's part is in the config)."""
    epochs, lr = local_schedule(job, profile, role, samples)
    budget = split_budget(job.dp, job.label_counts, samples, job.kind)
    return TrainConfig(
        epochs=epochs,
        batch_size=job.batch_size or profile.batch_size,
        optimizer=job_optimizer(job, profile),
        lr=lr,
        seed=job.seed * 1000 + job.client_index,
        device=job.sim.train_device,
        augment=augment,
        dp=budget.training,
        noise_seed=job.sim.noise_seed,
    ), budget


@dataclass(frozen=True)
class _DeviceData:
    """The data a device trains on: `x` and `y` are `data`'s arrays, or copies poisoned where
    the shard is (an attacker's)."""

    data: ArrayDataset
    x: np.ndarray
    y: np.ndarray
    train_idx: np.ndarray
    val_idx: np.ndarray
    shard: np.ndarray

    def held(self) -> ArrayDataset:
        """`data` as the device holds it."""
        if self.x is self.data.x and self.y is self.data.y:
            return self.data
        return dataclasses.replace(self.data, x=self.x, y=self.y)


def _device_data(data: ArrayDataset, train_idx, val_idx, attack, seed: int) -> _DeviceData:
    x, y = data.x, data.y
    shard = np.concatenate([train_idx, val_idx])  # the split is a partition of the shard
    if attack is not None:  # the device's own data, poisoned where it is held
        x, y = x.copy() if attack.images else x, y.copy()
        if attack.labels:
            y[shard] = attack.labels(y[shard], data.num_classes, seed)
        if attack.images:
            x[shard] = attack.images(x[shard], seed)
    return _DeviceData(data, x, y, train_idx, val_idx, shard)


def _train_local(
    model,
    role: str,
    cfg: TrainConfig,
    own: _DeviceData,
    windows: str | None,
    on_epoch,
    on_progress=None,
) -> TrainSummary:
    """Train `model` in place on the device's split; an interrupted run raises."""
    x, y = own.x, own.y
    x_train, x_val = x[own.train_idx], x[own.val_idx]
    if windows == "aligned":  # a decoder's mean keeps movement only of aligned windows
        x_train = align_windows(x_train, y[own.train_idx])
        x_val = align_windows(x_val, y[own.val_idx])
    summary = train(
        model,
        role,
        x_train,
        y[own.train_idx],
        own.data.num_classes,
        cfg,
        x_val=x_val,
        y_val=y[own.val_idx],
        on_epoch=on_epoch,
        on_progress=on_progress,
    )
    stop_if_interrupted(summary)  # nothing was written: an interrupted client publishes nothing
    return summary


def _training_record(
    job: ClientJob, summary: TrainSummary, cfg: TrainConfig, augment: str, windows: str | None
) -> dict[str, Any]:
    """The upload's "training" metadata."""
    return (
        summary.as_dict()
        | {
            "optimizer": cfg.optimizer,
            "lr": cfg.lr,
            "batch_size": cfg.batch_size,
            "device": cfg.device,
            # What a rerun compares besides the schedule (edgefl.client.rerun): a changed seed
            # or jitter trains another model.
            "seed": job.seed,
            "fed_seed": job.fed_seed,
            "augment": augment,
            # What a rerun compares of the privacy asked for (the plan is summary.privacy).
            "dp": job.dp,
            "label_release": job.label_counts,
        }
        | ({"windows": windows} if windows else {})
        | ({"search": search_record(job)} if job.search else {})
    )


def _partition_record(job: ClientJob, data: ArrayDataset, shard: np.ndarray) -> dict[str, Any]:
    return (
        {
            "scheme": job.partition,
            "num_clients": job.num_clients,
            "client_index": job.client_index,
            "seed": job.partition_seed,
        }
        | _carved(job)
        | _whose(job, data, shard)
    )


def _carved(job: ClientJob) -> dict[str, int | None]:
    """What else decides the shard: the subset dealt (None: all of train) and the public set
    carved out first (0: none). Always recorded: an upload without them predates them."""
    return {"subset": job.subset, "public_size": job.public_size}


def _write_upload(
    job: ClientJob, model, spec: ModelSpec, meta: dict, path: Path, own: _DeviceData, role, data
) -> tuple[dict, dict[str, Any] | None]:
    """Export the job's upload to `path`: (its metadata, the int8 quantization's figures)."""
    if job.kind != "model":
        _, meta = weightless.export_data_artifact(
            job, model, spec, own.held(), own.train_idx, meta, path, *data
        )
        return meta, None
    if not job.quantize:
        export_model(model, spec, meta, path)
        return meta, None
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        export_model(model, spec, meta, fp32)
        sizes = exporters.quantize_int8(fp32, path)
        return meta, sizes | _local_accuracy_pair(fp32, path, own.data, own.val_idx, role)


def _check_targets(job: ClientJob, client_id: str, spec: ModelSpec | None, dataset: str) -> None:
    """Every file this job writes is new or its own (edgefl.client.rerun), before training."""
    for path, as_job, flag in _targets(job, client_id):
        check_upload_target(as_job, path, spec, dataset, flag)


def _targets(job: ClientJob, client_id: str) -> list[tuple[Path, ClientJob, str]]:
    """(path, the job that writes it, its flag) for every file this job writes."""
    name = f"{client_id}.onnx"
    targets = [(Path(job.out_dir) / name, job, "--out")]
    if job.keep_model and job.kind != "model":  # the device's own model, kept beside
        kept = dataclasses.replace(job, kind="model", keep_model=None, quantize=None)
        targets.append((Path(job.keep_model) / name, kept, "--keep-model"))
    return targets


def search_client(
    job: ClientJob, config: PSOConfig | None = None, *, on_status=None, on_progress=None
) -> SearchResult:
    """`edgefl search`: PSO-FedNAS on exactly the shard and train/validation split `run_client`
    would use for `job`, without training or exporting the result."""
    profile, data, info, train_idx, _, local = _local_data(job)
    return search_architecture(
        profile,
        info,
        local,
        samples=len(train_idx),
        batch_size=job.batch_size,
        seed=job.seed,
        config=config,
        on_status=on_status,
        on_progress=on_progress,
        shorten=(*SHORTEN_FLAGS, "--fitness-samples", "--max-macs"),
    )


def model_metadata(
    spec: ModelSpec,
    *,
    class_names: list[str],
    label_counts: list[int] | None,
    client_id: str,
    profile: str | None,
    costs_extra: dict[str, Any] | None = None,
    training: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The metadata a client stamps on its model upload (exporters' schema v1)."""
    return {
        "kind": "classifier" if role_of(spec) == "classifier" else "decoder",
        "spec": spec.to_dict(),
        "input_shape": list(spec.input_shape),
        "num_classes": spec.num_classes,
        "class_names": class_names,
        **({} if label_counts is None else {"label_counts": label_counts}),
        "client_id": client_id,
        "profile": profile,
        "costs": costs(spec).as_dict() | (costs_extra or {}),
        "training": training or {},
        **extra,
        "edgefl_version": edgefl.__version__,
    }


def _local_accuracy_pair(fp32: Path, int8: Path, data, val_idx, role) -> dict:
    if role != "classifier" or not len(val_idx):
        return {}
    x, y = data.x[val_idx], data.y[val_idx]
    acc = {}
    for tag, path in (("fp32", fp32), ("int8", int8)):
        logits = exporters.read_artifact(path).run(x)
        acc[f"val_accuracy_{tag}"] = float((logits.argmax(1) == y).mean())
    return acc
