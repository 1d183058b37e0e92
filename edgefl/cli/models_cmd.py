"""`edgefl models`: the zoo with exact costs, and with a profile whether each model fits."""

from __future__ import annotations

import typer
from rich.markup import escape

from edgefl.cli.common import check_counts, console, fmt_bytes, fmt_count, print_json
from edgefl.cli.wide_tables import Col, fitted
from edgefl.data.registry import dataset_info
from edgefl.profiles import get_profile


def register(app: typer.Typer) -> None:
    app.command("models")(models_cmd)


def models_cmd(
    dataset: str = typer.Option("mnist", help="Dataset whose input shape and classes to use."),
    profile: str | None = typer.Option(
        None, help="Profile name or TOML path to check fit against."
    ),
    batch_size: int | None = typer.Option(
        None, help="Training batch size (default: profile's, or 64)."
    ),
    samples: int | None = typer.Option(None, help="Local shard size for epoch-time estimates."),
    ladder: bool = typer.Option(False, help="Also list every size of the scalable families."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Every zoo model with params, MACs, FLOPs, weight bytes, inference peak and training memory."""
    # torch (through the cost model) only when the command runs: every other command's start,
    # and --help, would otherwise wait a second for it.
    from edgefl.models.plan import default_samples

    check_counts(batch_size=batch_size, samples=samples)
    if samples is not None and not profile:  # epochs are timed on a profile's compute only
        from edgefl.errors import ConfigError

        raise ConfigError(
            "--samples sizes the epoch-time estimate, which needs a device: without --profile "
            "it would change nothing",
            hint="add --profile NAME (e.g. --profile wristband), or drop --samples",
        )
    info = dataset_info(dataset)
    prof = get_profile(profile) if profile else None
    batch = batch_size or (prof.batch_size if prof else 64)
    optimizer = prof.optimizer if prof else "adam"
    n = samples or default_samples(info)
    rows = [_model_row(spec, batch, optimizer, prof, n) for spec in _zoo_specs(info, ladder)]
    if json_out:
        print_json([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows])
        return
    _print_models(rows, info, batch, optimizer, prof)


def _zoo_specs(info, ladder: bool) -> list:
    """The zoo's models for this dataset's inputs; with --ladder every size of a family."""
    from edgefl.models.zoo import ZOO, candidate_specs, input_kind, make_spec

    specs = []
    for entry in ZOO:
        if input_kind(info.input_shape) not in entry.inputs:
            continue  # an image model on sensor windows, or the other way round
        if ladder and entry.ladder:
            specs += [
                s
                for s in candidate_specs(info.input_shape, info.num_classes, entry.role)
                if s.name == entry.name
            ]
        else:
            specs.append(make_spec(entry.name, info.input_shape, info.num_classes))
    return specs


def _model_row(spec, batch: int, optimizer: str, prof, n: int) -> dict:
    """One model's costs (and with a profile, its fit) as --json prints them; `_short`, the
    fit's short reasons, only for the table."""
    from edgefl.models.cost import ORT_FLOOR_BYTES, costs
    from edgefl.models.plan import check_fit, runtimes_that_fit
    from edgefl.models.zoo import spec_label

    c = costs(spec)
    row = {
        "name": spec_label(spec),
        "role": c.role,
        "params": c.params,
        "macs": c.macs,
        "flops": c.flops,
        "weight_bytes": c.weight_bytes,
        "weight_bytes_int8": c.weight_bytes_int8,
        "upload_bytes": c.upload_bytes,
        "upload_weight_bytes": c.upload_weight_bytes,
        "infer_peak_bytes": c.infer_peak_bytes,
        "tflm_arena_bytes": c.tflm_arena_bytes,
        "onnxruntime_bytes": ORT_FLOOR_BYTES + c.infer_peak_bytes,
        "train_bytes": c.train_bytes(batch, optimizer),
        "batch_size": batch,
        "optimizer": optimizer,
        "spec": spec.to_dict(),
    }
    if prof:
        fit = check_fit(spec, prof, samples=n, batch_size=batch)
        row.update(
            fits=fit.fits,
            reasons=list(fit.reasons),
            epoch_seconds=fit.epoch_seconds,
            runs_in=runtimes_that_fit(c, prof),
        )
        row["_short"] = _fit_text(fit.short)
    return row


def _fit_text(short: tuple[str, ...]) -> str:
    """A misfit in one line: the budget it overshoots most, and how many more it overshoots
    ("train x1298 +3"); --json has every reason in full. "" for a model that fits."""
    if not short:
        return ""
    ratios = [float(s.rsplit(" x", 1)[1]) for s in short]
    worst = max(range(len(short)), key=ratios.__getitem__)
    tag, ratio = short[worst].rsplit(" x", 1)
    # A large ratio needs no decimals (x1298); a near miss keeps them (x1.004 still misfits).
    shown = f"x{float(ratio):.0f}" if float(ratio) >= 10 else f"x{ratio}"
    more = f" +{len(short) - 1}" if len(short) > 1 else ""
    return f"{tag} {shown}{more}"


# What each budget's tag in the fits column stands for.
_BUDGETS = {"train": "training memory", "infer": "inference memory", "storage": "storage",
            "time": "epoch time"}  # fmt: skip


def _legend(rows: list[dict]) -> str | None:
    """The fits column read out on one of its own misfits (one that overshoots several budgets
    where there is one): 'no: train x1772 +3 = needs 1772 times its training memory ...'."""
    misfits = [r["_short"] for r in rows if not r["fits"]]
    text = next((t for t in misfits if " +" in t), misfits[0] if misfits else None)
    if text is None:
        return None
    tag, _, rest = text.partition(" x")
    ratio, _, more = rest.partition(" +")
    said = f"no: {text} = needs {ratio} times its {_BUDGETS.get(tag, tag)} budget"
    said += " (the one it overshoots most)" + (f" and overshoots {more} more" if more else "")
    return said + "; --json gives every reason in full"


def _model_cells(r: dict, prof) -> list[str]:
    row = [
        escape(r["name"]),
        r["role"],
        fmt_count(r["params"]),
        f"{r['macs']:,}",
        fmt_count(r["flops"]),
        fmt_bytes(r["weight_bytes"]),
        fmt_bytes(r["weight_bytes_int8"]),
        fmt_bytes(r["upload_bytes"]),
        fmt_bytes(r["infer_peak_bytes"]),
        fmt_bytes(r["tflm_arena_bytes"]),
        fmt_bytes(r["train_bytes"]),
    ]
    if prof:
        row.append(f"{r['epoch_seconds']:.1f}s")
        row.append(", ".join(r["runs_in"]) or "[red]none[/]")
        row.append("[green]yes[/]" if r["fits"] else f"[red]no[/]: {escape(r.pop('_short'))}")
    return row


def _print_models(rows: list[dict], info, batch: int, optimizer: str, prof) -> None:
    from edgefl.models.cost import ORT_FLOOR_BYTES

    title = f"Model zoo on {info.name} {info.input_shape}, {info.num_classes} classes"
    title += f" (training: batch {batch}, {optimizer})"
    cols = [
        Col("model", right=False),
        Col("role", right=False, drop=3),
        Col("params"),
        Col("MACs"),
        Col("FLOPs", drop=11),
        Col("weights", drop=9),
        Col("int8", drop=10),
        Col("upload", drop=6),
        Col("infer peak", drop=4),
        Col("TFLM arena", drop=7),
        Col("train mem"),
    ]
    legend = _legend(rows) if prof else None
    if prof:
        cols += [
            Col("epoch", drop=5),
            Col("runs in", right=False, drop=8),
            Col(f"fits {escape(prof.name)}", right=False),  # a profile's name is the user's text
        ]
    cells = [_model_cells(r, prof) for r in rows]
    table = fitted(
        cols,
        cells,
        console.width,
        title=title,
        caption="MACs: multiply-accumulates per sample (thop convention); "
        "FLOPs = 2 x conv/linear MACs; upload: the ONNX file `client train` writes; "
        "infer peak: fp32 weights + largest step; TFLM arena: TFLite Micro's int8 "
        f"arena, weights in flash; runs in: onnxruntime needs "
        f"{ORT_FLOOR_BYTES / 2**20:.1f} MiB + infer peak",
    )
    console.print(table)
    if legend:
        console.print(f"[dim]{escape(legend)}[/]")
