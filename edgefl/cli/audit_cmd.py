"""`edgefl audit UPLOAD...`: membership inference against one's own uploads (edgefl.client.audit)."""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import typer
from rich.table import Table

from edgefl import __version__
from edgefl.cli.common import (
    QUIET,
    applies_only_with,
    check_data_dir,
    console,
    print_json,
    upload_text,
)
from edgefl.errors import ConfigError
from edgefl.outputs import lock_outputs

REPORT_KEY = "edgefl_audit"  # what marks a JSON file as an audit report (--out replaces only one)


def register(app: typer.Typer) -> None:
    app.command("audit")(audit_cmd)


def _check_kinds(ctx: typer.Context, kinds: set[str]) -> None:
    """Each attack's options act on its kind of upload only: given for uploads of none of that
    kind, they were passed over."""
    for name in ("reference", "restarts", "steps", "draws"):
        flag = "--[no-]reference" if name == "reference" else f"--{name}"
        applies_only_with(ctx, name, "decoder uploads", "decoder" in kinds, flag=flag,
                          hint=f"drop {flag}, or audit a decoder upload")  # fmt: skip
    applies_only_with(ctx, "shadows", "classifier uploads", "classifier" in kinds,
                      hint="drop --shadows, or audit a classifier upload")  # fmt: skip


def audit_cmd(
    ctx: typer.Context,
    uploads: list[str] = typer.Argument(..., help="Classifier or decoder uploads (.onnx)."),
    data_dir: str | None = typer.Option(None, help="Folder with standard dataset files."),
    dataset: str | None = typer.Option(
        None, help="The data the clients trained on (default: the dataset each upload names)."
    ),
    queries: int = typer.Option(1000, help="Members queried (at most; as many non-members)."),
    nonmembers: str = typer.Option(
        "population",
        help="population: other clients' samples with the members' class counts; held-out: the "
        "client's own validation split (sensor windows overlap theirs: an upper bound).",
    ),
    shadows: int = typer.Option(
        4, help="Classifiers: LiRA's shadow models, trained as the upload was (0: none)."
    ),
    reference: bool = typer.Option(
        True, help="Decoders: train a reference decoder to calibrate the distances."
    ),
    restarts: int = typer.Option(4, help="Decoders: latent starts per reconstruction."),
    steps: int = typer.Option(100, help="Decoders: Adam steps per reconstruction start."),
    draws: int = typer.Option(2000, help="Decoders: samples per class (sample distance)."),
    seed: int = typer.Option(0, help="Seed of the queries, the attacker's models, the bootstrap."),
    out: str | None = typer.Option(None, help="Also write the report (JSON) to this file."),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Replace an --out that holds another audit (of other uploads) or another file; "
        "a rerun on the same uploads replaces its own report without it.",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    quiet: bool = QUIET,
) -> None:
    """Membership inference against uploads: how well an attacker holding an upload tells the
    samples it was trained on from samples it never saw (AUC, TPR at 1% and 0.1% FPR, 95%
    bootstrap intervals)."""
    from edgefl.cli.progress import reporter
    from edgefl.client.audit import AuditSettings, open_target, prepare, run_audit

    settings = AuditSettings(
        queries=queries,
        nonmembers=nonmembers,
        shadows=shadows,
        reference=reference,
        restarts=restarts,
        steps=steps,
        draws=draws,
        seed=seed,
    )
    _check_distinct(uploads)
    if dataset is not None:  # without it each upload names a registered dataset
        check_data_dir(data_dir, {"--dataset": dataset})
    if out is not None:
        _check_out(ctx, Path(out), uploads, overwrite)
    targets = [open_target(path, data_dir, dataset) for path in uploads]  # every check first
    _check_kinds(ctx, {t.upload.kind for t in targets})
    queries = [prepare(target, settings) for target in targets]
    start = time.perf_counter()
    results = []
    with reporter(quiet) as report:
        for i, target in enumerate(targets):
            report.message(f"auditing {target.path} ({i + 1}/{len(targets)})")
            results.append(run_audit(target, settings, report, queries[i]))
    result = {
        REPORT_KEY: 1,
        "command": shlex.join(["edgefl", *sys.argv[1:]]) if sys.argv[1:2] == ["audit"] else None,
        "edgefl_version": __version__,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "settings": asdict(settings),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": round(time.perf_counter() - start, 1),
        "uploads": results,
    }
    if out:
        import exporters

        exporters.atomic_write_text(out, json.dumps(result, indent=1) + "\n")
    if json_out:
        print_json(result)
    elif not quiet:
        for r in results:
            _print(r)
        if out:
            console.print(f"report: {upload_text(out)}")


