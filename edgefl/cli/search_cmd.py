"""`edgefl search`: PSO-FedNAS alone, on one client's shard, under a device profile's budget."""

from __future__ import annotations

import json
import shlex

import typer
from rich.markup import escape
from rich.table import Table

from edgefl.cli.common import (
    MAKES_FOLDERS,
    QUIET,
    applies_only_with,
    check_counts,
    check_data_dir,
    console,
    fmt_bytes,
    fmt_count,
    given,
    print_json,
)
from edgefl.cli.progress import reporter
from edgefl.errors import ConfigError


def register(root: typer.Typer) -> None:
    root.command("search")(search_cmd)


def _saved_by_search(searched: dict):
    """Whether a record is a spec an earlier `edgefl search --save` wrote for the same search
    (profile, dataset, shard), which a rerun replaces; a spec searched for another device or
    data, or anything else, is kept unless --overwrite. Specs saved before the record: any."""

    def own(made: dict) -> bool:
        keys = {"name", "input_shape", "num_classes", "params", "searched"}
        record = made.get("searched", searched)
        # a record saved before it named the partition seed: the keys it has
        same = isinstance(record, dict) and set(record) <= set(searched)
        same = same and all(searched[k] == v for k, v in record.items())
        return made.get("name") == "nas-cnn" and set(made) <= keys and same

    return own


def _check_applies(ctx: typer.Context, save: str | None, json_out: bool, quiet: bool) -> None:
    """--overwrite acts with --save only, --top on the printed table only, --data-dir on a
    registered dataset only."""
    applies_only_with(ctx, "overwrite", "--save", save is not None)
    check_data_dir(ctx.params["data_dir"], {"--dataset": ctx.params["dataset"]})
    shown = "--json" if json_out else "-q" if quiet else None
    if shown and given(ctx, "top"):
        raise ConfigError(f"--top sizes the candidate table, which {shown} does not print",
                          hint=f"drop --top, or {shown}")  # fmt: skip


