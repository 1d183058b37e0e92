"""`edgefl audit`: what one's own upload gives away about the samples it was trained on.

The attacks are edgefl.privacy.audit's (issue 57, item 5); this module points them at a real
upload. An upload records the federation it came from (dataset, partition, client index, seeds,
subset, public carve) and how it trained, so its training samples, the *members*, are recovered
exactly (`client.run.device_split`, the split a device makes) and checked against what the upload states
(its training sample count, its exact label counts). *Non-members* are samples it never saw, of
the same distribution:

- `population` (default): the dataset's other training samples, drawn with the members' class
  counts. On sensor windows split by user they are other people's windows, so the audit asks
  whether the upload tells its own person's windows from other people's;
- `held-out`: the client's own validation split (never trained on: it only reports accuracy).
  Sensor windows overlap their neighbours by half, so held-out windows share samples with
  trained ones: an upper bound there.

Shadow classifiers (LiRA) and the reference decoder (the calibrated decoder attacks) are trained
by the upload's own recipe (model, epochs, batch, optimizer, lr, jitter and DP-SGD as recorded)
on as many samples as it trained on, drawn from data none of the queries are in, with its class
counts.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import exporters
from edgefl.artifacts.upload import RebuildRejected, Upload, rebuild
from edgefl.bounds import OneOf, Range
from edgefl.client.job import ClientJob
from edgefl.client.privacy import spent
from edgefl.client.run import dataset_info_for, device_split
from edgefl.data import load_dataset
from edgefl.data.align import align_like, align_windows
from edgefl.data.datasets import ArrayDataset
from edgefl.data.partition import parse_scheme
from edgefl.errors import ArtifactError, ConfigError, EdgeflError
from edgefl.models.zoo import spec_label
from edgefl.privacy import DPConfig, audit
from edgefl.progress import NullReporter, Reporter
from edgefl.training import TrainConfig, init_model, stop_if_interrupted, train

NONMEMBERS = ("population", "held-out")
AUDITED = ("classifier", "decoder")  # the kinds that are models of the data
# The fixes of a file that cannot be replayed, and of a recipe too long to train
REPLAYABLE = "audit an upload `edgefl client train` or `edgefl simulate` wrote, unchanged"
TRAIN_NOTHING = "--shadows 0 --no-reference (the attacks that train nothing)"


@dataclass(frozen=True)
class AuditSettings:
    queries: int = 1000  # members at most (and as many non-members)
    nonmembers: str = "population"
    shadows: int = 4  # LiRA's shadow classifiers; 0: the loss attack only
    reference: bool = True  # train a reference decoder to calibrate the decoder attacks
    restarts: int = 4  # reconstruction: latent starts per query
    steps: int = 100  # reconstruction: Adam steps per start
    draws: int = 2000  # sample distance: decoder samples per class
    seed: int = 0

    def __post_init__(self) -> None:
        for flag, value in (
            ("--queries", self.queries),
            ("--restarts", self.restarts),
            ("--steps", self.steps),
            ("--draws", self.draws),
        ):
            Range(1, integer=True).check(flag, value)
        Range(0, 2**31 - 1, integer=True).check("--seed", self.seed)
        OneOf(NONMEMBERS).check(
            "--nonmembers", self.nonmembers, hint="e.g. --nonmembers held-out (the client's own)"
        )
        Range(0, integer=True).check(
            "--shadows", self.shadows, hint="e.g. --shadows 4, or 0 for the loss attack only"
        )
        if self.shadows == 1:
            raise ConfigError(
                f"--shadows {self.shadows}: LiRA fits a variance to the shadows' scores",
                hint="use --shadows 2 or more (4 is the default), or 0 for the loss attack only",
            )


@dataclass
class Target:
    """An upload, the data it came from and its members' place in it."""

    path: Path
    upload: Upload
    data: ArrayDataset
    train_idx: np.ndarray
    val_idx: np.ndarray
    shard: np.ndarray

    @property
    def training(self) -> dict[str, Any]:
        return self.upload.meta["training"]


