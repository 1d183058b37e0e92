"""`edgefl server fuse|methods`."""

from __future__ import annotations

from contextlib import nullcontext

import typer
from rich.table import Table

from edgefl.cli.common import console, fmt_bytes, print_json

app = typer.Typer(help="Validate uploads and fuse them into a global model.", no_args_is_help=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="server")


def _parse_opts(items: list[str]) -> dict:
    from edgefl.client.run import _parse_value
    from edgefl.errors import ConfigError

    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"--opt expects key=value, got {item!r}")
        out[key.strip().replace("-", "_")] = _parse_value(value.strip())
    return out


@app.command("fuse")
def fuse_cmd(
    uploads: str = typer.Argument(..., help="Directory of client uploads (*.onnx); only read."),
    method: str = typer.Option(..., help="Fusion method (see `edgefl server methods`)."),
    out: str = typer.Option("global.onnx", "--out", help="Global model path (.onnx)."),
    device: str = typer.Option("auto", help="auto | cpu | cuda."),
    eval_ref: str | None = typer.Option(None, "--eval", help="Evaluate on DATASET[:SPLIT]."),
    data_dir: str | None = typer.Option(None, help="Folder with standard dataset files."),
    synthetic: int | None = typer.Option(None, help="Synthetic samples to generate."),
    epochs: int | None = typer.Option(None, help="Global training epochs."),
    lr: float | None = typer.Option(None, help="Global learning rate."),
    batch_size: int | None = typer.Option(None, help="Global batch size."),
    seed: int | None = typer.Option(None, help="Seed (default 0)."),
    student: str | None = typer.Option(
        None, help="Zoo architecture of a freshly trained global model."
    ),
    keep_ratio: float | None = typer.Option(
        None, help="FedMHO: share kept per class by the filter."
    ),
    lam: float | None = typer.Option(None, help="FedMHO-MD/SD: weight of CE vs distillation."),
    opt: list[str] = typer.Option(
        [], "--opt", help="Other method option as key=value (repeatable)."
    ),
    strict: bool = typer.Option(False, help="Abort if any upload is rejected."),
    max_upload_bytes: int | None = typer.Option(
        None, help="Refuse uploads larger than this (default 512 MiB: VGG-9 is 277 MB)."
    ),
    report: str | None = typer.Option(None, help="Report JSON path (default: <out>.json)."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Validate every upload, fuse the usable ones with METHOD, export the global model."""
    from edgefl.server.fuse import FuseJob, run_fuse

    flags = dict(synthetic=synthetic, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed,
                 student=student, keep_ratio=keep_ratio, lam=lam)  # fmt: skip
    options = {k: v for k, v in flags.items() if v is not None} | _parse_opts(opt)
    cap = {} if max_upload_bytes is None else {"max_upload_bytes": max_upload_bytes}
    job = FuseJob(uploads=uploads, method=method, out=out, options=options, device=device,
                  eval=eval_ref, data_dir=data_dir, strict=strict, report=report,
                  **cap)  # fmt: skip
    with (
        console.status(f"fusing with {method}...", spinner="dots")
        if not json_out
        else nullcontext()
    ):
        rep = run_fuse(job, log=None if json_out else (lambda m: console.print(f"[dim]{m}[/]")))
    if json_out:
        print_json(rep)
        return
    console.print(f"[bold]{rep['method']}[/] ({rep['paper']}) on {rep['device']}")
    console.print(f"  used {len(rep['used'])} upload(s): {', '.join(rep['used'])}")
    for r in rep["rejected"]:
        console.print(
            f"  [red]rejected[/] {r['file']}: {r['reason']}", markup=True, highlight=False
        )
    for r in rep["skipped"]:
        console.print(f"  [yellow]skipped[/] {r['file']}: {r['reason']}")
    times = ", ".join(f"{k} {v:.1f}s" for k, v in rep["seconds"].items())
    console.print(f"  stages: {times}")
    if "synthetic_kept_per_class" in rep:
        console.print(f"  synthetic kept per class: {rep['synthetic_kept_per_class']}")
    if "accuracy" in rep:
        console.print(f"  accuracy on {rep['eval']['dataset']}:{rep['eval']['split']}: "
                      f"[bold]{100 * rep['accuracy']:.2f}%[/]")  # fmt: skip
    console.print(f"  global model: {rep['global_model']} ({fmt_bytes(rep['global_bytes'])}); "
                  f"report: {rep['report_path']}")  # fmt: skip


@app.command("methods")
def methods_cmd(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """The fusion methods: description, paper, and the artifact kinds each consumes."""
    from dataclasses import fields

    from edgefl.fusion import METHODS

    rows = [{"name": m.name, "description": m.description, "paper": m.paper,
             "consumes": list(m.consumes), "needs_gradients": m.needs_gradients,
             "options": {f.name: f.default for f in fields(m.config_cls)}} for m in METHODS]  # fmt: skip
    if json_out:
        print_json(rows)
        return
    table = Table(title="Fusion methods")
    for col in ("method", "consumes", "description", "paper"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], ", ".join(r["consumes"]), r["description"], r["paper"])
    console.print(table)
