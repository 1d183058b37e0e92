"""`edgefl eval MODEL.onnx --dataset D`: top-1 and per-class accuracy through onnxruntime."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from edgefl.cli.common import check_data_dir, console, err_console, print_json, upload_text


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_cmd)


MODEL_HINT = "pass a classifier or global model (.onnx), e.g. one `server fuse` wrote"


def _split_of(dataset: str, split: str | None) -> tuple[str, str]:
    """(dataset name, split): named once, in --dataset NAME:SPLIT or --split (default test)."""
    from edgefl.data import parse_dataset_ref
    from edgefl.errors import ConfigError

    name, ref_split = parse_dataset_ref(dataset)
    if ref_split and split and ref_split != split:  # which one was meant is not ours to guess
        raise ConfigError(
            f"--dataset {dataset} names split {ref_split!r} but --split says {split!r}",
            hint=f"name the split once, e.g. --dataset {name}:{split} or --split {ref_split}",
        )
    return name, ref_split or split or "test"


def _read_model(model: str):
    """The model file as an artifact, or one message with the fix."""
    from pathlib import Path

    import exporters
    from edgefl.errors import ArtifactError

    if not Path(model).is_file():
        raise ArtifactError(f"model file {model} not found", hint=MODEL_HINT)
    try:
        art = exporters.read_artifact(model, require_metadata=False)
    except Exception as exc:  # onnx raises DecodeError and friends for non-ONNX bytes
        raise ArtifactError(
            f"{model} is not a readable ONNX model ({type(exc).__name__})", hint=MODEL_HINT
        ) from None
    # An empty file parses as an empty graph (an edgefl data upload is one too: said later).
    if not art.metadata and not (art.input_names and art.output_names):
        raise ArtifactError(f"{model} is not an ONNX model (no inputs or outputs)", hint=MODEL_HINT)
    return art


def eval_cmd(
    model: str = typer.Argument(..., help="A classifier or global model (.onnx)."),
    dataset: str = typer.Option(..., help="Dataset name or file, optionally NAME:SPLIT."),
    split: str | None = typer.Option(
        None, help="Split to evaluate on (default: test; or name it in --dataset, NAME:SPLIT)."
    ),
    data_dir: str | None = typer.Option(None, help="Folder with standard dataset files."),
    plot: str | None = typer.Option(None, help="Save a confusion-matrix PNG here."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Accuracy of an ONNX model on a dataset split."""
    from pathlib import Path

    from edgefl.evaluate import evaluate_artifact, other_dataset
    from edgefl.outputs import check_png_out

    name, split = _split_of(dataset, split)
    check_data_dir(data_dir, {"--dataset": name})
    if plot:
        check_png_out(plot, "--plot", "confusion.png")  # before the evaluation, not after
    art = _read_model(model)
    res = evaluate_artifact(art, name, split, data_dir=data_dir)
    own = other_dataset(art, name)
    if own:
        err_console.print(
            f"[yellow]warning[/] the model was trained on {upload_text(own)}, scored here on "
            f"{escape(name)} (its class names are {upload_text(own)}'s)"
        )
    names = (
        art.metadata.get("class_names")
        or res.class_names
        or [str(i) for i in range(len(res.per_class))]
    )
    if plot:
        from edgefl.plots import plot_confusion

        plot = str(
            plot_confusion(
                res.confusion,
                plot,
                title=f"{Path(model).name} on {res.dataset}:{res.split}",
                class_names=names,
            )
        )
    if json_out:
        print_json(res.as_dict() | ({"plot": plot} if plot else {}))
        return
    console.print(
        f"[bold]{upload_text(Path(model).name)}[/] on {upload_text(res.dataset)}:{res.split} "
        f"({res.samples:,} samples): "
        f"top-1 [bold]{100 * res.accuracy:.2f}%[/]"
    )
    table = Table(show_header=True)
    table.add_column("class")
    table.add_column("accuracy", justify="right")
    for n, a in zip(names, res.per_class, strict=False):
        table.add_row(upload_text(n), f"{100 * a:.2f}%")  # a model's class names are data
    console.print(table)
    if plot:
        console.print(f"confusion matrix: {escape(plot)}")
