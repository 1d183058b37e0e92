"""`edgefl profile list|show`."""

from __future__ import annotations

import typer
from rich.markup import escape

from edgefl.cli.common import console, fmt_bytes, fmt_count, print_json
from edgefl.cli.wide_tables import Col, fitted
from edgefl.profiles import get_profile, list_profiles

app = typer.Typer(
    help="Device budget profiles (built in, or your own TOML).",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@app.command("list")
def list_cmd(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the built-in device profiles."""
    profiles = [get_profile(n) for n in list_profiles()]
    if json_out:
        print_json([p.as_dict() for p in profiles])
        return
    # One word a header: with a one-blank divider at 80 columns, two-word headers side by side
    # read as one ("RAM for learning" over two columns); the caption spells out the short ones.
    cols = [
        Col("name", right=False),
        Col("RAM"),
        Col("budget"),
        Col("storage", drop=2),
        Col("MAC/s"),
        Col("optimizer", right=False, drop=1),
        Col("batch"),
    ]
    rows = [
        [
            escape(p.name),
            fmt_bytes(p.ram_bytes),
            fmt_bytes(p.ram_budget_bytes),
            fmt_bytes(p.storage_bytes),
            fmt_count(p.macs_per_second),
            p.optimizer,
            str(p.batch_size),
        ]
        for p in profiles
    ]
    table = fitted(
        cols,
        rows,
        console.width,
        title="Built-in device profiles",
        caption="budget: the RAM learning may use (RAM x its available fraction); "
        "MAC/s: sustained multiply-accumulates a second; batch: training batch",
    )
    console.print(table)


@app.command("show")
def show_cmd(
    profile: str = typer.Argument(..., help="Built-in name or path to a TOML file."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one profile (validating it)."""
    p = get_profile(profile)
    if json_out:
        print_json(p.as_dict())
        return
    console.print(
        f"[bold]{escape(p.name)}[/]: {escape(p.description)}  [dim]({escape(str(p.source))})[/]"
    )
    console.print(
        f"  RAM {fmt_bytes(p.ram_bytes)} x {p.ram_available_fraction} = "
        f"{fmt_bytes(p.ram_budget_bytes)} for learning; storage {fmt_bytes(p.storage_bytes)}; "
        f"{fmt_count(p.macs_per_second)} MAC/s sustained"
    )
    console.print(
        f"  training: {p.optimizer}, batch {p.batch_size}, {p.epochs} epochs"
        + (f" (more on a small shard: at least {p.min_steps} steps)" if p.min_steps else "")
        + f", at most {p.max_epoch_seconds:.0f} s per epoch"
    )