def _check_distinct(uploads: list[str]) -> None:
    """Each upload once: the same file named twice (or by two paths) was audited twice."""
    from edgefl.progress import printable

    seen: dict[Path, str] = {}
    for name in uploads:
        key = Path(name).resolve()
        if key in seen:
            raise ConfigError(
                f"{printable(name)} is the upload {printable(seen[key])} again",
                hint="name each upload once",
            )
        seen[key] = name


def _check_out(ctx: typer.Context, path: Path, uploads: list[str], overwrite: bool) -> None:
    """--out may be created, or replaced by a rerun on the same uploads (an audit of others,
    or any other file, only with --overwrite). Held from here to the write: a second audit to
    the same --out stops at once."""
    from edgefl.outputs import check_writable, replacing_error
    from edgefl.progress import printable

    if not str(path) or str(path) == ".":
        raise ConfigError("--out names no file", hint="e.g. --out audit.json")
    check_writable(path, "--out", "audit.json")
    ctx.with_resource(lock_outputs([path]))
    if overwrite or not path.exists():
        return
    named = [n for n in _audited(path) if isinstance(n, str)]
    theirs = sorted(str(Path(n).resolve()) for n in named)
    if theirs != sorted(str(Path(u).resolve()) for u in uploads):
        what = ", ".join(printable(Path(n).name) for n in named)
        raise replacing_error(path, "--out", f"the audit of other uploads ({what or 'none'})")


def _audited(path: Path) -> list:
    """The uploads the audit report at `path` names; refused if it is not one."""
    from edgefl.outputs import existing_result

    held = existing_result(path)
    rows = held.get("uploads") if held and REPORT_KEY in held else None
    if not isinstance(rows, list):
        raise ConfigError(
            f"--out {path} exists and is not an audit report",
            hint="name a new file, e.g. --out audit.json, or pass --overwrite to replace it",
        )
    return [r.get("upload") for r in rows if isinstance(r, dict)]


def _ci(value: float, ci) -> str:
    return f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def _print(r: dict) -> None:
    console.print(
        f"[bold]{upload_text(r['upload'])}[/] ({r['kind']} {upload_text(r['model'] or '')}, "
        f"client {upload_text(r['client_id'])}, {upload_text(r['dataset'])}): "
        f"{upload_text(r['privacy'])}"
    )
    console.print(
        f"  members: {r['members']} of the {r['trained_on']} samples it trained on; "
        f"non-members: {upload_text(r['nonmember_source'])}"
    )
    if r["accuracy"]:
        acc = r["accuracy"]
        console.print(
            f"  accuracy: members {100 * acc['members']:.1f}%, non-members "
            f"{100 * acc['nonmembers']:.1f}%"
        )
    table = Table(show_header=True)
    for column in ("attack", "AUC [95% CI]", "TPR@1%FPR", "TPR@0.1%FPR"):
        table.add_column(column)
    for row in r["attacks"]:
        tpr = {k: _ci(row["tpr"][k], row["tpr_ci"][k]) for k in row["tpr"]}
        table.add_row(
            row["attack"],
            _ci(row["auc"], row["auc_ci"]),
            tpr.get("0.01", "-"),
            tpr.get("0.001", "-"),
        )
    console.print(table)
    for line in r["skipped"]:
        console.print(f"  not run: {upload_text(line)}")
    if r["label_counts"] == "exact":
        console.print("  label counts: exact (the client's class histogram, released as is)")
