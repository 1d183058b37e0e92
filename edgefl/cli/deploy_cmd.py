"""`edgefl deploy MODEL.onnx --profile P --target T --out DIR`: what a device class runs."""

from __future__ import annotations

import time

import typer
from rich.markup import escape

from edgefl.cli.common import (
    QUIET,
    applies_only_with,
    check_counts,
    check_data_dir,
    console,
    err_console,
    print_json,
    upload_text,
)


def register(app: typer.Typer) -> None:
    app.command("deploy")(deploy_cmd)


def deploy_cmd(
    ctx: typer.Context,
    model: str = typer.Argument(..., help="A classifier or global model edgefl wrote (.onnx)."),
    profile: str = typer.Option(..., help="Device profile name or TOML file it is made for."),
    target: str = typer.Option(..., help="onnx | ort-mobile | tflite-micro"),
    out: str = typer.Option(..., help="Folder the deployed files are written into."),
    calibrate: str | None = typer.Option(
        None, help="DATASET:SPLIT for int8 calibration (tflite-micro, --quantize int8)."
    ),
    eval_ref: str | None = typer.Option(
        None,
        "--eval",
        help="DATASET[:SPLIT]: accuracy of the deployed file vs the fp32 model (split: test).",
    ),
    quantize: str | None = typer.Option(None, help="int8: static QDQ int8 (onnx, ort-mobile)."),
    data_dir: str | None = typer.Option(None, help="Folder with standard dataset files."),
    eval_samples: int = typer.Option(1000, help="At most this many --eval samples."),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Replace files of this name in --out that were deployed from another model (or "
        "that no deploy made); a redeploy of the same model replaces its own without it.",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    quiet: bool = QUIET,
) -> None:
    """Convert a classifier for a device class's runtime, measure it there, and prove it fits."""
    from edgefl.deploy import DeployRequest, deploy

    check_counts(eval_samples=eval_samples)
    applies_only_with(ctx, "eval_samples", "--eval DATASET[:SPLIT]", eval_ref is not None)
    check_data_dir(data_dir, {"--calibrate": calibrate, "--eval": eval_ref}, "--calibrate or "
                   "--eval", hint="add --eval DATASET[:SPLIT], or drop --data-dir")  # fmt: skip
    start = time.perf_counter()

    def status(message: str) -> None:
        if not quiet:
            err_console.print(f"[dim]{time.perf_counter() - start:6.1f}s[/] {escape(message)}")

    req = DeployRequest(
        model=model,
        profile=profile,
        target=target,
        out=out,
        calibrate=calibrate,
        eval=eval_ref,
        quantize=quantize,
        data_dir=data_dir,
        eval_samples=eval_samples,
        overwrite=overwrite,
    )
    report = deploy(req, status=status)
    if json_out:
        print_json(report.as_dict())
        return
    if quiet:
        return
    for line in report.lines():
        console.print(upload_text(line), soft_wrap=True)
