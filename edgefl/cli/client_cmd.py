"""`edgefl client ...`: what a device owner runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from device_profiles import OPTIMIZERS
from edgefl.cli.common import (
    MAKES_FOLDERS,
    QUIET,
    applies_only_with,
    check_counts,
    check_data_dir,
    console,
    fmt_bytes,
    fmt_count,
    print_json,
    print_quiet,
)
from edgefl.cli.progress import reporter
from edgefl.client.privacy import DP_HELP, LABEL_HELP
from edgefl.data.registry import dataset_info
from edgefl.profiles import get_profile

if TYPE_CHECKING:
    from edgefl.models.plan import Plan

app = typer.Typer(
    help="Plan, train and export a device's model.", no_args_is_help=True, rich_markup_mode=None
)

# Options shared by the commands that train on a device (one definition, one help text).
PROFILE = typer.Option(..., help="Profile name or TOML path.")
DATASET = typer.Option("mnist", help="Dataset name, .npz file or image folder.")
DATA_DIR = typer.Option(None, help="Folder with standard dataset files.")
PARTITION = typer.Option(
    "dirichlet:0.5",
    help="iid | dirichlet:ALPHA | classes:K | user[:ID,ID,...] (one client per user: hapt).",
)
NUM_CLIENTS = typer.Option(10, help="Clients in the federation.")
CLIENT_INDEX = typer.Option(0, help="Which client's shard this device holds.")
EPOCHS = typer.Option(None, help="Local epochs (default: profile's).")
BATCH_SIZE = typer.Option(None, help="Batch size (default: profile's).")
SEED = typer.Option(0, help="Local training seed.")
FORCE = typer.Option(False, help="Train a --model even if it does not fit the profile.")
CLIENT_ID = typer.Option(None, help="Client id (default client-<index>).")
JSON_SUMMARY = typer.Option(False, "--json", help="Print a JSON summary.")
FED_SEED = typer.Option(0, help="Federation seed (initial weights).")
LR = typer.Option(None, help="Learning rate.")
OPTIMIZER = typer.Option(
    None,
    help=f"{' | '.join(OPTIMIZERS)} (default: the profile's; Adam under --dp).",
)
OVERWRITE = typer.Option(
    False,
    "--overwrite",
    help="Replace an upload at the output path that another command made (a rerun of the "
    "same command replaces its own without it).",
)
DP = typer.Option(None, "--dp", help=DP_HELP)
LABEL_COUNTS = typer.Option("exact", "--label-counts", help=LABEL_HELP)
UPLOAD_DIR = typer.Option(
    "uploads", "--out", help="Directory for <client-id>.onnx." + MAKES_FOLDERS
)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="client")


def print_plan(p: Plan) -> None:
    from edgefl.models.zoo import spec_label

    c, f, prof = p.costs, p.fit, p.profile
    console.print(
        f"[bold]{escape(prof.name)}[/] on [bold]{escape(p.dataset.name)}[/]: role [cyan]{p.role}[/]"
    )
    console.print(f"  why: {escape(p.role_reason)}")
    console.print(
        f"  model: [bold]{escape(spec_label(p.spec))}[/] (largest of {p.considered} {p.role}s that fits)"
    )
    budget = prof.ram_budget_bytes
    console.print(
        f"  params {fmt_count(c.params)}, {c.macs:,} MACs/sample, upload {fmt_bytes(c.upload_bytes)}"
    )
    dp = f" under DP-SGD, {f.clipping} clipping {f.dp_chunk} at once" if f.clipping else ""
    console.print(
        f"  training memory {fmt_bytes(f.train_bytes)} (batch {f.batch_size}, {f.optimizer}{dp}) "
        f"of {fmt_bytes(budget)} budget ({100 * f.train_bytes / budget:.0f}%)"
    )
    console.print(
        f"  inference peak {fmt_bytes(c.infer_peak_bytes)}; est. {f.epoch_seconds:.1f} s/epoch "
        f"on {f.samples:,} samples (limit {prof.max_epoch_seconds:.0f} s)"
    )


def train_with_progress(job, quiet: bool = False):
    """run_client with its epochs shown on stderr: bars on a terminal, plain lines elsewhere."""
    from edgefl.client.run import run_client

    if job.client_id is not None:
        _check_client_id(job.client_id, job.out_dir)
    with reporter(quiet) as watch:

        def on_epoch(epoch: int, total: int, loss: float) -> None:
            watch("training epoch", epoch, total, f"loss {loss:.4f}")

        return run_client(job, on_epoch=on_epoch, on_status=watch.message, on_progress=watch)


def _check_client_id(client_id: str, out: str) -> None:
    """The upload is OUT/<client-id>.onnx: an id too long for a file name fails now, not
    after the training."""
    import os

    from edgefl.errors import ConfigError
    from edgefl.outputs import name_limit

    limit = name_limit(out) - len(".onnx")
    if len(os.fsencode(client_id)) > limit:
        raise ConfigError(
            f"--client-id is {len(os.fsencode(client_id))} bytes long: the upload's file name "
            f"<client-id>.onnx may have at most {limit} bytes before .onnx on this file system",
            hint=f"use a shorter id, e.g. --client-id {client_id[:40]}",
        )


@app.command("plan")
def plan_cmd(
    profile: str = PROFILE,
    dataset: str = typer.Option("mnist", help="Dataset name."),
    role: str = typer.Option("auto", help="auto | classifier | generator."),
    samples: int | None = typer.Option(None, help="Local shard size (default: train size / 10)."),
    batch_size: int | None = typer.Option(None, help="Override the profile's batch size."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    dp: str | None = DP,
) -> None:
    """The device's role and the largest model of that role that fits its budget."""
    from edgefl.models.plan import default_samples, plan  # torch: only when planning
    from edgefl.privacy import DPConfig

    check_counts(samples=samples, batch_size=batch_size)
    cfg = DPConfig.parse(dp) if dp is not None else None  # a bad --dp: before planning
    prof, info = get_profile(profile), dataset_info(dataset)
    samples = samples or default_samples(info)
    if cfg is not None:  # the memory must hold DP-SGD's expected batch
        batch_size = cfg.expected_batch(batch_size or prof.batch_size, samples)
    p = plan(prof, info, role=role, samples=samples, batch_size=batch_size, dp=cfg is not None)
    if json_out:
        print_json(p.as_dict())
    else:
        print_plan(p)


