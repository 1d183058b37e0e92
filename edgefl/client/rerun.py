"""Is an existing upload this job's own? A client's upload is OUT/<client-id>.onnx: a rerun of the
same command may replace it (it writes the same thing), anything else there is refused unless
the user asks for `--overwrite`, before any training (issue 34: a `--search pso` run silently
replaced the phone's upload an earlier plain `client train` had made).

"The same command" is read from what the upload records: its profile, dataset, partition and
client, its kind (model, predictions, prototypes), its model (the spec this job would train:
`--model`, `--spec`, the planner's pick, or the `--search` and its settings) and its training
settings (epochs, lr, batch size, optimizer, window treatment, seeds, jitter). Uploads made
before the seeds and jitter were recorded are compared on the rest.
`edgefl simulate` reads the same rule to decide whether a finished upload can be reused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgefl.client.job import (
    ClientJob,
    job_augment,
    job_optimizer,
    local_schedule,
    window_treatment,
)
from edgefl.errors import ConfigError
from edgefl.models.parse import parse_model_arg
from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import spec_label
from edgefl.outputs import describe_result, existing_result, replacing_error
from edgefl.profiles import get_profile

# What a job's `kind` writes, as the upload's metadata names it.
_KINDS = {
    "model": ("classifier", "decoder"),
    "predictions": ("predictions",),
    "prototypes": ("prototypes",),
}


def search_record(job: ClientJob) -> dict[str, Any] | None:
    """What an upload made by `--search` records of it (None without a search): the method,
    its options and the seed, so that a rerun with other settings is told apart."""
    if not job.search:
        return None
    options = {k: v for k, v in sorted((job.search_options or {}).items()) if v is not None}
    return {"method": job.search, **options, "seed": job.seed * 1000 + job.client_index}


def training_differs(cjob: ClientJob, made: ModelSpec, role: str, trained: dict) -> str:
    """What an existing upload (its spec, role and training metadata) has differently from the
    job ('' if nothing): the model (when the job names one), the search (when the upload
    records one), epochs, lr, batch size, optimizer, window treatment, and the seeds and jitter
    where the upload records them."""
    diffs = []
    if cjob.model is not None:
        want = parse_model_arg(cjob.model, made.input_shape, made.num_classes)
        if want.to_dict() != made.to_dict():
            diffs.append(f"model {spec_label(made)} -> {spec_label(want)}")
    if "search" in trained and trained["search"] != search_record(cjob):
        diffs.append(
            f"search {_search_text(trained['search'])} -> {_search_text(search_record(cjob))}"
        )
    profile = get_profile(cjob.profile)
    samples = trained.get("samples")
    epochs, lr = local_schedule(cjob, profile, role, samples if isinstance(samples, int) else 0)
    batch, optimizer = cjob.batch_size or profile.batch_size, job_optimizer(cjob, profile)
    for key, want in (
        ("epochs", epochs),
        ("lr", lr),
        ("batch_size", batch),
        ("optimizer", optimizer),
    ):
        if trained.get(key) != want:
            diffs.append(f"{key} {trained.get(key)} -> {want}")
    windows = window_treatment(made, role)
    if trained.get("windows") != windows:  # a decoder trained on unaligned windows (older runs)
        diffs.append(f"windows {trained.get('windows') or 'as recorded'} -> {windows}")
    diffs += _seeds_differ(cjob, trained, {"augment": job_augment(cjob, made, role)})
    return ", ".join(diffs + privacy_differs(cjob, trained))


def privacy_differs(job: ClientJob, trained: dict) -> list[str]:
    """--dp and --label-counts where the upload's training record differs (an upload that
    does not record them was trained without DP, its counts exact)."""
    from edgefl.privacy import DPConfig

    have, want = trained.get("dp"), job.dp
    diffs = []
    try:
        same = (have is None) == (want is None) and (
            have is None or DPConfig.parse(have) == DPConfig.parse(want)
        )
    except (ConfigError, TypeError):  # a record this edgefl cannot read: not the job's
        same = False
    if not same:
        diffs.append(f"dp {have or 'none'} -> {want or 'none'}")
    release = trained.get("label_release", "exact")
    if release != job.label_counts:
        diffs.append(f"label-counts {release} -> {job.label_counts}")
    return diffs


def _seeds_differ(job: ClientJob, trained: dict, more: dict | None = None) -> list[str]:
    """The seeds (and `more`) the upload records that differ from the job's; a key an older
    upload does not record is not compared."""
    want = {"seed": job.seed, "fed_seed": job.fed_seed} | (more or {})
    return [f"{k} {trained[k]} -> {v}" for k, v in want.items() if k in trained and trained[k] != v]


def _search_text(record: dict | None) -> str:
    if not record:
        return "none"
    rest = ", ".join(f"{k} {v}" for k, v in record.items() if k != "method")
    return f"{record.get('method')} ({rest})"


def upload_differs(
    job: ClientJob, meta: dict[str, Any], want: ModelSpec | None, dataset: str
) -> list[str]:
    """How the upload described by `meta` differs from what `job` would write ([] if it is
    this job's own). `want`: the spec the job trains (None for a search, not yet run);
    `dataset`: the name of the job's dataset, as uploads record it."""
    diffs = federation_differs(job, meta, dataset)
    if diffs:  # another client's or another federation's upload: its model says no more
        return diffs
    trained = meta.get("training") or {}
    made = _spec_of(meta)
    diffs = _model_differs(job, meta, made, want, "search" in trained)
    if job.kind == "predictions":
        public = {"public": job.public, "dtype": "float16" if job.fp16 else "float32"}
        diffs += [f"{k} {meta.get(k)} -> {v}" for k, v in public.items() if meta.get(k) != v]
    if not diffs:
        diffs += _training_found(job, meta, made, trained)
    quantized = bool(meta.get("quantized"))
    if job.kind == "model" and quantized != (job.quantize == "int8"):
        diffs.append(f"quantize {'int8' if quantized else 'none'} -> {job.quantize or 'none'}")
    return diffs


def federation_differs(job: ClientJob, meta: dict[str, Any], dataset: str) -> list[str]:
    """The upload's kind, profile, dataset and place in a federation (partition, clients,
    index, seed, subset, public set carved), where not the job's."""
    diffs = []
    kind = meta.get("kind")
    if kind not in _KINDS[job.kind]:
        diffs.append(f"upload kind {kind} -> {job.kind if job.kind != 'model' else 'model'}")
    part = meta.get("partition") or {}
    ours = {
        "profile": get_profile(job.profile).name,
        "dataset": dataset,
        "partition": job.partition,
        "num_clients": job.num_clients,
        "client_index": job.client_index,
        "partition_seed": job.partition_seed,
        "subset": job.subset,
        "public_size": job.public_size,
    }
    theirs = {
        "profile": meta.get("profile"),
        "dataset": meta.get("dataset"),
        "partition": part.get("scheme"),
        "num_clients": part.get("num_clients"),
        "client_index": part.get("client_index"),
        "partition_seed": part.get("seed"),
        "subset": part.get("subset"),
        "public_size": part.get("public_size"),
    }
    # An upload made before edgefl recorded the subset and the public carve does not say them:
    # those two are not compared for it (the dataset and the rest still are).
    unsaid = {k for k in ("subset", "public_size") if k not in part}
    return diffs + [
        f"{k} {theirs[k]} -> {ours[k]}" for k in ours if k not in unsaid and theirs[k] != ours[k]
    ]


def _model_differs(
    job: ClientJob,
    meta: dict[str, Any],
    made: ModelSpec | None,
    want: ModelSpec | None,
    searched: bool,
) -> list[str]:
    """The upload's model (`made`, else the name it records) where not `want`; with no `want`
    (a search job), an upload not made by a search."""
    if want is not None:
        label = spec_label(made) if made is not None else meta.get("model")
        same = made.to_dict() == want.to_dict() if made is not None else label == spec_label(want)
        return [] if same else [f"model {label} -> {spec_label(want)}"]
    if not searched:  # not made by a search (or by one too old to say)
        label = spec_label(made) if made is not None else meta.get("model")
        return [f"model {label} -> a --search {job.search} result"]
    return []


def _training_found(
    job: ClientJob, meta: dict[str, Any], made: ModelSpec | None, trained: dict
) -> list[str]:
    """The training settings the upload records differently from the job's ([] if none)."""
    if made is not None:
        role = "classifier" if meta.get("kind") == "classifier" else "generator"
        found = training_differs(_without_model(job), made, role, trained)
    else:  # a data upload: its training settings, without the spec it dropped
        found = _settings_differ(job, trained)
    return [found] if found else []


def _without_model(job: ClientJob) -> ClientJob:
    from dataclasses import replace

    return replace(job, model=None)  # the model was compared as a spec already


def _settings_differ(job: ClientJob, trained: dict) -> str:
    profile = get_profile(job.profile)
    samples = trained.get("samples")
    epochs, lr = local_schedule(
        job, profile, "classifier", samples if isinstance(samples, int) else 0
    )
    want = {
        "epochs": epochs,
        "lr": lr,
        "batch_size": job.batch_size or profile.batch_size,
        "optimizer": job_optimizer(job, profile),
    }
    diffs = [f"{k} {trained.get(k)} -> {v}" for k, v in want.items() if trained.get(k) != v]
    return ", ".join(diffs + _seeds_differ(job, trained) + privacy_differs(job, trained))


def _spec_of(meta: dict[str, Any]) -> ModelSpec | None:
    try:
        return ModelSpec.from_dict(meta["spec"]) if meta.get("spec") else None
    except (ConfigError, KeyError, TypeError, ValueError):
        return None


def check_upload_target(
    job: ClientJob, path: Path, want: ModelSpec | None, dataset: str, flag: str = "--out"
) -> None:
    """Refuse, before the training, to replace `path` with this job's upload unless it is this
    job's own (a rerun) or the job says `overwrite`."""
    if job.overwrite or not path.exists():
        return
    meta = existing_result(path)
    diffs = [] if meta is None else upload_differs(job, meta, want, dataset)
    if meta is not None and not diffs:
        return  # the same command again: it writes what is there
    what = describe_result(meta)
    differs = f", made with other settings ({'; '.join(diffs)})" if diffs else ""
    raise replacing_error(path, flag, what + differs, "--client-id NAME")
