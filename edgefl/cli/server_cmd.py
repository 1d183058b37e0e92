"""`edgefl server fuse|methods`. Method options are not defined here: every option a method
declares is a flag (`--lam 0.3`) or an `--opt` (`--opt lam=0.3`, `--opt fedmho-md:lam=0.3`)."""

from __future__ import annotations

import typer
from rich.markup import escape

from edgefl.cli.common import (
    FOR_EPOCHS,
    FOR_MAX_MACS,
    FOR_SAMPLES,
    MAKES_FOLDERS,
    QUIET,
    check_data_dir,
    check_for_flags,
    console,
    distinct_names,
    fmt_bytes,
    print_json,
    print_quiet,
    upload_text,
)
from edgefl.cli.progress import reporter
from edgefl.cli.wide_tables import Col, fitted

app = typer.Typer(
    help="Validate uploads and fuse them into a global model.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="server")


def _extra_flags(args: list[str]) -> list[str]:
    """`--name value` / `--name=value` tokens left over by the parser -> ['name=value', ...]."""
    from edgefl.errors import ConfigError

    items, i = [], 0
    while i < len(args):
        token = args[i]
        if not token.startswith("--") or len(token) < 3:
            raise ConfigError(
                f"unexpected argument {token!r}",
                hint="pass the upload directory once; method options as --name value",
            )
        name, eq, value = token[2:].partition("=")
        if not eq:
            if i + 1 >= len(args):
                raise ConfigError(f"--{name} needs a value", hint=f"e.g. --{name} VALUE")
            value, i = args[i + 1], i + 1
        items.append(f"{name}={value}")
        i += 1
    return items


OPT_FORM = "e.g. --opt lam=0.3 (every chosen method), --opt fedmho:lam=0.3 (one), or --lam 0.3"


def method_options(
    methods: list[str], flags: list[str], opts: list[str], budget: str = "cpu"
) -> dict[str, dict]:
    """Per-method config overrides (edgefl.fusion.layering): the named budget's, then the
    user's. A flag or a plain --opt goes to every chosen method that has the option (an error
    if none has it); `--opt METHOD:key=value` to that method alone."""
    from edgefl.errors import ConfigError
    from edgefl.fusion.layering import given_once, layer, split_items

    what = "the method flags and --opt"
    shared = split_items(flags, what)
    targeted: dict[str, dict[str, str]] = {}
    for item in opts:
        key = item.partition("=")[0]
        if ":" not in key:
            given_once(shared, split_items([item], "--opt", hint=OPT_FORM), what)
            continue
        method, _, kv = item.partition(":")
        if method not in methods:
            raise ConfigError(
                f"--opt {item!r} names {method!r}, which is not among --method {','.join(methods)}",
                hint="name one of the chosen methods, or leave METHOD: out to set it for all",
            )
        given_once(
            targeted.setdefault(method, {}), split_items([kv], "--opt", hint=OPT_FORM), "--opt"
        )
    return layer(methods, budget, shared, targeted)


def _check_data_dir(data_dir: str | None, plans, eval_ref: str | None) -> None:
    """--data-dir is read by --eval and a method's public data only (--for distils on the
    method's own samples or inversions), and by those only where they name a registered
    dataset."""
    refs = {"--eval": eval_ref}
    for p in plans:
        if p.method.public_data and p.config.public_args():
            refs[f"{p.method.name}'s public set"] = p.config.public
    check_data_dir(data_dir, refs, "--eval or a method that reads public data",
                   hint="add --eval DATASET[:SPLIT], or drop --data-dir")  # fmt: skip


@app.command("fuse", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def fuse_cmd(
    ctx: typer.Context,
    uploads: str = typer.Argument(..., help="Directory of client uploads (*.onnx); only read."),
    method: str = typer.Option(
        ...,
        help="Fusion method(s) to run on the uploads, comma-separated (`edgefl server methods`).",
    ),
    out: str | None = typer.Option(
        None,
        "--out",
        help="Global model path (.onnx), one method (default global.onnx)." + MAKES_FOLDERS,
    ),
    out_dir: str | None = typer.Option(
        None, help="Several methods: DIR/METHOD.onnx and DIR/METHOD.json for each." + MAKES_FOLDERS
    ),
    device: str = typer.Option("auto", help="auto | cpu | cuda."),
    eval_ref: str | None = typer.Option(None, "--eval", help="Evaluate on DATASET[:SPLIT]."),
    data_dir: str | None = typer.Option(None, help="Folder with standard dataset files."),
    opt: list[str] = typer.Option(
        [],
        "--opt",
        help="Method option as [METHOD:]key=value (repeatable). Every option is "
        "also a flag: --epochs 5 --lam 0.3. `edgefl server methods METHOD` lists them.",
    ),
    budget: str = typer.Option(
        "cpu",
        help="cpu: defaults 2 cores finish in minutes; paper: the papers' settings (GPU); "
        "code: as the authors' public code runs it (`server methods NAME` compares them).",
    ),
    strict: bool = typer.Option(False, help="Abort if any upload is rejected."),
    max_upload_bytes: int | None = typer.Option(
        None, help="Refuse uploads larger than this (default 512 MiB: VGG-9 is 277 MB)."
    ),
    jobs: int | None = typer.Option(None, help="Uploads ingested at once (default: by the cores)."),
    max_epsilon: float | None = typer.Option(
        None,
        help="Set aside (by name, with the reason) every upload not differentially private as "
        "a whole (trained without --dp, or with exact label counts) or whose epsilon, "
        "recomputed from its privacy record, is above this. An upload whose record "
        "contradicts itself is set aside always.",
    ),
    resident_mib: int | None = typer.Option(
        None,
        help="Hold the checked uploads in memory up to this many MiB of files in all (default "
        "1024); past it each is parked on the server's disk (TMPDIR) after its checks and read "
        "back as a method uses it. 0: always park.",
    ),
    recursive: bool = typer.Option(
        False, help="Read the .onnx uploads in subfolders too (named FOLDER/FILE.onnx)."
    ),
    report: str | None = typer.Option(
        None, help="Report JSON path (default: <out>.json)." + MAKES_FOLDERS
    ),
    for_classes: str | None = typer.Option(
        None,
        "--for",
        help="Device classes (profile names or TOML paths, comma-separated): distil each "
        "method's global model into the largest zoo classifier that runs within each class's "
        "inference budget, written beside it as <out stem>.<profile>.onnx.",
    ),
    for_epochs: int = FOR_EPOCHS,
    for_samples: int = FOR_SAMPLES,
    for_max_macs: int | None = FOR_MAX_MACS,
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Replace an output another command made (an upload, another method's global model, "
        "a deployed model, a file edgefl did not write); a rerun of the same method replaces "
        "its own result without it.",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the report(s) as JSON."),
    quiet: bool = QUIET,
) -> None:
    """Validate every upload once, fuse the usable ones with each METHOD, export global models."""
    from edgefl.server.classes import parse_request
    from edgefl.server.fuse import fuse_methods
    from edgefl.server.ingest import check_max_epsilon
    from edgefl.server.plan import plan, resolve_device

    check_for_flags(ctx, for_classes)
    check_max_epsilon(max_epsilon)  # before any upload is read
    _check_upload_cap(max_upload_bytes)
    methods = list(
        distinct_names(method, "--method", "e.g. --method fedmho or --method fedavg,fedmho-md")
    )
    options = method_options(methods, _extra_flags(list(ctx.args)), opt, budget)
    classes = parse_request(
        for_classes,
        epochs=for_epochs,
        samples=for_samples,
        max_macs=for_max_macs,
        eval_ref=eval_ref,
    )
    targets, report_path, out_flag = _fuse_targets(methods, out, out_dir, report)
    plans = [
        plan(
            m,
            options[m],
            target,
            uploads,
            report_path,
            classes=classes,
            out_flag=out_flag,
            overwrite=overwrite,
        )
        for m, target in zip(methods, targets, strict=True)
    ]
    _check_data_dir(data_dir, plans, eval_ref)
    resolve_device(device)
    cap = {} if max_upload_bytes is None else {"max_upload_bytes": max_upload_bytes}
    with reporter(quiet) as watch:
        watch.message(f"fusing with {', '.join(methods)}")
        reps = fuse_methods(
            plans,
            uploads,
            device=device,
            eval=eval_ref,
            data_dir=data_dir,
            strict=strict,
            jobs=jobs,
            keep_going=len(methods) > 1,
            log=watch.message,
            progress=watch,
            recursive=recursive,
            resident_mib=resident_mib,
            max_epsilon=max_epsilon,
            **cap,
        )
    _print_fused(reps, methods, json_out, quiet)
    if all("error" in r for r in reps.values()):
        raise typer.Exit(2)


def _check_upload_cap(max_upload_bytes: int | None) -> None:
    """0 or less rejected every upload as over the limit, after reading them all."""
    from edgefl.bounds import Range

    if max_upload_bytes is not None:
        hint = "e.g. --max-upload-bytes 536870912 (512 MiB)"
        Range(1).check("--max-upload-bytes", max_upload_bytes, hint=hint)


def _fuse_targets(
    methods: list[str], out: str | None, out_dir: str | None, report: str | None
) -> tuple[list, str | None, str]:
    """Each method's global model path, the report path and the flag that named them: one
    method writes --out (or into --out-dir), several write DIR/METHOD.onnx each."""
    from pathlib import Path

    from edgefl.errors import ConfigError

    if len(methods) > 1:
        if out is not None or report is not None:
            raise ConfigError(
                "--out and --report name one method's outputs; several methods write to a folder",
                hint=f"use --out-dir DIR (writes DIR/{methods[0]}.onnx, ...)",
            )
        if out_dir is None:
            raise ConfigError("several methods need --out-dir", hint="e.g. --out-dir global")
        return [Path(out_dir) / f"{m}.onnx" for m in methods], None, "--out-dir"
    if out_dir is not None and out is not None:
        raise ConfigError(
            "give --out or --out-dir, not both",
            hint="--out FILE.onnx for one method's model, --out-dir DIR for several "
            "(DIR/METHOD.onnx each)",
        )
    target = out or (str(Path(out_dir) / f"{methods[0]}.onnx") if out_dir else "global.onnx")
    return [target], report, "--out-dir" if out_dir else "--out"


def _print_fused(reps: dict[str, dict], methods: list[str], json_out: bool, quiet: bool) -> None:
    if json_out:
        print_json(reps[methods[0]] if len(methods) == 1 else reps)
        return
    if quiet:
        print_quiet(
            [w for r in reps.values() for w in r.get("warnings", [])],
            [f"{m}: {r['error']}" for m, r in reps.items() if "error" in r],
        )
        return
    _print_one(reps[methods[0]]) if len(methods) == 1 else _print_many(reps)
    for r in reps.values():
        for w in r.get("warnings", []):
            console.print(f"[yellow]warning[/] {upload_text(w)}")


def _print_one(rep: dict) -> None:
    # Upload-derived text (file names, client ids, reasons) is data: never rich markup.
    console.print(f"[bold]{rep['method']}[/] ({upload_text(rep['paper'])}) on {rep['device']}")
    used = ", ".join(upload_text(u) for u in rep["used"])
    console.print(f"  used {len(rep['used'])} upload(s): {used}")
    for r in rep["rejected"]:
        console.print(f"  [red]rejected[/] {upload_text(r['file'])}: {upload_text(r['reason'])}")
    for r in rep["skipped"]:
        console.print(f"  [yellow]skipped[/] {upload_text(r['file'])}: {upload_text(r['reason'])}")
    for r in rep.get("partly_used", []):
        console.print(
            f"  [yellow]partly used[/] {upload_text(r['file'])}: {upload_text(r['reason'])}"
        )
    if rep.get("scope"):
        console.print(f"  [yellow]global model from {upload_text(rep['scope'])}[/]")
    for r in rep.get("folders_not_read", []):
        console.print(
            f"  [yellow]not read[/] folder {upload_text(r['folder'])}: {upload_text(r['reason'])}"
        )
    for r in rep.get("screened", []):
        console.print(
            f"  [yellow]screened out[/] {upload_text(r['file'])}: {upload_text(r['reason'])}"
        )
    for n in rep.get("robust_notes", []):
        console.print(f"  [cyan]robust[/] {upload_text(n)}")
    _print_privacy(rep)
    times = ", ".join(f"{k} {v:.1f}s" for k, v in rep["seconds"].items())
    console.print(f"  stages: {times}")
    if "synthetic_kept_per_class" in rep:
        console.print(f"  synthetic kept per class: {rep['synthetic_kept_per_class']}")
    if "accuracy" in rep:
        console.print(
            f"  accuracy on {rep['eval']['dataset']}:{rep['eval']['split']}: "
            f"[bold]{100 * rep['accuracy']:.2f}%[/]"
        )
    console.print(
        f"  global model: {upload_text(rep['global_model'])} "
        f"({fmt_bytes(rep['global_bytes'])}); report: {upload_text(rep['report_path'])}"
    )
    _print_extra(rep)
    _print_classes(rep)


def privacy_line(privacy: dict) -> str:
    """What the used uploads spent of their clients' privacy, in words."""
    if privacy.get("epsilon") is not None:
        replayable = privacy.get("replayable") or 0
        seeded = (
            f"; {replayable} of them with noise seeded by a simulation, replayable by who knows "
            "the seed: the epsilon their settings spend, no guarantee"
            if replayable
            else ""
        )
        return (
            f"(epsilon {privacy['epsilon']:.4g}, delta {privacy['delta']:.3g})-DP for each "
            "training sample (one image or window of a client, not a client's data as a whole): "
            f"the largest of the {privacy['uploads']} used uploads' own{seeded}"
        )
    return f"{privacy['not_private']} of the {privacy['uploads']} used upload(s) not DP as a whole"


def _said_privacy(rep: dict) -> str | None:
    """The privacy line of one method's report, where there is one to say (a DP upload was
    used, or --max-epsilon screened them)."""
    privacy = rep.get("privacy")
    if privacy and (privacy["private"] or privacy["max_epsilon_allowed"] is not None):
        return privacy_line(privacy)
    return None


def _print_privacy(rep: dict) -> None:
    if (line := _said_privacy(rep)) is not None:
        console.print(f"  privacy: {line}", markup=False)


def _print_classes(rep: dict) -> None:
    """--for: one line per device class's model."""
    classes = rep.get("for_classes")
    if not classes:
        return
    if "refused" in classes:
        console.print(f"  [yellow]--for refused[/]: {upload_text(classes['refused'])}")
        return
    for name, c in classes.items():
        acc = f", {100 * c['accuracy']:.2f}%" if "accuracy" in c else ""
        console.print(
            f"  for {upload_text(name)}: {upload_text(c['model'])} ({c['spec']}, "
            f"{c['costs']['macs']:,} MACs, peak {fmt_bytes(c['costs']['infer_peak_bytes'])}"
            f"{acc}; {upload_text(c['from'])})"
        )


def _print_extra(rep: dict) -> None:
    for what, path in rep.get("extra_outputs", {}).items():
        console.print(f"  also wrote {upload_text(what)}: {upload_text(str(path))}")


def _print_many(reps: dict[str, dict]) -> None:
    first = next((r for r in reps.values() if "error" not in r), None)
    if first is not None:
        _print_ingest(first)
    cols = [
        Col("method", right=False),
        Col("used", drop=1),
        Col("accuracy"),
        Col("fuse time", drop=2),
        Col("global model", right=False, wrap=True),
    ]
    rows = [_fused_row(name, r) for name, r in reps.items()]
    console.print(fitted(cols, rows, console.width, title="fused"))
    for name, r in reps.items():
        _print_notes(name, r)


def _print_ingest(first: dict) -> None:
    """The one ingest all methods shared: its time, and the uploads it rejected."""
    ingest = first["seconds"]["ingest"]
    console.print(
        f"ingested once in {ingest:.1f}s: {len(first['accepted'])} accepted, "
        f"{len(first['rejected'])} rejected"
    )
    for r in first["rejected"]:
        console.print(f"  [red]rejected[/] {upload_text(r['file'])}: {upload_text(r['reason'])}")


def _fused_row(name: str, r: dict) -> list[str]:
    if "error" in r:
        return [name, "-", "[red]refused[/]", "-", escape(r["error"])]
    acc = f"{100 * r['accuracy']:.2f}%" if "accuracy" in r else "-"
    own = r["total_seconds"] - r["seconds"]["ingest"]
    return [name, str(len(r["used"])), acc, f"{own:.1f}s", upload_text(r["global_model"])]


def _print_notes(name: str, r: dict) -> None:
    """What set one method's fusion apart, below the table: its scope, the uploads it set
    aside or screened out, its robust notes, extra outputs and --for models."""
    if r.get("scope"):
        console.print(
            f"{upload_text(name)}: [yellow]global model from {upload_text(r['scope'])}[/]"
        )
    for x in r.get("set_aside", []) + r.get("partly_used", []):
        what = "partly used" if x in r.get("partly_used", []) else "set aside"
        console.print(
            f"{upload_text(name)}: [yellow]{what}[/] {upload_text(x['file'])}: "
            f"{upload_text(x['reason'])}"
        )
    for x in r.get("screened", []):
        console.print(
            f"{upload_text(name)}: [yellow]screened out[/] {upload_text(x['file'])}: "
            f"{upload_text(x['reason'])}"
        )
    for n in r.get("robust_notes", []):
        console.print(f"{upload_text(name)}: [cyan]robust[/] {upload_text(n)}")
    if (line := _said_privacy(r)) is not None:
        console.print(f"{name} privacy: {line}", markup=False)
    if r.get("extra_outputs") or r.get("for_classes"):
        console.print(f"{name}:", markup=False)
        _print_extra(r)
        _print_classes(r)


@app.command("methods")
def methods_cmd(
    name: str | None = typer.Argument(None, help="One method: its options and paper numbers."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The fusion methods: description, paper, what each consumes; with NAME, its options."""
    from dataclasses import asdict

    from edgefl.fusion import BUDGETS, METHODS

    chosen = [METHODS.get(name)] if name else list(METHODS)
    # "budgets": each named budget's option overrides as `--budget NAME` applies them.
    rows = [
        {
            "name": m.name,
            "description": m.description,
            "paper": m.paper,
            "consumes": list(m.consumes),
            "needs_modules": m.needs_modules,
            "public_data": m.public_data,
            "judged": m.judged,
            "personalize": m.personalize,
            "options": {o["name"]: o for o in m.options},
            "budgets": {b: m.budget_options(b) for b in BUDGETS},
            "divergences": list(m.divergences),
            "references": [asdict(r) for r in m.references],
        }
        for m in chosen
    ]
    if json_out:
        print_json(rows[0] if name else rows)
        return
    if name:
        _print_method(rows[0])
        return
    cols = [
        Col("method", right=False),
        Col("consumes", right=False, drop=2),
        Col("description", right=False, wrap=True),
        Col("paper", right=False, wrap=True, drop=1),
    ]
    cells = [
        [r["name"], ", ".join(r["consumes"]), escape(r["description"]), escape(r["paper"])]
        for r in rows
    ]
    console.print(
        fitted(
            cols,
            cells,
            console.width,
            title="Fusion methods (`edgefl server methods NAME` for its options)",
        )
    )


def _print_budgets(r: dict) -> None:
    """The named budgets side by side, one row per option any of them sets (cpu = the
    defaults), then where the authors' code departs from the paper."""
    from edgefl.fusion.options import flag

    budgets = r["budgets"]
    changed = [k for k in r["options"] if any(k in over for over in budgets.values())]
    if changed:
        cols = [Col("option", right=False)] + [Col(b, right=False, wrap=True) for b in budgets]
        cells = [
            ["--" + flag(k)]
            + [
                escape(_value(over[k]) if k in over else _shown(r["options"][k]))
                for over in budgets.values()
            ]
            for k in changed
        ]
        console.print(fitted(cols, cells, console.width, title="--budget NAME"))
    else:
        console.print(f"  --budget {', '.join(budgets)}: all the defaults")
    for d in r["divergences"]:
        console.print(f"  code vs paper: {escape(d)}")


def _shown(option: dict) -> str:
    """An option's default as a user would type it; one set by the data says so ("by dataset",
    "by input": its help gives the values), another None is "unset", never a value to pass."""
    if option.get("by_dataset"):
        return "by dataset"
    if option.get("by_input"):
        return "by input"
    return _value(option["default"])


def _value(value) -> str:
    return "unset" if value is None else repr(value)


def _print_method(r: dict) -> None:
    console.print(f"[bold]{r['name']}[/]: {escape(r['description'])}")
    console.print(f"  paper: {escape(r['paper'])}")
    extra = ", public data" if r["public_data"] else ""
    console.print(f"  consumes: {', '.join(r['consumes'])}{extra}; judged: {r['judged']}")
    cols = [
        Col("flag", right=False),
        Col("default", right=False, wrap=True),
        Col("accepts", right=False, wrap=True, drop=1),
        Col("what", right=False, wrap=True),
    ]
    cells = [
        [o["flag"], escape(_shown(o)), escape(o["constraint"]), escape(o["help"])]
        for o in r["options"].values()
    ]
    console.print(
        fitted(
            cols, cells, console.width, title="options (flags of `server fuse`, or --opt key=value)"
        )
    )
    _print_budgets(r)
    for ref in r["references"]:
        console.print(
            f"  paper: {ref['accuracy']:.2f}% on {ref['dataset']}, {ref['clients']} "
            f"clients, {ref['partition']} ({escape(ref['source'])})"
        )