def _check_spec(spec: str | None, model: str | None, search: str | None) -> None:
    """--spec alone names the model, and a bad file fails now, not after the data is loaded."""
    from edgefl.errors import ConfigError
    from edgefl.models.parse import load_spec_file

    if spec is None:
        return
    if model is not None or search is not None:
        raise ConfigError(
            "--spec names the model, and so do --model and --search",
            hint="give --spec without --model or --search (or drop --spec)",
        )
    load_spec_file(spec)


@app.command("train")
def train_cmd(
    ctx: typer.Context,
    profile: str = PROFILE,
    dataset: str = DATASET,
    out: str = typer.Option(
        "uploads", "--out", help="Directory for the artifact <client-id>.onnx." + MAKES_FOLDERS
    ),
    data_dir: str | None = DATA_DIR,
    partition: str = PARTITION,
    num_clients: int = NUM_CLIENTS,
    client_index: int = CLIENT_INDEX,
    partition_seed: int = typer.Option(0, help="Seed of the partition (same for all clients)."),
    public_size: int = typer.Option(
        0,
        help="Samples held out of train as the federation's public set before partitioning "
        "(the same on every client and the server; whole users on data that names them).",
    ),
    model: str | None = typer.Option(
        None, help="Zoo model, e.g. cnn or scnn:width=16 (default: planner)."
    ),
    spec: str | None = typer.Option(
        None, "--spec", help="Train the model spec a search saved (`edgefl search --save`)."
    ),
    role: str = typer.Option("auto", help="auto | classifier | generator."),
    epochs: int | None = EPOCHS,
    batch_size: int | None = BATCH_SIZE,
    lr: float | None = typer.Option(None, help="Learning rate (default by role and optimizer)."),
    optimizer: str | None = OPTIMIZER,
    augment: str | None = typer.Option(
        None,
        help="Train-time jitter: rotate (sensor windows: small 3-D rotation and gain, the "
        "default there), affine (images), none (the default on images).",
    ),
    seed: int = SEED,
    fed_seed: int = typer.Option(
        0, help="Federation seed: identical initial weights per architecture."
    ),
    quantize: str | None = typer.Option(
        None, help="int8: dynamic int8 quantization of the upload."
    ),
    force: bool = FORCE,
    client_id: str | None = CLIENT_ID,
    overwrite: bool = OVERWRITE,
    search: str | None = typer.Option(
        None, help="pso: search the architecture under the budget (pFedZKD's PSO-FedNAS)."
    ),
    particles: int = typer.Option(6, help="--search: swarm size (quick default; paper: 20)."),
    generations: int = typer.Option(3, help="--search: PSO generations (quick; paper: 10)."),
    candidate_epochs: int = typer.Option(
        1, help="--search: training epochs per candidate (quick; paper: 10)."
    ),
    dp: str | None = DP,
    label_counts: str = LABEL_COUNTS,
    json_out: bool = JSON_SUMMARY,
    quiet: bool = QUIET,
) -> None:
    """Train the model that fits this device on its local data and write one ONNX upload."""

    from edgefl.chance import classifier_warnings
    from edgefl.client.privacy import check_request, whole_shard_warnings
    from edgefl.client.run import ClientJob

    check_request(dp, label_counts)  # a bad --dp or --label-counts: before anything loads
    check_data_dir(data_dir, {"--dataset": dataset})
    _check_applies(ctx, search=search, model=model or spec)
    _check_spec(spec, model, search)
    job = ClientJob(
        profile=profile,
        dataset=dataset,
        out_dir=out,
        data_dir=data_dir,
        partition=partition,
        num_clients=num_clients,
        client_index=client_index,
        partition_seed=partition_seed,
        public_size=public_size,
        model=model,
        spec_file=spec,
        role=role,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        optimizer=optimizer,
        seed=seed,
        fed_seed=fed_seed,
        quantize=quantize,
        force=force,
        client_id=client_id,
        search=search,
        augment=augment,
        overwrite=overwrite,
        dp=dp,
        label_counts=label_counts,
        search_options={
            "particles": particles,
            "generations": generations,
            "candidate_epochs": candidate_epochs,
        }
        if search
        else None,
    )
    result = train_with_progress(job, quiet)
    summary = result.as_dict()
    warnings = classifier_warnings([summary]) + whole_shard_warnings([summary])
    warnings += _spec_shard_warnings(spec, job)
    if json_out:
        print_json(summary | ({"warnings": warnings} if warnings else {}))
    elif quiet:
        print_quiet(warnings)
    else:
        _print_trained(result, warnings)