def search_cmd(
    ctx: typer.Context,
    profile: str = typer.Option(..., help="Profile name or TOML path: the hard budget."),
    dataset: str = typer.Option("mnist", help="Dataset name, .npz file or image folder."),
    data_dir: str | None = typer.Option(None, help="Folder with standard dataset files."),
    partition: str = typer.Option(
        "dirichlet:0.5",
        help="iid | dirichlet:ALPHA | classes:K | user[:ID,ID,...] (one client per user: hapt).",
    ),
    num_clients: int = typer.Option(10, help="Clients in the federation."),
    client_index: int = typer.Option(0, help="Which client's shard to search on."),
    partition_seed: int = typer.Option(0, help="Seed of the partition."),
    particles: int = typer.Option(
        20, help="Swarm size (paper: 20; with --generations at most 10,000 candidates in all)."
    ),
    generations: int = typer.Option(
        10, help="PSO generations after the initial swarm (paper: 10)."
    ),
    candidate_epochs: int = typer.Option(
        1, help="Training epochs per candidate (paper: 10; 1 keeps a CPU search in minutes)."
    ),
    fitness_samples: int | None = typer.Option(
        None, help="Train candidates on at most this many local samples (default: all)."
    ),
    max_macs: int | None = typer.Option(
        None, help="Extra MACs cap on top of the profile (keeps CPU runs fast)."
    ),
    batch_size: int | None = typer.Option(None, help="Batch size (default: profile's)."),
    seed: int = typer.Option(0, help="Seed of the swarm and of candidate training."),
    top: int = typer.Option(15, help="Rows of the candidate table (best fitness first)."),
    json_out: bool = typer.Option(False, "--json", help="Print the whole result as JSON."),
    save: str | None = typer.Option(
        None,
        "--save",
        help="Write the best spec as JSON, for `edgefl client train --spec`." + MAKES_FOLDERS,
    ),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Let --save replace a file that is not a spec this search saved before (the same "
        "profile, dataset and shard replace their own spec without it).",
    ),
    quiet: bool = QUIET,
) -> None:
    """Search a CNN for this device's shard (pFedZKD's PSO-FedNAS); every candidate fits."""
    import exporters
    from edgefl.client.run import ClientJob, search_client
    from edgefl.outputs import check_replace, check_writable, lock_outputs
    from edgefl.search import PSOConfig

    check_counts(top=top, batch_size=batch_size)
    _check_applies(ctx, save, json_out, quiet)
    searched = {
        "profile": profile,
        "dataset": dataset,
        "partition": partition,
        "num_clients": num_clients,
        "client_index": client_index,
        "partition_seed": partition_seed,
    }
    if save is not None:
        check_writable(save, "--save", "best-spec.json")  # before the search, not after it
        ctx.with_resource(lock_outputs([save]))  # to the write: a second search there stops
        check_replace(save, "--save", overwrite, _saved_by_search(searched))

    job = ClientJob(
        profile=profile,
        dataset=dataset,
        data_dir=data_dir,
        partition=partition,
        num_clients=num_clients,
        client_index=client_index,
        partition_seed=partition_seed,
        batch_size=batch_size,
        seed=seed,
    )
    cfg = PSOConfig(
        particles=particles,
        generations=generations,
        candidate_epochs=candidate_epochs,
        fitness_samples=fitness_samples,
        max_macs=max_macs,
    )

    with reporter(quiet) as watch:
        result = search_client(job, cfg, on_status=watch.message, on_progress=watch)
    if save is not None:
        saved = result.spec.to_dict() | {"searched": searched}
        exporters.atomic_write_text(save, json.dumps(saved, sort_keys=True) + "\n")
    if json_out:
        print_json(result.as_dict() | ({"saved": save} if save else {}))
        return
    if quiet:
        return
    _print_best(result)
    console.print(_candidate_table(result, top))
    console.print(f"spec: {result.spec.to_json()}", markup=False)
    if save is not None:
        # The shard it was searched on, named: without them the command trained client 0 of 10.
        command = ["edgefl", "client", "train", "--profile", profile, "--dataset", dataset]
        command += ["--partition", partition, "--num-clients", str(num_clients)]
        command += ["--client-index", str(client_index), "--partition-seed", str(partition_seed)]
        command += ["--spec", str(save)] + (["--data-dir", data_dir] if data_dir else [])
        console.print(f"wrote {save}: train it with `{shlex.join(command)}`", markup=False)


def _print_best(result) -> None:
    from edgefl.models.cost import costs

    best, c, b = result.best, costs(result.spec), result.budget
    ram = b["ram_budget_bytes"]
    console.print(
        f"[bold]best architecture[/] ({escape(result.profile.name)}): [cyan]{escape(str(best.arch))}[/]"
    )
    console.print(
        f"  val accuracy {100 * best.val_accuracy:.2f}%, val CE {best.fitness:.4f}; "
        f"{fmt_count(c.params)} params, {c.macs:,} MACs/sample"
    )
    console.print(
        f"  training memory {fmt_bytes(best.train_bytes)} (batch {b['batch_size']}, "
        f"{b['optimizer']}) and inference peak {fmt_bytes(best.infer_bytes)} of "
        f"{fmt_bytes(ram)} budget; est. {result.history[-1]['epoch_seconds']:.1f} s/epoch "
        f"(limit {b['max_epoch_seconds']:.0f} s)"
    )
    console.print(
        f"  {len(result.candidates)} architectures trained ({result.evaluations} evaluations) "
        f"in {result.seconds:.1f} s"
    )


def _candidate_table(result, top: int) -> Table:
    table = Table(title="Candidates: accuracy vs MACs (best fitness first)")
    for col in ("gen", "architecture", "MACs", "params", "train mem", "val acc", "val CE"):
        table.add_column(col, justify="left" if col == "architecture" else "right")
    for cand in sorted(result.candidates, key=lambda x: x.fitness)[:top]:
        table.add_row(
            str(cand.generation),
            cand.arch,
            f"{cand.macs:,}",
            fmt_count(cand.params),
            fmt_bytes(cand.train_bytes),
            f"{100 * cand.val_accuracy:.1f}%",
            f"{cand.fitness:.4f}",
        )
    return table
