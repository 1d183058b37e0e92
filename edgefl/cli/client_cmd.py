"""`edgefl client ...`: what a device owner runs."""

from __future__ import annotations

import typer

from edgefl.cli.common import console, fmt_bytes, fmt_count, print_json
from edgefl.data.registry import dataset_info
from edgefl.models.plan import Plan, plan
from edgefl.profiles import get_profile

app = typer.Typer(help="Plan, train and export a device's model.", no_args_is_help=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="client")


def print_plan(p: Plan) -> None:
    c, f, prof = p.costs, p.fit, p.profile
    console.print(f"[bold]{prof.name}[/] on [bold]{p.dataset.name}[/]: role [cyan]{p.role}[/]")
    console.print(f"  why: {p.role_reason}")
    console.print(
        f"  model: [bold]{p.spec.label}[/] (largest of {p.considered} {p.role}s that fits)"
    )
    budget = prof.ram_budget_bytes
    console.print(
        f"  params {fmt_count(c.params)}, {c.macs:,} MACs/sample, upload {fmt_bytes(c.upload_bytes)}"
    )
    console.print(
        f"  training memory {fmt_bytes(f.train_bytes)} (batch {f.batch_size}, {f.optimizer}) "
        f"of {fmt_bytes(budget)} budget ({100 * f.train_bytes / budget:.0f}%)"
    )
    console.print(
        f"  inference peak {fmt_bytes(c.infer_peak_bytes)}; est. {f.epoch_seconds:.1f} s/epoch "
        f"on {f.samples:,} samples (limit {prof.max_epoch_seconds:.0f} s)"
    )


@app.command("plan")
def plan_cmd(
    profile: str = typer.Option(..., help="Profile name or TOML path."),
    dataset: str = typer.Option("mnist", help="Dataset name."),
    role: str = typer.Option("auto", help="auto | classifier | generator."),
    samples: int | None = typer.Option(None, help="Local shard size (default: train size / 10)."),
    batch_size: int | None = typer.Option(None, help="Override the profile's batch size."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The device's role and the largest model of that role that fits its budget."""
    p = plan(get_profile(profile), dataset_info(dataset), role=role, samples=samples,
             batch_size=batch_size)  # fmt: skip
    if json_out:
        print_json(p.as_dict())
    else:
        print_plan(p)


@app.command("train")
def train_cmd(
    profile: str = typer.Option(..., help="Profile name or TOML path."),
    dataset: str = typer.Option("mnist", help="Dataset name, .npz file or image folder."),
    out: str = typer.Option(
        "uploads", "--out", help="Directory for the artifact <client-id>.onnx."
    ),
    data_dir: str | None = typer.Option(None, help="Folder with standard dataset files."),
    partition: str = typer.Option("dirichlet:0.5", help="iid | dirichlet:ALPHA | classes:K."),
    num_clients: int = typer.Option(10, help="Clients in the federation."),
    client_index: int = typer.Option(0, help="Which client's shard this device holds."),
    partition_seed: int = typer.Option(0, help="Seed of the partition (same for all clients)."),
    model: str | None = typer.Option(
        None, help="Zoo model, e.g. cnn or scnn:width=16 (default: planner)."
    ),
    role: str = typer.Option("auto", help="auto | classifier | generator."),
    epochs: int | None = typer.Option(None, help="Local epochs (default: profile's)."),
    batch_size: int | None = typer.Option(None, help="Batch size (default: profile's)."),
    lr: float | None = typer.Option(None, help="Learning rate (default by role and optimizer)."),
    seed: int = typer.Option(0, help="Local training seed."),
    fed_seed: int = typer.Option(
        0, help="Federation seed: identical initial weights per architecture."
    ),
    quantize: str | None = typer.Option(
        None, help="int8: dynamic int8 quantization of the upload."
    ),
    force: bool = typer.Option(False, help="Train a --model even if it does not fit the profile."),
    client_id: str | None = typer.Option(None, help="Client id (default client-<index>)."),
    search: str | None = typer.Option(
        None, help="pso: search the architecture under the budget (pFedZKD's PSO-FedNAS)."
    ),
    particles: int = typer.Option(6, help="--search: swarm size (quick default; paper: 20)."),
    generations: int = typer.Option(3, help="--search: PSO generations (quick; paper: 10)."),
    candidate_epochs: int = typer.Option(
        1, help="--search: training epochs per candidate (quick; paper: 10)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON summary."),
) -> None:
    """Train the model that fits this device on its local data and write one ONNX upload."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from edgefl.client.run import ClientJob, run_client

    job = ClientJob(
        profile=profile, dataset=dataset, out_dir=out, data_dir=data_dir, partition=partition,
        num_clients=num_clients, client_index=client_index, partition_seed=partition_seed,
        model=model, role=role, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed,
        fed_seed=fed_seed, quantize=quantize, force=force, client_id=client_id, search=search,
        search_options={"particles": particles, "generations": generations,
                        "candidate_epochs": candidate_epochs} if search else None,
    )  # fmt: skip
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(),
        console=console, disable=json_out, transient=False,
    )  # fmt: skip
    task = None

    def on_epoch(epoch: int, total: int, loss: float) -> None:
        nonlocal task
        if task is None:
            task = progress.add_task("training", total=total, loss="-")
        progress.update(task, completed=epoch, loss=f"{loss:.4f}")

    def on_status(msg: str) -> None:
        if not json_out:
            progress.console.print(f"[dim]{msg}[/]")

    with progress:
        result = run_client(job, on_epoch=on_epoch, on_status=on_status)
    if json_out:
        print_json(result.as_dict())
        return
    s, f, prof = result.summary, result.fit, result.profile
    console.print(
        f"[bold]{result.client_id}[/] ({prof.name}): [cyan]{result.role}[/] {result.spec.label}"
    )
    console.print(
        f"  {costs_line(result)}; training memory {fmt_bytes(f.train_bytes)} of "
        f"{fmt_bytes(prof.ram_budget_bytes)} budget; est. on-device {f.epoch_seconds:.1f} s/epoch"
    )
    metric = (
        f"local val accuracy {100 * s.val_accuracy:.2f}%"
        if s.val_accuracy is not None
        else f"local val loss {s.val_loss:.3f}"
    )
    console.print(
        f"  {s.epochs} epochs, final loss {s.final_loss:.4f}, {metric} ({s.seconds:.1f} s here)"
    )
    if result.quantization:
        q = result.quantization
        line = f"  int8: {fmt_bytes(q['size_before'])} -> {fmt_bytes(q['size_after'])}"
        if "val_accuracy_fp32" in q:
            line += f", val accuracy {100 * q['val_accuracy_fp32']:.2f}% -> {100 * q['val_accuracy_int8']:.2f}%"
        console.print(line)
    console.print(f"  upload: [bold]{result.path}[/] ({fmt_bytes(result.upload_bytes)})")


def costs_line(result) -> str:
    from edgefl.models.cost import costs

    c = costs(result.spec)
    return f"{fmt_count(c.params)} params, {c.macs:,} MACs/sample"


@app.command("sample")
def sample_cmd(
    decoder: str = typer.Argument(..., help="A decoder artifact (.onnx)."),
    per_class: int = typer.Option(8, help="Images per class (one row per class)."),
    out: str = typer.Option("samples.png", "--out", help="PNG file to write."),
    seed: int = typer.Option(0, help="Seed of the latent draws."),
) -> None:
    """A picture of what a decoder generates, one row per class."""
    from edgefl.client.sample import sample_grid

    path = sample_grid(decoder, per_class=per_class, out=out, seed=seed)
    console.print(f"wrote {path}")