def _check_applies(ctx: typer.Context, search: str | None, model: str | None) -> None:
    """Flags that only act with another one, refused without it (they were passed over);
    `model`: the --model or --spec named."""
    for name in ("particles", "generations", "candidate_epochs"):
        flag = "--" + name.replace("_", "-")
        applies_only_with(
            ctx, name, "--search", search is not None, hint=f"add --search pso, or drop {flag}"
        )
    _check_force(ctx, model)


def _check_force(ctx: typer.Context, model: str | None, named: str = "--model or --spec") -> None:
    """--force acts on a named model only (`named`: the flags that name one here): the
    planner's pick always fits."""
    applies_only_with(
        ctx,
        "force",
        named,
        model is not None,
        hint=f"name the model with {named}, or drop --force",
        why="the planner's pick fits the profile",
    )


def _spec_shard_warnings(spec: str | None, job) -> list[str]:
    """A --spec searched on another shard than this job's (`search` printed a command that
    trained client 0 of 10 on a spec searched on client 0 of 4): said, not refused (a spec
    may be meant for another client of the same federation)."""
    if spec is None:
        return []
    try:
        searched = json.loads(Path(spec).read_text()).get("searched")
    except (OSError, ValueError, AttributeError):
        return []
    if not isinstance(searched, dict):
        return []
    here = {
        "profile": job.profile,
        "dataset": job.dataset,
        "partition": job.partition,
        "num_clients": job.num_clients,
        "client_index": job.client_index,
        "partition_seed": job.partition_seed,
    }
    differ = [
        f"{k} {searched[k]!r} (here {here[k]!r})"
        for k in here
        if k in searched and searched[k] != here[k]
    ]
    if not differ:
        return []
    return [f"{spec} was searched with {', '.join(differ)}: its search fitted another shard"]