def open_target(
    path: str | Path, data_dir: str | None = None, dataset: str | None = None
) -> Target:
    """The upload at `path`, checked as a server checks one, with the samples it trained on
    recovered from its record and checked against it: every refusal comes here, before any
    attack trains or optimises anything."""
    path = Path(path)
    upload = _read(path)
    meta = upload.meta
    if not isinstance(meta.get("partition"), dict) or not isinstance(meta.get("training"), dict):
        raise ConfigError(
            f"{path} does not record the federation it came from (its partition and training)",
            hint="audit an upload `edgefl client train` or `edgefl simulate` wrote",
        )
    if not (dataset or meta.get("dataset")):
        raise ConfigError(f"{path} does not name its dataset", hint="pass --dataset")
    ref = str(dataset or meta["dataset"])
    data = load_dataset(ref, "train", data_dir=data_dir)
    named = dataset_info_for(ref, data).name
    if meta.get("dataset") and named != meta["dataset"]:
        raise ConfigError(
            f"{path} was trained on {meta['dataset']!r}, not on {named!r}",
            hint=f"drop --dataset, or pass the data it trained on ({meta['dataset']})",
        )
    try:
        train_idx, val_idx = device_split(_job_of(meta, dataset, data_dir), data)
    except EdgeflError as exc:  # its record's values, checked as flags would be: name the file
        raise ConfigError(
            f"{path}: its partition record cannot be replayed ({_as_record(exc.message)})",
            hint=REPLAYABLE,
        ) from None
    shard = np.concatenate([train_idx, val_idx])  # the split is a partition of the shard
    _check_members(path, meta, data, shard, train_idx)
    return Target(path, upload, data, train_idx, val_idx, shard)


def _read(path: Path) -> Upload:
    """The upload, validated and rebuilt where its spec allows (else run by onnxruntime)."""
    if path.is_dir():
        raise ArtifactError(
            f"{path} is a folder, not an upload", hint=f"name its files, e.g. {path}/*.onnx"
        )
    if not path.is_file():
        raise ArtifactError(f"upload {path} not found", hint="name an .onnx upload file")
    try:
        art = exporters.validate_upload(path)
        module, why = rebuild(art)
    except (exporters.UploadRejected, RebuildRejected) as exc:
        raise ArtifactError(f"{path} is not a valid upload: {exc}", hint=REPLAYABLE) from None
    if art.kind not in AUDITED:
        raise ConfigError(
            f"{path} is a {art.kind} upload: edgefl audit attacks the models a device uploads "
            "(classifiers and CVAE decoders)",
            hint="its privacy record is shown by `edgefl server fuse`; audit the model the "
            "device kept (--keep-model) to see what it learnt",
        )
    return Upload(art, module, why)


# The flags `client train` checks these values under, and the upload record's keys they came from
_RECORD_KEYS = {
    "--num-clients": "partition.num_clients",
    "--client-index": "partition.client_index",
    "--partition": "partition.scheme",
    "--public-size": "partition.public_size",
    "--subset": "partition.subset",
    "--seed": "training.seed",
}


def _as_record(message: str) -> str:
    """A flag's refusal said of the upload's record: the key, not the flag, and no "lower it"
    (the fix is another upload, not another value)."""
    for flag, key in _RECORD_KEYS.items():
        message = message.replace(flag, key)
    return re.sub(r": (lower|raise) it$", "", message)


def _job_of(meta: dict, dataset: str | None, data_dir: str | None) -> ClientJob:
    part = meta["partition"]
    try:
        return ClientJob(
            profile=str(meta.get("profile") or "smartphone"),
            dataset=dataset or meta.get("dataset"),
            data_dir=data_dir,
            partition=part["scheme"],
            num_clients=part["num_clients"],
            client_index=part["client_index"],
            partition_seed=part["seed"],
            public_size=part.get("public_size") or 0,
            subset=part.get("subset"),
            seed=meta["training"]["seed"],
        )
    except (KeyError, TypeError) as exc:
        raise ConfigError(
            f"the upload's partition record is incomplete ({type(exc).__name__}: {exc})",
            hint=REPLAYABLE,
        ) from None


