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