def _print_trained(result, warnings: list[str]) -> None:
    from edgefl.models.zoo import spec_label

    s, f, prof = result.summary, result.fit, result.profile
    console.print(
        f"[bold]{escape(result.client_id)}[/] ({escape(prof.name)}): [cyan]{result.role}[/] "
        f"{escape(spec_label(result.spec))}"
    )
    console.print(
        f"  {costs_line(result)}; training memory {fmt_bytes(f.train_bytes)} of "
        f"{fmt_bytes(prof.ram_budget_bytes)} budget; est. on-device {f.epoch_seconds:.1f} s/epoch"
    )
    if s.val_accuracy is not None:
        metric = f"local val accuracy {100 * s.val_accuracy:.2f}%"
    elif s.val_loss is not None:
        metric = f"local val loss {s.val_loss:.3f}"
    else:  # a shard too small to hold any sample out
        metric = "no local validation samples"
    console.print(
        f"  {s.epochs} epochs, final loss {s.final_loss:.4f}, {metric} ({s.seconds:.1f} s here)"
    )
    if result.quantization:
        q = result.quantization
        line = f"  int8: {fmt_bytes(q['size_before'])} -> {fmt_bytes(q['size_after'])}"
        if "val_accuracy_fp32" in q:
            line += f", val accuracy {100 * q['val_accuracy_fp32']:.2f}% -> {100 * q['val_accuracy_int8']:.2f}%"
        console.print(line)
    privacy = _privacy_line(result.metadata.get("privacy") or {})
    if privacy:
        console.print(f"  privacy: {privacy}", markup=False)
    console.print(
        f"  upload: [bold]{escape(str(result.path))}[/] ({fmt_bytes(result.upload_bytes)})"
    )
    for w in warnings:
        console.print(f"[yellow]warning[/] {escape(w)}")


def _privacy_line(record: dict) -> str:
    """What the upload's privacy record says, in words ("" for plain training, exact counts)."""
    labels = record.get("label_counts") or {}
    parts = []
    if record.get("dp_sgd"):
        plan = record["dp_sgd"]
        parts.append(
            f"DP-SGD epsilon {plan['epsilon']:.3g} at delta {plan['delta']:.3g} (noise "
            f"{plan['noise_multiplier']:.3g}, {plan['steps']} steps)"
        )
    if isinstance(record.get("prototypes"), dict):
        parts.append(f"prototypes noised (epsilon {record['prototypes']['epsilon']:.3g})")
    if labels.get("release") == "noised":
        parts.append(f"label counts noised (epsilon {labels['epsilon']:.3g})")
    elif labels.get("release") == "absent":
        parts.append("no label counts")
    if not parts:
        return ""
    if record.get("epsilon") is not None:
        total = f"({record['epsilon']:.3g}, {record['delta']:.3g})-DP in all"
        return "; ".join(parts) + f": {total}, for each training sample (not the data as a whole)"
    leak = (
        "exact label counts" if labels.get("release") == "exact" else "a model trained without --dp"
    )
    return "; ".join(parts) + f"; not DP as a whole: {leak}"


def costs_line(result) -> str:
    from edgefl.models.cost import costs

    c = costs(result.spec)
    return f"{fmt_count(c.params)} params, {c.macs:,} MACs/sample"


