"""`edgefl data ...`: list the known datasets and show how a partition splits one among clients."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from edgefl.cli.common import MAKES_FOLDERS, check_data_dir, console, err_console, given, print_json
from edgefl.cli.wide_tables import Col, blocks
from edgefl.errors import ConfigError

app = typer.Typer(help="Datasets and partitions.", no_args_is_help=True, rich_markup_mode=None)

# Beyond this many classes a per-class column table is unreadable; show a summary instead.
MAX_CLASS_COLUMNS = 20


@app.command("list")
def list_datasets(
    data_dir: Path | None = typer.Option(
        None, "--data-dir", help="Also look for file-based datasets in this folder (only it)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the registered datasets: shape, classes, split sizes, and whether each was found and
    where (file-based ones by the search path: --data-dir, else $EDGEFL_DATA_DIR, ./data, then
    /usr/share/datasets/NAME, where system packages put them)."""
    from edgefl.data.locate import unusable_folders
    from edgefl.data.registry import DATASETS

    rows = [_dataset_row(d, data_dir) for d in DATASETS]
    for why in unusable_folders(data_dir):
        err_console.print(f"[yellow]warning[/] {escape(why)}")
    if as_json:
        print_json(rows)
        return
    cols = [
        Col("name", right=False, key=True),
        Col("shape", right=False),
        Col("classes"),
        Col("train"),
        Col("test"),
        Col("found", right=False, wrap=True),
    ]
    cells = [
        [
            r["name"],
            "x".join(map(str, r["input_shape"])),
            str(r["num_classes"]),
            f"{r['train_size']:,}",
            f"{r['test_size']:,}",
            _found_text(r),
        ]
        for r in rows
    ]
    for table in blocks(cols, cells, console.width, title="datasets"):
        console.print(table)
    console.print("user data: a path to an .npz (x, y) or a folder with one sub-folder per class")
    missing = [r for r in rows if not r["found"]]
    if missing:
        packages = "".join(
            f"; {r['name']}: apt-get install {r['package']}" for r in missing if r["package"]
        )
        console.print(
            f"missing: --data-dir DIR or $EDGEFL_DATA_DIR names a folder with the files{packages}"
        )


def _dataset_row(d, data_dir: Path | None) -> dict:
    """One dataset's entry: its shape and sizes, and whether (and where) its files were found."""
    from edgefl.data import locate

    files = locate.file_based(d.name)
    where = locate.find(d.name, data_dir) if files else None
    # a built-in dataset given --data-dir reads that folder or nothing (digits reads no files)
    named = d.builtin and data_dir is not None
    if named and locate.builtin_reads(d.name, data_dir):
        where = Path(data_dir)
    return {
        "name": d.name,
        "input_shape": list(d.input_shape),
        "num_classes": d.num_classes,
        "train_size": d.train_size,
        "test_size": d.test_size,
        "builtin": d.builtin,
        "found": (d.builtin and not named) or where is not None,
        "path": str(where) if where is not None else None,
        "package": d.package or None,
        "looked_in": [str(p) for p in locate.search_path(d.name, data_dir)] if files else [],
        # --data-dir holding some of the files: which it lacks (not "no" alone)
        "lacks": locate.partly_there(d.name, data_dir) if files and data_dir and not where else [],
        "description": d.description,
    }


def _found_text(r: dict) -> str:
    if r["path"]:
        return escape(r["path"])
    if r["builtin"]:
        return "built in" if r["found"] else "no (built in: drop --data-dir)"
    if r["lacks"]:
        return "no: --data-dir lacks " + escape(", ".join(r["lacks"]))
    return f"no ({r['package']})" if r["package"] else "no (--data-dir)"


