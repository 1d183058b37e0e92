"""`edgefl reproduce`: a paper's table at a named budget, beside the paper's numbers."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from edgefl.cli.common import MAKES_FOLDERS, applies_only_with, console, print_json
from edgefl.cli.progress import reporter


def register(app: typer.Typer) -> None:
    app.command("reproduce")(reproduce_cmd)


def _ints(text: str | None, flag: str) -> tuple[int, ...] | None:
    from edgefl.errors import ConfigError

    if text is None:
        return None
    try:
        return tuple(int(s) for s in text.split(","))  # "0,,1": an empty one is a typo
    except ValueError:
        raise ConfigError(
            f"{flag} expects comma-separated integers, got {text!r}", hint=f"e.g. {flag} 0,1,2"
        ) from None


def _names(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(s.strip() for s in text.split(",") if s.strip())


def reproduce_cmd(
    ctx: typer.Context,
    table: str | None = typer.Argument(None, help="Table to run; leave out to list them."),
    budget: str = typer.Option(
        "cpu",
        help="cpu (2 cores, under an hour, reductions named) | smoke (minutes: one epoch on a "
        "subset, checks the table runs; not a result) | paper (the paper's own) | code "
        "(the paper's clients, each method's fusion as its authors' code runs it). "
        "`edgefl reproduce` lists each table's.",
    ),
    dataset: str | None = typer.Option(
        None,
        "--dataset",
        help="The table's block for this dataset (e.g. fmnist: the paper's Fashion-MNIST "
        "rows; default: the table's own, mnist). `edgefl reproduce` lists each table's; a "
        "block of another dataset writes its cells in another --out.",
    ),
    out: str = typer.Option(
        "runs/reproduce", "--out", help="Folder for cells and the table." + MAKES_FOLDERS
    ),
    seeds: str | None = typer.Option(None, help="e.g. 0,1,2 (default: the budget's)."),
    partitions: str | None = typer.Option(
        None, help="e.g. dirichlet:0.5,dirichlet:0.1 (default: the budget's)."
    ),
    federation: str = typer.Option(
        "own",
        help="own: each method in its paper's client setting; a setting's name (e.g. "
        "fedmho): every method of the table on that one federation.",
    ),
    methods: str | None = typer.Option(
        None,
        help="Only these rows, e.g. fedmho,fedavg: each runs in its setting, and a setting "
        "none of them is in does not run (default: every method of the table). One cell: "
        "--methods fedmho --partitions dirichlet:0.5 --seeds 0.",
    ),
    jobs: int = typer.Option(1, help="Clients trained in parallel worker processes."),
    device: str = typer.Option("auto", help="Fusion device: auto | cpu | cuda."),
    train_device: str = typer.Option("cpu", help="Client training: cpu | cuda | auto."),
    data_dir: str | None = typer.Option(None, help="Folder with standard dataset files."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Run a paper's table (every setting x partition x seed, resumable) and print our mean +-
    std beside the paper's numbers with the gap; writes table.{json,md,png} into --out."""
    from edgefl.reproduce import TABLES, ReproduceJob, reproduce

    if table is None:
        for name in ctx.params:  # listing reads none of them
            if name not in ("table", "json_out"):
                applies_only_with(ctx, name, "a TABLE", False, hint="name a table, e.g. "
                                  "`edgefl reproduce fedmho-table3 ...`, or drop the option")  # fmt: skip
        return list_tables(TABLES, json_out)
    job = ReproduceJob(
        table=table,
        budget=budget,
        dataset=dataset,
        out=out,
        seeds=_ints(seeds, "--seeds"),
        partitions=_names(partitions) or None,
        federation=federation,
        methods=_names(methods),
        jobs=jobs,
        device=device,
        train_device=train_device,
        data_dir=data_dir,
    )
    # Progress (the table's lines and each cell's own steps, with rates and ETAs) goes to
    # stderr, so stdout holds only the table, or one JSON document under --json.
    with reporter() as watch:
        summary = reproduce(job, log=watch.message, progress=watch)
    if json_out:
        print_json(summary)
    else:
        print_summary(summary)


def list_tables(tables, json_out: bool) -> None:
    if json_out:
        print_json(
            [
                {
                    "name": t.name,
                    "title": t.title,
                    "budgets": list(t.budgets),
                    "datasets": list(t.dataset_names),
                    "settings": [s.name for s in t.settings],
                }
                for t in tables
            ]
        )
        return
    for t in tables:
        console.print(f"[bold]{t.name}[/]: {t.title}")
        console.print(f"  --dataset {', '.join(t.dataset_names)}")
        for s in t.settings:
            models = ", ".join(f"{p} {m}" for p, m in s.models.items())
            console.print(f"  setting {s.name}: {models} -> {', '.join(s.methods)}")
        for b in t.budgets.values():
            console.print(f"  --budget {b.name}: {b.description} ({b.estimate})")


def print_summary(summary: dict) -> None:
    from edgefl.reproduce.render import gap_text, ours_text, paper_text

    b = summary["budget"]
    table = Table(title=f"{summary['title']}, budget {b['name']}")
    table.add_column("method")
    table.add_column("setting")
    for p in summary["partitions"]:
        for col in (f"{p} edgefl", "paper", "gap"):
            table.add_column(col, justify="right")
    for row in summary["rows"]:
        cells = []
        for p in summary["partitions"]:
            c = row["partitions"][p]
            cells += [ours_text(c), paper_text(c), gap_text(c)]
        table.add_row(row["method"], row["setting"], *cells)
    console.print(table)
    for s in summary["settings"]:
        models = ", ".join(f"{p} {m}" for p, m in s["models"].items())
        console.print(f"  setting {s['name']}: {models}")
    for r in b["reductions"]:
        console.print(f"  [yellow]reduced[/]: {r}")
    for n in summary["notes"]:
        console.print(f"  note: {n}")
    out = summary["job"]["out"]
    stem = (
        "table" if summary["federation"] == "own" else f"table-{summary['federation']}-federation"
    )
    console.print(
        f"{escape(str(out))}/{stem}.md, .json and .png; each cell's run in "
        f"{escape(str(out))}/<setting>/"
    )