@app.command("sample")
def sample_cmd(
    decoder: str = typer.Argument(..., help="A decoder artifact (.onnx)."),
    per_class: int = typer.Option(
        8, help="Images per class (one row per class; at most 32, which stay legible)."
    ),
    out: str = typer.Option("samples.png", "--out", help="PNG file to write." + MAKES_FOLDERS),
    seed: int = typer.Option(0, help="Seed of the latent draws."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """A picture of what a decoder generates, one row per class."""
    from edgefl.bounds import SEED, Range
    from edgefl.cli.infer_cmd import load_artifact
    from edgefl.client.sample import MAX_PER_CLASS, sample_grid
    from edgefl.outputs import check_png_out

    # Past 32 a row is squeezed into the picture's width: 300 draws a class were illegible.
    Range(1, MAX_PER_CLASS, integer=True).check("--per-class", per_class)
    SEED.check("--seed", seed, hint="e.g. --seed 0")
    check_png_out(out, "--out", "samples.png")  # before the decoder is read, not after
    art = load_artifact(decoder)  # a file that is not an edgefl artifact: said, not a traceback
    path = sample_grid(art, per_class=per_class, out=out, seed=seed)
    if json_out:
        c = art.metadata["num_classes"]
        print_json({"path": str(path), "per_class": per_class, "classes": c, "seed": seed})
    else:
        console.print(f"wrote {escape(str(path))}")


# --- uploads without weights (FedOL predictions, FedGH prototypes) and FedGH's header -------


def _run_data_client(job, json_out: bool, quiet: bool = False) -> None:
    """Train exactly like `client train`, then write the job's data artifact instead of weights."""
    from edgefl.models.zoo import spec_label

    result = train_with_progress(job, quiet)
    meta = result.metadata
    if json_out:
        keep = (
            "kind",
            "public",
            "public_size",
            "public_fingerprint",
            "dtype",
            "representation_size",
            "classes",
            "counts",
            "kept_model",
        )
        print_json(result.as_dict() | {k: meta[k] for k in keep if k in meta})
        return
    if quiet:
        return
    s = result.summary
    acc = f", local val accuracy {100 * s.val_accuracy:.2f}%" if s.val_accuracy is not None else ""
    console.print(
        f"[bold]{escape(result.client_id)}[/] ({escape(result.profile.name)}): trained "
        f"{escape(spec_label(result.spec))}, "
        f"{s.epochs} epochs{acc}"
    )
    if meta["kind"] == "predictions":
        what = (
            f"{meta['public_size']:,} x {meta['num_classes']} {meta['dtype']} softmax outputs on "
            f"{meta['public']} (fingerprint {meta['public_fingerprint'][:12]}...)"
        )
    else:
        what = (
            f"{len(meta['classes'])} class-mean representations of size "
            f"{meta['representation_size']} (classes {meta['classes']})"
        )
    console.print(f"  {escape(what)}; no weights leave the device")
    privacy = _privacy_line(meta.get("privacy") or {})
    if privacy:  # as client train says it
        console.print(f"  privacy: {privacy}", markup=False)
    if result.metadata.get("kept_model"):
        console.print(
            f"  own model kept at {escape(result.metadata['kept_model'])} (not an upload)"
        )
    console.print(
        f"  upload: [bold]{escape(str(result.path))}[/] ({fmt_bytes(result.upload_bytes)})"
    )


def _carved_size(public: str, public_size: int | None) -> int:
    """What a predictions job carves out of train: a DATASET:public split's size; nothing for
    an .npz public set (a --public-size there would take samples from training for nothing)."""
    from edgefl.data.public import DEFAULT_PUBLIC_SIZE, is_carved
    from edgefl.errors import ConfigError

    if is_carved(public):
        return DEFAULT_PUBLIC_SIZE if public_size is None else public_size
    if public_size is not None:
        raise ConfigError(
            f"--public-size sizes a DATASET:public split; --public {public} is used whole",
            hint="drop --public-size, or use --public DATASET:public",
        )
    return 0


@app.command("predict")
def predict_cmd(
    ctx: typer.Context,
    profile: str = PROFILE,
    public: str = typer.Option(
        ..., help="Public set: DATASET:public (held out of every client) or an .npz with x."
    ),
    public_size: int | None = typer.Option(
        None,
        help="Size of a DATASET:public split, the same on every client and the server "
        "(default 5000; not for an .npz, which is used whole).",
    ),
    dataset: str = DATASET,
    out: str = UPLOAD_DIR,
    data_dir: str | None = DATA_DIR,
    partition: str = PARTITION,
    num_clients: int = NUM_CLIENTS,
    client_index: int = CLIENT_INDEX,
    partition_seed: int = typer.Option(0, help="Seed of the partition and of the public split."),
    model: str | None = typer.Option(None, help="Zoo classifier (default: planner's)."),
    epochs: int | None = EPOCHS,
    batch_size: int | None = BATCH_SIZE,
    lr: float | None = LR,
    optimizer: str | None = OPTIMIZER,
    seed: int = SEED,
    fed_seed: int = FED_SEED,
    fp16: bool = typer.Option(False, "--fp16", help="Store the predictions as float16."),
    dp: str | None = DP,
    label_counts: str = LABEL_COUNTS,
    keep_model: str | None = typer.Option(
        None, help="Also keep the trained model in this directory (never uploaded)."
    ),
    force: bool = FORCE,
    client_id: str | None = CLIENT_ID,
    overwrite: bool = OVERWRITE,
    json_out: bool = JSON_SUMMARY,
    quiet: bool = QUIET,
) -> None:
    """Train locally, then upload only softmax predictions on the public set (FedOL)."""
    from edgefl.client.run import ClientJob

    _check_force(ctx, model, named="--model")
    check_data_dir(data_dir, {"--dataset": dataset, "--public": public})
    public_size = _carved_size(public, public_size)

    job = ClientJob(
        profile=profile,
        dataset=dataset,
        out_dir=out,
        data_dir=data_dir,
        partition=partition,
        num_clients=num_clients,
        client_index=client_index,
        partition_seed=partition_seed,
        public_size=public_size,
        model=model,
        role="classifier",
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        optimizer=optimizer,
        seed=seed,
        fed_seed=fed_seed,
        force=force,
        client_id=client_id,
        kind="predictions",
        dp=dp,
        label_counts=label_counts,
        public=public,
        fp16=fp16,
        keep_model=keep_model,
        overwrite=overwrite,
    )
    _run_data_client(job, json_out, quiet)


@app.command("prototypes")
def prototypes_cmd(
    profile: str = PROFILE,
    model: str = typer.Option(
        "fedgh-cnn1", help="Zoo classifier; its features output is the representation."
    ),
    dataset: str = DATASET,
    out: str = UPLOAD_DIR,
    data_dir: str | None = DATA_DIR,
    partition: str = PARTITION,
    num_clients: int = NUM_CLIENTS,
    client_index: int = CLIENT_INDEX,
    partition_seed: int = typer.Option(0, help="Seed of the partition (same for all clients)."),
    public_size: int = typer.Option(
        0, help="Samples the federation held out as a public set (0: none), as on the others."
    ),
    keep_model: str = typer.Option(
        "local", help="Directory for the trained model, kept on the device for apply-header."
    ),
    dp: str | None = DP,
    label_counts: str = LABEL_COUNTS,
    epochs: int | None = EPOCHS,
    batch_size: int | None = BATCH_SIZE,
    lr: float | None = LR,
    optimizer: str | None = OPTIMIZER,
    seed: int = SEED,
    fed_seed: int = FED_SEED,
    force: bool = FORCE,
    client_id: str | None = CLIENT_ID,
    overwrite: bool = OVERWRITE,
    json_out: bool = JSON_SUMMARY,
    quiet: bool = QUIET,
) -> None:
    """Train locally, then upload per held class the mean representation and count (FedGH)."""
    from edgefl.client.run import ClientJob

    check_data_dir(data_dir, {"--dataset": dataset})
    job = ClientJob(
        profile=profile,
        dataset=dataset,
        out_dir=out,
        data_dir=data_dir,
        partition=partition,
        num_clients=num_clients,
        client_index=client_index,
        partition_seed=partition_seed,
        public_size=public_size,
        model=model,
        role="classifier",
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        optimizer=optimizer,
        seed=seed,
        fed_seed=fed_seed,
        force=force,
        client_id=client_id,
        kind="prototypes",
        dp=dp,
        label_counts=label_counts,
        keep_model=keep_model,
        overwrite=overwrite,
    )
    _run_data_client(job, json_out, quiet)


@app.command("apply-header")
def apply_header_cmd(
    model: str = typer.Argument(..., help="This device's own classifier artifact (.onnx)."),
    header: str = typer.Argument(..., help="The server's global header (fedgh output, .onnx)."),
    out: str = typer.Option(
        "personalized.onnx", "--out", help="Personalized model to write." + MAKES_FOLDERS
    ),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Replace a file at --out that is not this device's personalized model (an upload, "
        "a global model, ...); a rerun replaces its own without it.",
    ),
    json_out: bool = JSON_SUMMARY,
) -> None:
    """Splice FedGH's global header into this device's model and re-export it."""
    from edgefl.client.weightless import apply_header
    from edgefl.errors import ConfigError
    from edgefl.outputs import check_replace, check_writable, existing_result

    if not out.endswith(".onnx"):
        raise ConfigError(
            f"--out must end in .onnx, got {out}", hint="e.g. --out personalized.onnx"
        )
    check_writable(out, "--out", "personalized.onnx")
    device = (existing_result(model) or {}).get("client_id")
    check_replace(
        out,
        "--out",
        overwrite,
        lambda made: bool(made.get("personalized_from")) and made.get("client_id") == device,
    )
    info = apply_header(model, header, out)
    if json_out:
        print_json(info)
        return
    console.print(
        f"spliced the {info['representation_size']}-d global header from {escape(str(header))} "
        f"into {escape(str(model))}"
    )
    console.print(
        f"  personalized model: [bold]{escape(str(info['path']))}[/] ({fmt_bytes(info['size_bytes'])})"
    )