@app.command("partition")
def partition_cmd(
    ctx: typer.Context,
    dataset: str = typer.Option("mnist", "--dataset", "-d", help="Dataset name or path."),
    num_clients: int = typer.Option(10, "--num-clients", "-k", help="Number of clients."),
    scheme: str = typer.Option(
        "dirichlet:0.5",
        "--partition",
        help="iid, dirichlet:ALPHA, classes:K or user[:ID,ID,...] (one client per user: hapt).",
    ),
    # The flag's old name, kept working but no longer shown: every command says --partition.
    old_scheme: str | None = typer.Option(None, "--scheme", hidden=True),
    seed: int = typer.Option(0, "--seed", help="Random seed of the partition."),
    data_dir: Path | None = typer.Option(
        None, "--data-dir", help="Folder holding the dataset's files."
    ),
    download: bool = typer.Option(
        False,
        "--download",
        help="Fetch missing files with torchvision (needs internet) into --data-dir."
        + MAKES_FOLDERS,
    ),
    plot: Path | None = typer.Option(
        None, "--plot", help="Save a clients x classes heat map PNG." + MAKES_FOLDERS
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Partition a dataset's train split among clients and show each client's label counts."""
    from edgefl.bounds import SEED
    from edgefl.data import parse_scheme

    if old_scheme is not None and given(ctx, "scheme"):
        raise ConfigError("--scheme is --partition's old name: give one of them",
                          hint=f"--partition {old_scheme}")  # fmt: skip
    parsed = parse_scheme(old_scheme or scheme)  # fail on a bad flag before loading any data
    SEED.check("--seed", seed, hint="e.g. --seed 0")
    if plot is not None:
        from edgefl.outputs import check_png_out

        check_png_out(plot, "--plot", "heatmap.png")
    ds, counts, users = _split(dataset, num_clients, parsed, seed, data_dir, download)
    sizes = counts.sum(axis=1)

    saved = None
    if plot is not None:
        from edgefl.data import plot_label_heatmap

        title = f"{ds.name} {parsed}, {num_clients} clients, seed {seed}"
        saved = plot_label_heatmap(counts, plot, ds.class_names, title=title, users=users)
        # Keep stdout pure JSON under --json.
        (err_console if as_json else console).print(f"wrote heat map to {escape(str(saved))}")

    if as_json:
        print_json(
            {
                "dataset": ds.name,
                "scheme": str(parsed),
                "seed": seed,
                "num_clients": num_clients,
                "users": users,
                "class_names": list(ds.class_names),
                "counts": counts,
                "sizes": sizes,
                "plot": None if saved is None else str(saved),
            }
        )
        return
    title = f"{ds.name} train, {parsed}, {num_clients} clients, seed {seed}"
    _print_counts(ds, counts, sizes, users, title)


def _split(dataset: str, num_clients: int, parsed, seed: int, data_dir, download: bool):
    """The train split, its clients x classes label counts, and on a user partition whose
    data each client holds (a draw of users is named, not hidden; None otherwise)."""
    from edgefl.data import client_users, label_count_matrix, load_dataset, partition

    check_data_dir(data_dir, {"--dataset": dataset})
    check_data_dir(download, {"--dataset": dataset}, flag="--download")
    ds = load_dataset(dataset, "train", data_dir=data_dir, download=download)
    parts = partition(ds.y, num_clients, parsed, seed, num_classes=ds.num_classes, groups=ds.groups)
    counts = label_count_matrix(ds.y, parts, ds.num_classes)
    users = client_users(ds.groups, parts) if parsed.kind == "user" else None
    return ds, counts, users


def _count_cells(ds, counts, sizes, users, wide: bool) -> list[list[str]]:
    cells = []
    for i, row in enumerate(counts):
        if wide:
            top = int(row.argmax())
            held = [str(int((row > 0).sum())), f"{escape(str(ds.class_names[top]))} ({row[top]:,})"]
        else:
            held = [str(v) for v in row]
        who = [] if users is None else [str(users[i])]
        cells.append([str(i), *who, *held, f"[bold]{sizes[i]}[/]"])
    return cells


def _print_counts(ds, counts, sizes, users, title: str) -> None:
    import numpy as np

    wide = ds.num_classes > MAX_CLASS_COLUMNS
    headers = ["classes held", "largest class"] if wide else list(ds.class_names)
    # Every count matters: at a narrow width the classes wrap into blocks, never cut to "13…".
    cols = [
        Col("client", key=True),
        *([Col("user", key=True)] if users is not None else []),
        *(Col(escape(str(name))) for name in headers),
        Col("total"),
    ]
    cells = _count_cells(ds, counts, sizes, users, wide)
    for table in blocks(cols, cells, console.width, title=title):
        console.print(table)
    console.print(
        f"{int(sizes.sum()):,} of {len(ds):,} samples assigned; client sizes min {sizes.min():,}, "
        f"median {np.median(sizes):,.0f}, max {sizes.max():,}"
        + ("; --json gives the full matrix" if wide else "")
    )