def _release(meta: dict) -> str:
    """How the upload released its label counts (exact where its record predates the choice)."""
    return ((meta.get("privacy") or {}).get("label_counts") or {}).get("release", "exact")


def _check_members(path: Path, meta: dict, data: ArrayDataset, shard, train_idx) -> None:
    """The recovered samples are the upload's own: as many as it trained on, with the class
    counts it states when it states them exactly."""
    problems = []
    trained = meta["training"].get("samples")
    if trained != len(train_idx):
        problems.append(f"it trained on {trained} samples, these data give {len(train_idx)}")
    stated = meta.get("label_counts")
    exact = _release(meta) == "exact"
    have = np.bincount(data.y[shard], minlength=data.num_classes).tolist()
    if stated and exact and list(stated) != have:
        problems.append("its label counts differ from these samples'")
    if problems:
        raise ConfigError(
            f"{path}: the data found are not what it trained on: " + "; ".join(problems),
            hint="pass the --data-dir (and --dataset) the client trained on",
        )


# ---------------------------------------------------------------------------------------------
# Queries


@dataclass
class Queries:
    members: np.ndarray  # indices into the target's data
    nonmembers: np.ndarray
    pool: np.ndarray  # what shadows and the reference train on: none of the queries
    source: str  # where the non-members come from, in words

    def xy(self, data: ArrayDataset) -> tuple[np.ndarray, np.ndarray, int]:
        """Members then non-members as one query set, and where the non-members start."""
        idx = np.concatenate([self.members, self.nonmembers])
        return data.x[idx], data.y[idx], len(self.members)


