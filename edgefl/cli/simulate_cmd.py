"""`edgefl simulate` and `edgefl demo`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from edgefl.cli.common import (
    FOR_EPOCHS,
    FOR_MAX_MACS,
    FOR_SAMPLES,
    MAKES_FOLDERS,
    QUIET,
    applies_only_with,
    check_data_dir,
    check_for_flags,
    console,
    distinct_names,
    fmt_bytes,
    given,
    narration_on_stderr,
    print_json,
    print_quiet,
    upload_text,
)
from edgefl.cli.progress import reporter
from edgefl.cli.wide_tables import Col, fitted
from edgefl.client.privacy import DP_HELP, LABEL_HELP


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_cmd)
    app.command("demo")(demo_cmd)


def _fuse_options(items: list[str]) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """--fuse-opt METHOD:key=value (METHOD may be 'all') -> (for all, {method: for it})."""
    from edgefl.errors import ConfigError
    from edgefl.fusion.layering import given_once, split_items

    shared: dict[str, str] = {}
    targeted: dict[str, dict[str, str]] = {}
    for item in items:
        method, sep, kv = item.partition(":")
        if not sep:
            raise ConfigError(
                f"--fuse-opt expects METHOD:key=value, got {item!r}",
                hint="e.g. --fuse-opt fedmho:epochs=5 (one method), --fuse-opt all:epochs=5 "
                "(every method that has the option)",
            )
        into = shared if method == "all" else targeted.setdefault(method, {})
        kv = split_items([kv], "--fuse-opt", hint="e.g. --fuse-opt fedmho:epochs=5")
        if "seed" in kv:  # method_options sets --seed over it
            raise ConfigError(
                f"--fuse-opt {item!r}: a simulation fuses with its --seed",
                hint=f"pass --seed {kv['seed'].strip()} (it seeds the partition, the clients "
                "and the fusion), or fuse the run's uploads with `edgefl server fuse --seed`",
            )
        given_once(into, kv, "--fuse-opt")
    return shared, targeted


def _client_models(items: list[str]) -> dict[str, str]:
    """--client-model PROFILE=MODEL (repeatable) -> {profile: model}."""
    from edgefl.errors import ConfigError

    out: dict[str, str] = {}
    for item in items:
        profile, sep, model = item.partition("=")
        if not (sep and profile.strip() and model.strip()):
            raise ConfigError(
                f"--client-model expects PROFILE=MODEL, got {item!r}",
                hint="e.g. --client-model wristband=cnn --client-model smartphone=scnn:width=16",
            )
        out[profile.strip()] = model.strip()
    return out


def _search_options(items: list[str]) -> dict:
    """--search-opt key=value (repeatable), each value typed by the search's declared option
    (`PSOConfig`'s field types) and checked now, before any work."""
    from edgefl.fusion.layering import split_items
    from edgefl.search import PSOConfig

    texts = split_items(items, "--search-opt", hint="e.g. --search-opt particles=5")
    config = PSOConfig.from_text(texts)
    return {key: getattr(config, key) for key in texts}


def _trainer(engine: str):
    from edgefl.errors import ConfigError

    if engine == "local":
        return None
    if engine != "flower":
        raise ConfigError(
            f"--engine must be local or flower, got {engine!r}",
            hint="e.g. --engine flower (needs: pip install edgefl[flower])",
        )
    from edgefl.flower import require_flower

    require_flower()
    from edgefl.flower.engine import train_clients_flower

    return train_clients_flower


def _methods_and_options(
    methods: str | None, budget: str, fuse_opt: list[str]
) -> tuple[tuple[str, ...], dict[str, dict]]:
    """--methods (default: the FedMHO paper's table) and each one's fusion options."""
    from edgefl.fusion import DEFAULT_METHODS, check_budget
    from edgefl.fusion.layering import layer

    shared, targeted = _fuse_options(fuse_opt)
    hint = "e.g. --methods fedavg,fedmho-md, or leave --methods out for the paper's table"
    # none at all (`--methods ''`) ran the default table
    method_list = DEFAULT_METHODS if methods is None else distinct_names(methods, "--methods", hint)
    check_budget(budget)  # before anything runs, whichever methods are named
    # The budget's options, then all:, then METHOD: (edgefl.fusion.layering), as server fuse.
    opts = layer(
        method_list,
        budget,
        shared,
        targeted,
        shared_flag="--fuse-opt all:{key}",
        targeted_flag="--fuse-opt {method}:KEY=VALUE",
    )
    return method_list, opts


def simulate_cmd(
    ctx: typer.Context,
    dataset: str = typer.Option("mnist", help="Registered dataset."),
    clients: int = typer.Option(10, help="Number of clients."),
    partition: str = typer.Option(
        "dirichlet:0.5",
        help="iid | dirichlet:ALPHA | classes:K | user[:ID,ID,...] (one client per user: hapt).",
    ),
    mix: str | None = typer.Option(
        None,
        help="PROFILE:COUNT,... (sums to --clients). Default: half smartphones, half wristbands "
        "(smartphone:5,wristband:5 for 10 clients).",
    ),
    methods: str | None = typer.Option(
        None, help="Comma-separated fusion methods (default: the FedMHO paper's MNIST table)."
    ),
    seed: int = typer.Option(0, help="Seed of partition, initialisation, training and fusion."),
    out: str = typer.Option("runs/sim", "--out", help="Run directory (resumable)." + MAKES_FOLDERS),
    jobs: int = typer.Option(1, help="Clients trained in parallel worker processes."),
    engine: str = typer.Option(
        "local",
        help="Where clients run: local (worker processes) | flower (Flower's simulation "
        "engine on Ray, one SuperNode per client; needs edgefl[flower]).",
    ),
    device: str = typer.Option("auto", help="Fusion device: auto | cpu | cuda."),
    train_device: str = typer.Option(
        "cpu", help="Client training: cpu (single-threaded, like a device) | cuda | auto."
    ),
    paper_models: bool = typer.Option(
        False, help="Paper prototypes (CNN/VGG-9 + CVAE-small) regardless of budgets."
    ),
    paper_classifier: str = typer.Option("cnn", help="With --paper-models: cnn or vgg9."),
    max_classifier_macs: int = typer.Option(
        2_000_000, help="Cap on budget-true classifiers (0: none)."
    ),
    classifier_epochs: int | None = typer.Option(
        None, help="Local epochs of classifiers (default: profile)."
    ),
    generator_epochs: int | None = typer.Option(
        None, help="Local epochs of CVAEs (default: profile)."
    ),
    classifier_lr: float | None = typer.Option(
        None, help="Local lr of classifiers (default: by the profile's optimizer)."
    ),
    generator_lr: float | None = typer.Option(
        None, help="Local lr of CVAEs (default: by the profile's optimizer)."
    ),
    client_model: list[str] = typer.Option(
        [],
        "--client-model",
        help="PROFILE=MODEL: every client of that device class trains "
        "MODEL, regardless of its budget (repeatable), e.g. wristband=cnn; or PROFILE=search:pso: "
        "each of them searches its own architecture under its budget (pFedZKD's PSO-FedNAS).",
    ),
    attack: str = typer.Option(
        "",
        help="KIND:COUNT[,KIND:COUNT]: poisoned clients, to measure fusion against: for each "
        "kind, the first COUNT clients it applies to (KIND@classifier or KIND@cvae: of that "
        "role). Kinds: flip, swap (classes 0 and 1), random (untrained weights), scale (logits "
        "x 20), invert (negated logits), noise (a CVAE of noise). Recorded in the report, never "
        "in an upload.",
    ),
    search_opt: list[str] = typer.Option(
        [],
        "--search-opt",
        help="key=value for the clients' search (repeatable), e.g. particles=5 generations=3 "
        "candidate_epochs=1 fitness_samples=1000 max_macs=500000; default: the paper's "
        "(20 particles x 10 generations, 10 epochs a candidate: hours a client on a CPU).",
    ),
    classifier_optimizer: str | None = typer.Option(
        None, help="Optimizer of classifiers: sgd | sgd-momentum | adam (default: profile)."
    ),
    generator_optimizer: str | None = typer.Option(
        None, help="Optimizer of CVAEs: sgd | sgd-momentum | adam (default: profile)."
    ),
    classifier_batch_size: int | None = typer.Option(
        None, help="Local batch of classifiers (default: profile)."
    ),
    generator_batch_size: int | None = typer.Option(
        None, help="Local batch of CVAEs (default: profile)."
    ),
    subset: int | None = typer.Option(None, help="Use only this many training samples."),
    public_size: int | None = typer.Option(
        None,
        help="Unlabeled public samples carved from train for methods that use them "
        "(default 5,000 when one does; given, carved even when none does, so the clients' "
        "shards are those of a run with one: `reproduce` carves so in every setting).",
    ),
    fuse_opt: list[str] = typer.Option(
        [], "--fuse-opt", help="METHOD:key=value, e.g. fedmho-md:epochs=10."
    ),
    budget: str = typer.Option(
        "cpu",
        help="Fusion: cpu (defaults 2 cores finish in minutes) | paper (the papers' own) | "
        "code (as the authors' public code runs it).",
    ),
    for_classes: str | None = typer.Option(
        None,
        "--for",
        help="Device classes (profile names or TOML paths, comma-separated): each global model "
        "also distilled into the largest zoo classifier each class runs (as server fuse --for), "
        "written beside it as global/<method>.<profile>.onnx.",
    ),
    for_epochs: int = FOR_EPOCHS,
    for_samples: int = FOR_SAMPLES,
    for_max_macs: int | None = FOR_MAX_MACS,
    data_dir: str | None = typer.Option(None, help="Folder with standard dataset files."),
    dp: str | None = typer.Option(None, "--dp", help="Every client: " + DP_HELP),
    label_counts: str = typer.Option(
        "exact",
        "--label-counts",
        help="Every client: " + LABEL_HELP + " A simulation seeds the counts' noise "
        "from --seed (reproducible, so not private against whoever knows the seed).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print results JSON."),
    quiet: bool = QUIET,
) -> None:
    """Run a whole one-shot federation: train every client, fuse with each method, evaluate."""
    from edgefl.client.attacks import parse_attacks
    from edgefl.client.privacy import check_request
    from edgefl.simulate.job import SimJob
    from edgefl.simulate.run import check_role_options, simulate

    check_request(dp, label_counts)  # a bad --dp or --label-counts: before anything loads
    _check_applies(ctx, paper_models, for_classes)
    trainer = _trainer(engine)  # an unknown engine or a missing extra: before any work
    method_list, opts = _methods_and_options(methods, budget, fuse_opt)
    job = SimJob(
        dataset=dataset,
        clients=clients,
        partition=partition,
        mix=mix,
        methods=method_list,
        seed=seed,
        out=out,
        jobs=jobs,
        device=device,
        train_device=train_device,
        paper_models=paper_models,
        paper_classifier=paper_classifier,
        max_classifier_macs=max_classifier_macs or None,
        classifier_epochs=classifier_epochs,
        generator_epochs=generator_epochs,
        subset=subset,
        classifier_lr=classifier_lr,
        generator_lr=generator_lr,
        data_dir=data_dir,
        fuse_options=opts,
        client_models=_client_models(client_model),
        classifier_optimizer=classifier_optimizer,
        generator_optimizer=generator_optimizer,
        classifier_batch_size=classifier_batch_size,
        generator_batch_size=generator_batch_size,
        public_size=public_size,
        search_options=_search_options(search_opt),
        attacks=parse_attacks(attack) if attack else {},
        for_classes=for_classes,
        for_epochs=for_epochs,
        for_samples=for_samples,
        for_max_macs=for_max_macs,
        dp=dp,
        label_counts=label_counts,
    )
    flags = ("paper_models", "paper_classifier", "max_classifier_macs")
    check_role_options(job, frozenset("--" + f.replace("_", "-") for f in flags if given(ctx, f)))
    with reporter(quiet) as watch:
        results = simulate(job, log=watch.message, progress=watch, trainer=trainer)
    if json_out:
        print_json(results)
    elif quiet:
        print_quiet(
            results.get("warnings", []),
            [f"{r['method']}: {r['error']}" for r in results["results"] if r.get("error")],
        )
    else:
        print_results(results)


def _check_applies(ctx: typer.Context, paper_models: bool, for_classes: str | None) -> None:
    """Flags that act only with (or without) another, refused where they would be passed over."""
    from edgefl.errors import ConfigError

    check_for_flags(ctx, for_classes)
    check_data_dir(ctx.params["data_dir"], {"--dataset": ctx.params["dataset"]})
    applies_only_with(ctx, "paper_classifier", "--paper-models", paper_models)
    if paper_models and given(ctx, "max_classifier_macs"):
        raise ConfigError(
            "--max-classifier-macs caps the budget-true classifiers; --paper-models trains the "
            "papers' prototypes whatever their MACs",
            hint="drop one of the two",
        )


def print_results(results: dict) -> None:
    _print_methods(results)
    for r in results["results"]:
        _print_method_notes(r)
    for w in results.get("warnings", []):
        console.print(f"[yellow]warning[/] {escape(w)}")
    _print_clients(results)
    from edgefl.simulate.render import reused_text, seconds_text

    j, s = results["job"], results["seconds"]
    stages = ", ".join(f"{k} {seconds_text(s[k])}" for k in ("clients", "fusion", "total"))
    console.print(f"{stages}{escape(reused_text(s))}; results in {escape(j['out'])}/results.md")
    if results.get("pictures"):
        names = ", ".join(Path(p).name for p in results["pictures"])
        console.print(f"pictures in {escape(j['out'])}: {escape(names)}")


def _print_methods(results: dict) -> None:
    """One row per fusion method: its accuracy beside the paper's."""
    from edgefl.simulate.render import accuracy_text

    j = results["job"]
    title = f"{j['dataset']}, {j['clients']} clients, {j['partition']}, {j['mix']}" + (
        ", paper models" if j["paper_models"] else ", budget-true models"
    )
    cols = [
        Col("method", right=False),
        Col("accuracy", wrap=True),
        Col("paper"),
        Col("fuse time", drop=2),
        Col("upload", drop=1),
    ]
    rows = []
    for r in results["results"]:
        acc = accuracy_text(r) if r["accuracy"] is not None else "[red]refused[/]"
        paper = f"{r['paper']:.2f}" if r.get("paper") is not None else "-"
        rows.append(
            [r["method"], acc, paper, f"{r['fuse_seconds']:.1f}s", fmt_bytes(r["upload_bytes"])]
        )
    console.print(fitted(cols, rows, console.width, title=title))


def _print_method_notes(r: dict) -> None:
    """Below the table, one method's error, screened uploads, robust notes and --for models."""
    if r.get("error"):
        console.print(f"  [yellow]{r['method']}[/]: {escape(r['error'])}")
    for x in r.get("screened", []):
        console.print(f"  {r['method']}: [yellow]screened out[/] {escape(x)}")
    for x in r.get("robust_notes", []):
        console.print(f"  {r['method']}: [cyan]robust[/] {escape(x)}")
    for name, c in (r.get("for_classes") or {}).items():  # --for
        if name == "refused":
            console.print(f"  {r['method']}: [yellow]--for refused[/] {upload_text(c)}")
            continue
        acc = f", {100 * c['accuracy']:.2f}%" if c.get("accuracy") is not None else ""
        console.print(
            f"  {r['method']} for {upload_text(name)}: {upload_text(c['model'])}"
            f" ({c['costs']['macs']:,} MACs{acc}; {upload_text(c['from'])})"
        )


def _print_clients(results: dict) -> None:
    from edgefl.simulate.render import val_acc_text

    cols = [
        Col("client", right=False),
        Col("profile", right=False),
        Col("role", right=False, drop=2),
        Col("model", right=False),
        Col("val acc"),
        Col("upload", drop=1),
    ]
    rows = [
        [
            c["client_id"] + (f" ({c['attack']} attacker)" if c.get("attack") else ""),
            c["profile"],
            c["role"],
            escape(c["model"]),
            val_acc_text(c, "%"),
            fmt_bytes(c["upload_bytes"]),
        ]
        for c in results["clients"]
    ]
    console.print(fitted(cols, rows, console.width, title="clients"))


def demo_options(
    method, input_shape, epochs: int = 10, synthetic: int = 3000, dataset: str | None = None
) -> dict:
    """A few minutes on a laptop: fewer synthetic samples and epochs. Classifiers as small as
    the demo's (<10k parameters) barely move at a global lr below 1e-4 such as FedMHO's paper
    1e-5 on images (bench/README.md): the demo fuses them at 1e-4. The lr compared is the one
    the method would run with on this input (`Method.effective_config`), never a default read
    off its config class, which may be unset until the input is known."""
    small = {
        k: v
        for k, v in (("epochs", epochs), ("synthetic", synthetic))
        if k in method.option_names()
    }
    cfg = method.effective_config(small, input_shape, dataset)
    if getattr(cfg, "lr", None) is not None and cfg.lr < 1e-4:
        small["lr"] = 1e-4
    return small


def demo_cmd(
    out: str = typer.Option("runs/demo", "--out", help="Run directory." + MAKES_FOLDERS),
    jobs: int = typer.Option(2, help="Parallel client workers."),
    quick: bool = typer.Option(
        False,
        "--quick",
        help="A smoke-sized federation (3,000 digits, 10-15 local and 5 global epochs, 1,000 "
        "synthetic samples): every step and file of the demo in about half a minute, to "
        "check an install; its accuracies are far below the full demo's.",
    ),
    json_out: bool = typer.Option(
        False,
        "--json",
        help="Print the results JSON on stdout; the plans, progress, table and next steps go to "
        "stderr.",
    ),
) -> None:
    """A small MNIST federation end to end (plans, clients, every FedMHO-paper method)."""
    from edgefl.outputs import check_writable

    check_writable(out, "--out", "runs/demo", folder_ok=True)  # before any work
    with narration_on_stderr(json_out):
        results = _run_demo(out, jobs, quick)
        print_results(results)
        print_way_on(results)
    if json_out:
        print_json(results)


def _run_demo(out: str, jobs: int, quick: bool) -> dict:
    """The demo's federation, told as it goes: what each device affords, then the run."""
    from edgefl.cli.client_cmd import print_plan
    from edgefl.data.registry import dataset_info
    from edgefl.fusion import DEFAULT_METHODS, METHODS
    from edgefl.models.plan import plan
    from edgefl.models.zoo import spec_label
    from edgefl.profiles import get_profile
    from edgefl.simulate.job import SimJob
    from edgefl.simulate.run import simulate

    scale = (5, 1000) if quick else (10, 3000)  # global epochs, synthetic samples
    subset = 3_000 if quick else 12_000

    console.rule("1. What each device can afford (MNIST)")
    info, cap = dataset_info("mnist"), 500_000
    plans = {n: plan(get_profile(n), info, samples=1200) for n in ("smartphone", "wristband")}
    for p in plans.values():
        print_plan(p)
    console.rule("2-5. Train 10 clients, export ONNX, fuse on the server, evaluate")
    # Say why the trained models differ from the plans: a user sees vgg9 planned, then cnn trained.
    phone = plans["smartphone"]
    if phone.role == "classifier" and phone.costs.macs > cap:
        small = plan(get_profile("smartphone"), info, samples=1200, max_macs=cap)
        console.print(
            f"The smartphones could afford {spec_label(phone.spec)}; the demo trains "
            f"{spec_label(small.spec)} (<= {cap:,} MACs, --max-classifier-macs) so that 2 cores finish "
            "in minutes. The wristbands train the generator their budget allows. The paper "
            "column is the FedMHO paper's Table 3 for this setting (MNIST, 10 clients, Dir(0.5), "
            f"full data and budget); the demo uses {subset:,} digits and a few epochs, so expect "
            "less."
        )
    job = SimJob(
        dataset="mnist",
        clients=10,
        partition="dirichlet:0.5",
        mix="smartphone:5,wristband:5",
        out=out,
        jobs=jobs,
        subset=subset,
        classifier_epochs=15 if quick else 5,
        generator_epochs=10 if quick else 15,
        max_classifier_macs=cap,
        fuse_options={
            m: demo_options(METHODS.get(m), info.input_shape, *scale, dataset="mnist")
            for m in DEFAULT_METHODS
        },
    )
    with reporter() as watch:
        return simulate(job, log=watch.message, progress=watch)


def print_way_on(results: dict) -> None:
    """The demo's last words: where its uploads and global models are, and what to run next
    on them (each command runs as printed)."""
    out = Path(results["job"]["out"])
    folders = sorted({str(Path(c["path"]).parent) for c in results["clients"] if c.get("path")})
    fused = [r for r in results["results"] if r.get("accuracy") is not None]
    models = [out / "global" / f"{r['method']}.onnx" for r in fused]
    models = [m for m in models if m.exists()]
    console.rule("Where everything is, and what to try next")
    _print_places(results, out, folders, models)
    _print_next(results["job"]["dataset"], out, folders, fused)


def _print_places(results: dict, out: Path, folders: list[str], models: list[Path]) -> None:
    for folder in folders or [str(out / "uploads")]:
        count = sum(1 for c in results["clients"] if str(Path(c.get("path", "")).parent) == folder)
        console.print(f"uploads: {escape(folder)}/ ({count} client .onnx files)")
    if models:
        console.print(
            f"global models: {escape(str(out / 'global'))}/*.onnx ({len(models)}: "
            f"{escape(', '.join(m.stem for m in models))}; a .json report beside each)"
        )
    console.print(
        f"results: {escape(str(out / 'results.md'))}, {escape(str(out / 'results.json'))}"
    )


def _print_next(dataset: str, out: Path, folders: list[str], fused: list[dict]) -> None:
    """Commands to run next on the best global model and the demo's uploads."""
    best = max(fused, key=lambda r: r["accuracy"], default=None)
    model = out / "global" / f"{best['method']}.onnx" if best else out / "global" / "fedmho.onnx"
    uploads = folders[0] if folders else str(out / "uploads")
    console.print("next:")
    for line, why in (
        (f"edgefl eval {model} --dataset {dataset}", "the global model on the test set"),
        (
            f"edgefl server fuse {uploads} --method fedmho-md --out runs/try/fedmho-md.onnx "
            f"--eval {dataset}",
            "fuse the same uploads yourself, with another method",
        ),
        (
            f"edgefl deploy {model} --profile wristband --target onnx --out runs/try/wristband",
            "convert it for a device class and prove it fits",
        ),
    ):
        console.print(f"  {escape(line)}", soft_wrap=True)  # one line, to copy whole
        console.print(f"    [dim]{why}[/]")