def class_matched(rng, candidates: np.ndarray, y: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Up to counts[c] of the candidates of each class c, drawn without replacement."""
    picked = [
        rng.choice(own, min(int(n), len(own)), replace=False)
        for c, n in enumerate(counts)
        if n and len(own := candidates[y[candidates] == c])
    ]
    return np.sort(np.concatenate(picked)) if picked else np.empty(0, dtype=np.int64)


def choose_queries(target: Target, settings: AuditSettings) -> Queries:
    rng = np.random.default_rng(settings.seed)
    data, y = target.data, target.data.y
    members = np.sort(
        rng.choice(target.train_idx, min(settings.queries, len(target.train_idx)), replace=False)
    )
    outside = np.setdiff1d(np.arange(len(data)), _overlapping(target))
    if settings.nonmembers == "held-out":
        own = target.val_idx
        nonmembers = np.sort(rng.choice(own, min(settings.queries, len(own)), replace=False))
        source = f"{len(nonmembers)} of the client's {len(own)} held-out (validation) samples"
    else:
        counts = np.bincount(y[members], minlength=data.num_classes)
        nonmembers = class_matched(rng, outside, y, counts)
        # A class the client holds (nearly) all of has too few others: as many of its members
        # are queried as it has non-members, so that no class weighs more on one side.
        got = np.bincount(y[nonmembers], minlength=data.num_classes)
        short = np.flatnonzero(got < counts)
        asked = len(members)
        members = class_matched(rng, members, y, got)
        source = (
            f"{len(nonmembers)} samples of other clients' data"
            + _windows_text(target)
            + ", with the members' class counts"
            + _short_text(short, asked - len(members))
        )
    if len(nonmembers) == 0:
        other = "held-out" if settings.nonmembers == "population" else "population"
        raise ConfigError(
            f"{target.path}: no non-members to query (--nonmembers {settings.nonmembers}: "
            "no sample outside the client's shard is of a class it trained on)"
            if settings.nonmembers == "population"
            else f"{target.path}: the client held out no samples (--nonmembers held-out)",
            hint=f"use --nonmembers {other}",
        )
    return Queries(members, nonmembers, np.setdiff1d(outside, nonmembers), source)


def _short_text(short: np.ndarray, dropped: int) -> str:
    """Why fewer members are queried than --queries asked: the other clients hold fewer samples
    of a class than the member draw has, and each class weighs the same on both sides."""
    if not len(short):
        return ""
    classes = f"class{'es' if len(short) > 1 else ''} {', '.join(map(str, short))}"
    return (
        f"; {dropped} member(s) of {classes} left out: the other clients hold fewer samples "
        f"of {'them' if len(short) > 1 else 'it'} than were drawn, and each class is queried "
        "as often on both sides"
    )


def _user_split(target: Target) -> bool:
    return parse_scheme(target.upload.meta["partition"]["scheme"]).kind == "user"


def _overlapping(target: Target) -> np.ndarray:
    """The client's samples and, on sensor windows dealt by other than user, each one's
    neighbours in its recording: consecutive windows share half their samples, so a neighbour
    of a trained window is no non-member."""
    shard, groups = target.shard, target.data.groups
    if groups is None or _user_split(target):
        return shard
    # Windows are stored in time order within a recording; a neighbour across a recording's
    # end is left out too (a few samples fewer, never an overlap).
    near = np.concatenate([shard - 1, shard, shard + 1])
    return np.unique(near[(near >= 0) & (near < len(groups))])


def _windows_text(target: Target) -> str:
    if target.data.groups is None:
        return ""
    if _user_split(target):
        return " (other users' windows)"
    return " (no window next to one it holds: neighbours share half their samples)"


# ---------------------------------------------------------------------------------------------
# The recipe shadows and the reference are trained by

# (x, y, seed) -> a model trained as the upload was
Trainer = Callable[[np.ndarray, np.ndarray, int], nn.Module]


def train_config(target: Target, seed: int) -> TrainConfig:
    """How the upload trained, from its record: DP-SGD at the (epsilon, delta) its plan spent on
    the model (a share of --dp where label counts or prototypes took the rest), its clip and
    batch; ConfigError naming the upload when the record cannot be replayed."""
    t = target.training
    plan = (target.upload.meta.get("privacy") or {}).get("dp_sgd")
    try:
        dp = None
        if t.get("dp") is not None:
            dp = replace(DPConfig.parse(t["dp"]), epsilon=plan["epsilon"], delta=plan["delta"])
        return TrainConfig(
            epochs=int(t["epochs"]),
            batch_size=int(t["batch_size"]),
            optimizer=t["optimizer"],
            lr=float(t["lr"]),
            seed=seed,
            augment=t.get("augment") or "none",
            dp=dp,
            noise_seed=seed,  # the attacker's own models: seeded, so an audit repeats
        )
    except (EdgeflError, KeyError, TypeError, ValueError) as exc:
        why = exc.message if isinstance(exc, EdgeflError) else f"{type(exc).__name__}: {exc}"
        raise ConfigError(
            f"{target.path}: its training record cannot be replayed for the shadow or "
            f"reference models ({why})",
            hint=f"audit it with {TRAIN_NOTHING}",
        ) from None


def recipe(target: Target) -> Trainer:
    spec = target.upload.spec
    role = "generator" if target.upload.kind == "decoder" else "classifier"
    classes = target.data.num_classes

    def fit(x: np.ndarray, y: np.ndarray, seed: int) -> nn.Module:
        cfg = train_config(target, seed)
        if target.training.get("windows") == "aligned":
            x = align_windows(x, y)
        model = init_model(spec, seed)
        # Ctrl-C or SIGTERM stops the audit: no report of half-trained shadows
        stop_if_interrupted(train(model, role, x, y, classes, cfg))
        return model.decoder if role == "generator" else model

    return fit


def drawn_like(target: Target, pool: np.ndarray, seed: int) -> np.ndarray:
    """As many pool samples as the upload trained on, with its class counts where the pool
    holds them."""
    counts = np.bincount(target.data.y[target.train_idx], minlength=target.data.num_classes)
    return class_matched(np.random.default_rng(seed), pool, target.data.y, counts)


def trains(target: Target, settings: AuditSettings) -> bool:
    """Whether the audit trains models of its own (shadows, a reference decoder)."""
    return bool(settings.shadows if target.upload.kind == "classifier" else settings.reference)


# Epochs x samples of one shadow or reference model: 200 epochs over all 60,000 of MNIST's are
# 1.2e7; past this the upload's record (its own word) would tie the machine up for hours.
MAX_SAMPLE_PASSES = 100_000_000


def prepare(target: Target, settings: AuditSettings) -> Queries:
    """The queries, and every check the attacks' own training needs: before any work."""
    q = choose_queries(target, settings)
    if trains(target, settings):
        passes = train_config(target, settings.seed).epochs * len(target.train_idx)
        if passes > MAX_SAMPLE_PASSES:
            raise ConfigError(
                f"{target.path}: its training record asks each shadow or reference model for "
                f"{passes:,} sample passes ({target.training['epochs']} epochs over "
                f"{len(target.train_idx):,} samples), over the {MAX_SAMPLE_PASSES:,} an audit "
                "trains",
                hint=f"audit it with {TRAIN_NOTHING}",
            )
        have, need = len(drawn_like(target, q.pool, settings.seed)), len(target.train_idx)
        if have < need / 2:
            raise ConfigError(
                f"{target.path}: the data outside its shard hold {have} samples of its classes "
                f"for a shadow or reference model, which trains on {need} as it did",
                hint="lower --queries (the non-members are kept out of it), or use "
                + TRAIN_NOTHING,
            )
    return q


# ---------------------------------------------------------------------------------------------
# The attacks

Scores = dict[str, tuple[np.ndarray, np.ndarray]]


class _Onnx(nn.Module):
    """An upload that has no torch module (int8, another tool's spec) run by onnxruntime: the
    attacks that only query it (forward, no gradient) read it like a module."""

    def __init__(self, art: exporters.Artifact, latent_dim: int | None = None):
        super().__init__()
        self.art = art
        if latent_dim is not None:
            self.latent_dim = latent_dim

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = self.art.run(*[t.detach().numpy().astype(np.float32) for t in inputs])
        return torch.from_numpy(np.asarray(out))


def _model(target: Target) -> nn.Module:
    up = target.upload
    if up.module is not None:
        return up.module
    return _Onnx(up.artifact, up.latent_dim if up.kind == "decoder" else None)


def classifier_scores(
    target: Target, q: Queries, settings: AuditSettings, report: Reporter
) -> tuple[Scores, dict[str, float]]:
    model = _model(target)
    x, y, n = q.xy(target.data)
    logits = audit.loss_scores(model, x, y)
    scores = {"loss threshold": (logits[:n], logits[n:])}
    conf = audit.logit_confidence(model, x, y)
    right = audit.model_logits(model, x).argmax(1).numpy() == y
    accuracy = {"members": float(right[:n].mean()), "nonmembers": float(right[n:].mean())}
    if settings.shadows:
        fit, rows = recipe(target), []
        for k in range(settings.shadows):
            report("shadow classifiers", k, settings.shadows, "trained as the upload was")
            pick = drawn_like(target, q.pool, settings.seed + 1 + k)
            shadow = fit(target.data.x[pick], target.data.y[pick], settings.seed + 1 + k)
            rows.append(audit.logit_confidence(shadow, x, y))
        report("shadow classifiers", settings.shadows, settings.shadows)
        lira = audit.lira_offline_scores(conf, np.stack(rows))
        scores[f"LiRA offline, {settings.shadows} shadows"] = (lira[:n], lira[n:])
    return scores, accuracy


def decoder_scores(
    target: Target, q: Queries, settings: AuditSettings, report: Reporter
) -> tuple[Scores, dict[str, float]]:
    decoders = {"target": _model(target)}
    if settings.reference:
        report("reference decoder", 0, 1, "trained as the upload was, on other data")
        pick = drawn_like(target, q.pool, settings.seed + 200)
        fit = recipe(target)
        decoders["reference"] = fit(target.data.x[pick], target.data.y[pick], settings.seed + 200)
        report("reference decoder", 1, 1)
    x, y, n = q.xy(target.data)
    if target.training.get("windows") == "aligned":  # as the decoder saw its windows
        train_x, train_y = target.data.x[target.train_idx], target.data.y[target.train_idx]
        x = align_like(train_x, train_y, x, y)
    classes = target.data.num_classes
    how = audit.Reconstruction(restarts=settings.restarts, steps=settings.steps)
    distances: dict[tuple[str, str], np.ndarray] = {}
    # Reconstruction needs the decoder's gradient: an int8 target has none (nor then a use for
    # the reference's).
    rebuilt = not isinstance(decoders["target"], _Onnx)
    for who, decoder in decoders.items():
        if rebuilt:
            distances[who, "reconstruction"] = _reconstructed(
                decoder,
                x,
                y,
                classes,
                how,
                settings.seed,
                lambda i, k=who: report(
                    f"reconstruction ({k})", i, len(y), f"{how.restarts} starts x {how.steps} steps"
                ),
            )
        distances[who, "sample distance"] = audit.sample_distances(
            decoder, x, y, classes, samples=settings.draws, seed=settings.seed
        )
    scores = {}
    for (who, attack), dist in distances.items():
        if who != "target":
            continue
        scores[attack] = _split(audit.distance_scores(dist), n)
        ref = distances.get(("reference", attack))
        if ref is not None:
            scores[attack + " (calibrated)"] = _split(audit.distance_scores(dist, ref), n)
    return scores, {}


def _reconstructed(decoder, x, y, classes, how, seed: int, done: Callable[[int], None]):
    """audit.reconstruction_distances in batches, each done reported (minutes on a CPU)."""
    out = []
    for i in range(0, len(y), how.batch):
        done(i)
        part = slice(i, i + how.batch)
        out.append(
            audit.reconstruction_distances(decoder, x[part], y[part], classes, how, seed=seed + i)
        )
    done(len(y))
    return np.concatenate(out)


def _split(scores: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    return scores[:n], scores[n:]


# ---------------------------------------------------------------------------------------------
# One upload's audit


def privacy_text(meta: dict) -> str:
    s = spent(meta)
    if s.problem:
        return s.problem
    if s.epsilon is None:
        plan = ((meta.get("privacy") or {}).get("dp_sgd")) or {}
        model = (
            f"; the model: DP-SGD epsilon {plan['epsilon']:.3g} at delta {plan['delta']:.3g}"
            if {"epsilon", "delta"} <= set(plan)
            else ""
        )
        return f"not differentially private as a whole: {s.why}{model}"
    text = f"({s.epsilon:.3g}, {s.delta:.3g})-DP by its record"
    return text + (f" ({s.why})" if s.why else "")


def run_audit(
    target: Target,
    settings: AuditSettings,
    report: Reporter | None = None,
    queries: Queries | None = None,
) -> dict[str, Any]:
    """Every attack on the upload's kind: AUC and TPR at low FPR with bootstrap intervals.
    `queries`: from `prepare` (which checks before any work), else chosen here."""
    report = report or NullReporter()
    q = queries if queries is not None else prepare(target, settings)
    attack = classifier_scores if target.upload.kind == "classifier" else decoder_scores
    try:
        scores, accuracy = attack(target, q, settings, report)
    except EdgeflError:
        raise
    except RuntimeError as exc:  # torch on a model the spec built but the data do not fit
        raise ConfigError(
            f"{target.path}: the attack could not run the model: {str(exc).splitlines()[0]}",
            hint="audit the upload against the dataset it was trained on (--dataset)",
        ) from None
    meta = target.upload.meta
    rows = [
        {"attack": name, **audit.evaluate_attack(m, nm, seed=settings.seed).as_dict()}
        for name, (m, nm) in scores.items()
    ]
    return {
        "upload": str(target.path),
        "client_id": target.upload.client_id,
        "kind": target.upload.kind,
        "model": spec_label(target.upload.spec) if target.upload.spec else None,
        "dataset": target.data.name,
        "privacy": privacy_text(meta),
        "label_counts": _release(meta),
        "members": len(q.members),
        "nonmembers": len(q.nonmembers),
        "nonmember_source": q.source,
        "trained_on": len(target.train_idx),
        "accuracy": accuracy,
        "attacks": rows,
        "skipped": _skipped(target),
    }


def _skipped(target: Target) -> list[str]:
    if target.upload.kind == "decoder" and target.upload.module is None:
        why = target.upload.forward_only or "no torch module"
        return [f"reconstruction: it needs the decoder's gradient ({why})"]
    return []
