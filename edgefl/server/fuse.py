"""The server pipeline every method shares, in named stages:

    plan (options, output paths: checked before any long work) -> claim (--eval and public
    sets resolved, the outputs locked) -> count (a method over its max_teachers by what the
    files declare, refused) -> ingest (once per run) -> select (what each method can use) ->
    fuse -> export -> extra outputs -> evaluate -> report -> publish

Any number of methods fuse one ingest (`fuse_methods`); `run_fuse` is the one-method case.
Several methods on a CPU run side by side in worker processes forked after the ingest: they
share the ingested uploads (copy-on-write) instead of reading them again, and small models,
which cannot keep several cores busy on their own, do.
The pipeline reads each method's contract (edgefl.fusion.base.Method), never its name.
Uploads are only read. A method's outputs (global model, extra outputs, report) are one unit:
locked for the run that writes them (a second run on them is refused at once), staged beside
their targets and published together once complete and evaluated, the report last; until then
the previous ones stay byte-identical, and a report always names its model's SHA-256.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

import edgefl
import exporters
from edgefl.artifacts import Upload
from edgefl.chance import global_warning, near_chance
from edgefl.errors import ConfigError, EdgeflError, FusionError
from edgefl.fusion import METHODS
from edgefl.fusion.base import FusionConfig, FusionContext, FusionResult, Method, over_caps
from edgefl.fusion.config import PublicSetConfig
from edgefl.fusion.options import effective
from edgefl.fusion.robust import apply as apply_screen
from edgefl.fusion.robust import judge as judge_screen
from edgefl.models.zoo import spec_label
from edgefl.outputs import Staging, check_replace, check_writable, lock_outputs, sha256_file
from edgefl.progress import no_progress
from edgefl.server import classes as device_classes
from edgefl.server.ingest import (
    Ingest,
    check_max_epsilon,
    default_jobs,
    ingest,
    parking,
    resident_limit,
)
from edgefl.server.workers import Died, run_forked


@dataclass(frozen=True)
class FuseJob:
    """One method: `edgefl server fuse DIR --method M --out G.onnx`."""

    uploads: str
    method: str
    out: str = "global.onnx"
    options: dict[str, Any] | None = None  # method config overrides, by field name
    device: str = "auto"
    eval: str | None = None  # DATASET[:SPLIT]
    data_dir: str | None = None
    strict: bool = False
    max_upload_bytes: int = exporters.DEFAULT_MAX_UPLOAD_BYTES
    report: str | None = None  # default: <out>.json
    jobs: int | None = None  # uploads ingested at once (default: by the cores)
    resident_mib: int | None = None  # uploads held in memory past this are parked on disk
    classes: device_classes.ClassRequest | None = None  # --for: a model per device class
    overwrite: bool = False  # replace outputs another command made (check_replacing)
    max_epsilon: float | None = None  # set aside uploads not DP or spending more (--max-epsilon)


@dataclass(frozen=True)
class Planned:
    """A method ready to run: its validated config and where its outputs go."""

    method: Method
    config: FusionConfig
    out: Path
    report: Path
    # --for: what to distil per device class, and where each class's model goes.
    classes: device_classes.ClassRequest | None = None
    class_outs: tuple[tuple[Any, Path], ...] = ()  # (profile, <out stem>.<profile>.onnx)
    overwrite: bool = False  # replace outputs another command made (check_replacing)
    flags: tuple[str, ...] = ("--out", "--report")  # the flag naming each of `targets`

    @property
    def targets(self) -> list[Path]:
        """Every file this method's run writes (locked together, published together)."""
        return [self.out, self.report, *(path for _, path in self.class_outs)]


def resolve_device(name: str, flag: str = "--device") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"{flag} cuda: no CUDA device is available", hint=f"use {flag} auto or cpu"
        )
    if name not in ("cpu", "cuda"):
        raise ConfigError(f"{flag} must be auto, cpu or cuda, got {name!r}")
    return torch.device(name)


# --- stage: plan ----------------------------------------------------------------------------


def plan(
    name: str,
    options: dict[str, Any] | None,
    out: str | Path,
    uploads: str | Path,
    report: str | Path | None = None,
    out_flag: str = "--out",
    classes: device_classes.ClassRequest | None = None,
    overwrite: bool = False,
) -> Planned:
    """Everything that can be wrong with a method's request, checked before any upload is read.
    An existing output is replaced only when this method made it (a rerun of the same fuse,
    whatever its options) or with `overwrite`: never an upload, another method's global model,
    a deployed or personalized model, or a file edgefl did not write."""
    method = METHODS.get(name)
    cfg = method.make_config(dict(options or {}))
    out = Path(out)
    if out.suffix != ".onnx":
        raise ConfigError(f"{out_flag} must end in .onnx, got {out}")
    report_path = Path(report) if report else out.with_suffix(".json")
    if report_path.resolve() == out.resolve():
        raise ConfigError(
            f"--report {report_path} is the global model's own path",
            hint="leave --report out (it defaults to <out>.json)",
        )
    class_outs = tuple(classes.targets(out)) if classes else ()
    if report_path.resolve() in {path.resolve() for _, path in class_outs}:
        raise ConfigError(
            f"--report {report_path} is a device class's model path",
            hint="leave --report out (it defaults to <out>.json)",
        )
    root = Path(uploads).resolve()
    named = [(out_flag, out), ("--report", report_path)]
    for flag_name, path in named + [("--for", path) for _, path in class_outs]:
        if root in path.resolve().parents:  # uploads are only ever read
            raise ConfigError(
                f"{flag_name} {path} is inside the upload directory {uploads}",
                hint="the server never writes among the uploads: write the global model and "
                "its report elsewhere, e.g. --out global.onnx",
            )
        # The hint's example: the same name in the current folder (a folder for --out-dir).
        check_writable(path, flag_name, path.parent.name if flag_name == "--out-dir" else path.name)
    flags = (out_flag, "--report") + ("--for",) * len(class_outs)
    return Planned(method, cfg, out, report_path, classes, class_outs, overwrite, flags)


def check_replacing(p: Planned) -> None:
    """Each existing output is this method's own result (a rerun of the same fuse, whatever
    its options, replaces it) unless the run said --overwrite: checked under the run's lock,
    after every other check and before any upload is read."""
    for flag_name, path in zip(p.flags, p.targets, strict=True):
        check_replace(path, flag_name, p.overwrite, lambda made: _fused_by(made, p.method.name))


def _fused_by(made: dict[str, Any], method: str) -> bool:
    """A global model (or its report) this method made: a rerun of it may replace it."""
    kind = made.get("kind", "global")  # a report records no kind
    return made.get("method") == method and kind == "global" and not made.get("deployed")


# --- stage: select --------------------------------------------------------------------------


def select(method: Method, found: Ingest) -> tuple[list[Upload], list[tuple[str, str]]]:
    """(the uploads the method uses, (file, why not) for the others), from its contract."""
    usable = [u for u in found.uploads if u.kind in method.consumes]
    skipped = [
        (u.name, f"{u.kind} artifacts are not used by {method.name}")
        for u in found.uploads
        if u.kind not in method.consumes
    ]
    if method.needs_modules:
        for u in [u for u in usable if not u.rebuilt]:
            skipped.append(
                (u.name, f"{method.name} needs a rebuilt torch module: {u.forward_only}")
            )
        usable = [u for u in usable if u.rebuilt]
    if not usable:
        raise FusionError(
            f"none of the {len(found.uploads)} accepted uploads can be used by {method.name} "
            f"(it consumes: {', '.join(method.consumes)})"
            + _why_not(found.rejected, skipped, found.folders),
            hint="`edgefl server methods` lists what each method needs",
        )
    return usable, skipped


def _why_not(
    rejected: list[tuple[str, str]],
    skipped: list[tuple[str, str]],
    folders: list[tuple[str, str]] = (),
    screened: list[dict[str, Any]] = (),
) -> str:
    """Every upload a method went without, and why: a run that fails for want of uploads names
    them (a count alone left users guessing why their own models were refused), those the
    robust screen set aside (`robust.apply`'s entries) included. One line per upload: its name
    and reason are shown with control characters escaped, newlines included, so that a file
    whose name holds a newline cannot forge a line of the message."""
    from edgefl.progress import printable

    lines = [f"\n  rejected {printable(n)}: {printable(r)}" for n, r in rejected]
    lines += [f"\n  not used {printable(n)}: {printable(r)}" for n, r in skipped]
    lines += [f"\n  not read folder {printable(n)}: {printable(r)}" for n, r in folders]
    lines += [
        f"\n  set aside by --robust screen {printable(s['file'])} ({printable(s['kind'])}): "
        f"{printable(s['reason'])}"
        for s in screened
    ]
    return "".join(lines)


# --- stages: fuse, export, extra outputs, evaluate ------------------------------------------


def fuse_one(
    p: Planned,
    usable: list[Upload],
    device: torch.device,
    log,
    everyone: list[Upload],
    progress=None,
) -> tuple[FusionContext, FusionResult]:
    torch.manual_seed(p.config.seed)
    # Named: with methods side by side, "epoch 2/10" alone would not say whose.
    name = p.method.name
    named = (lambda msg: log(f"{name}: {msg}")) if log else None

    def steps(task: str, done: int, total: int, note: str = "") -> None:
        progress(f"{name} {task}", done, total, note)

    ctx = FusionContext(
        usable,
        device=device,
        seed=p.config.seed,
        log=named,
        federation=everyone,
        progress=steps if progress else None,
        method=name,
    )
    return ctx, p.method.fuse(ctx, p.config)


def export_global(
    p: Planned,
    ctx: FusionContext,
    result: FusionResult,
    path: Path | None = None,
    extra: dict[str, Any] | None = None,
) -> tuple[int, ...]:
    """The global model as one ONNX file at `path` (default: its target, `p.out`); `extra`:
    more metadata (a device class's model names its profile)."""
    path = p.out if path is None else path
    input_shape = tuple(result.input_shape or ctx.input_shape)
    aside = {id(u) for u, _ in ctx.aside}  # uploads the method itself left out
    meta = {
        "kind": "global",
        "spec": result.spec.to_dict() if result.spec else None,
        "input_shape": list(input_shape),
        "num_classes": ctx.num_classes,
        "class_names": [str(c) for c in ctx.class_names],
        "client_id": "server",
        "method": p.method.name,
        "config": p.config.as_dict(),
        "client_ids": [u.client_id for u in ctx.uploads if id(u) not in aside],
        "edgefl_version": edgefl.__version__,
        **(extra or {}),
    }
    model = result.model.to("cpu").eval()
    try:
        exporters.export_onnx(
            model,
            (torch.zeros(2, *input_shape),),
            path,
            input_names=[result.input_name or "input"],
            output_names=["logits"],
            metadata=meta,
        )
    except exporters.ExportError as exc:
        # This method's failure, not the run's: beside other methods it is reported and the
        # rest still fuse (a FusionError is refused per method).
        raise FusionError(f"exporting the global model failed: {exc}") from None
    return input_shape


def evaluate_global(
    p: Planned, input_shape, eval_ref: str, data_dir: str | None, path: Path | None = None
) -> dict:
    """Report entries: the global model's (at `path`, default `p.out`) accuracy on
    DATASET[:SPLIT], or why it is not judged that way (a per-client method's output takes
    representations, not images)."""
    if p.method.judged != "global":
        return {
            "eval": {
                "skipped": f"the {p.method.name} output takes input {list(input_shape)}, not "
                "images; evaluate the personalized client models instead"
            }
        }
    from edgefl.evaluate import evaluate_artifact, parse_eval_ref

    name, split = parse_eval_ref(eval_ref)
    model = p.out if path is None else path
    ev = evaluate_artifact(exporters.read_artifact(model), name, split, data_dir=data_dir)
    return {"eval": ev.as_dict(), "accuracy": ev.accuracy}


# --- stage: claim --------------------------------------------------------------------------


def check_inputs(plans: list[Planned], eval_ref: str | None) -> None:
    """What the run reads besides the uploads, resolved by name without loading it: the --eval
    dataset and split, the public sets the methods' options name. A typo found after the
    fusion cost the whole fusion."""
    if eval_ref:
        _check_dataset_ref(eval_ref, "--eval", default_split="test", splits=("train", "test"))
    for p in plans:
        public = p.config.public_args() if p.method.public_data else None
        if public:
            _check_dataset_ref(
                public["ref"],
                f"{p.method.name} --public",
                "train",
                splits=("train", "test", "public"),
            )


def _check_dataset_ref(ref: str, what: str, default_split: str, splits: tuple[str, ...]) -> None:
    from edgefl.data import DATASETS, parse_dataset_ref

    name, split = parse_dataset_ref(ref)
    split = split or default_split
    if name not in DATASETS and not Path(name).exists():  # neither a name nor a user's file
        try:
            DATASETS.get(name)  # raises UnknownNameError, with the nearest name
        except EdgeflError as exc:
            raise ConfigError(f"{what} {ref!r}: {exc.message}", hint=exc.hint) from None
    if split not in splits:
        raise ConfigError(
            f"{what} {ref!r}: unknown split {split!r}",
            hint=f"valid splits: {', '.join(splits)}, e.g. {name}:{default_split}",
        )


# --- the pipeline ---------------------------------------------------------------------------


def fuse_methods(
    plans: list[Planned],
    uploads: str,
    *,
    device: str = "auto",
    eval: str | None = None,
    data_dir: str | None = None,
    strict: bool = False,
    max_upload_bytes: int = exporters.DEFAULT_MAX_UPLOAD_BYTES,
    jobs: int | None = None,
    keep_going: bool = True,
    log=None,
    progress=None,
    recursive: bool = False,
    resident_mib: int | None = None,
    max_epsilon: float | None = None,
) -> dict[str, dict[str, Any]]:
    """Fuse every planned method from one ingest of `uploads`. A method that cannot fuse these
    uploads (FusionError) gets {"error": ...} in its report slot when `keep_going`, else raises.
    `log(text)` gets one-off lines, `progress(task, done, total, note)` the steps of long work.
    Uploads over `resident_mib` MiB in all are parked on disk after their checks (`parking`);
    with `max_epsilon`, those not DP or spending more are rejected (ingest.privacy_screen)."""
    log = log or (lambda msg: None)
    progress = progress or no_progress
    dev = resolve_device(device)
    check_inputs(plans, eval)
    check_max_epsilon(max_epsilon)
    resident_limit(resident_mib)  # before the folder is read to count or check a file
    # Held until every method has published or failed; forked workers share it.
    with lock_outputs(t for p in plans for t in p.targets):
        for p in plans:
            check_replacing(p)
        # counted before the ingest reads a single file
        early = refused_early(
            plans, uploads, recursive=recursive, max_upload_bytes=max_upload_bytes
        )
        left = [p for p in plans if p.method.name not in early]
        if early and not keep_going:
            raise next(iter(early.values()))
        for name, error in early.items():  # said now, not after the others' fusion
            log(f"{name} refused: {error.message}")
        outcomes = []
        if left:
            # The parked modules are read until the last method has fused.
            with parking(uploads, resident_mib, recursive) as park_in:
                found = _ingest_logged(
                    uploads,
                    log,
                    progress,
                    max_upload_bytes=max_upload_bytes,
                    strict=strict,
                    jobs=jobs,
                    recursive=recursive,
                    park_in=park_in,
                    max_epsilon=max_epsilon,
                )
                run = FuseRun(found, dev, eval, data_dir, len(left), log, progress)
                outcomes = _fuse_ingested(left, run, jobs)
        outcomes = _with_refused(plans, early, outcomes)
        return _reports(plans, outcomes, keep_going, log, said=set(early))


def refused_early(
    plans: list[Planned], uploads: str | Path, *, recursive: bool, max_upload_bytes: int
) -> dict[str, FusionError]:
    """The methods refused before the ingest, by name: those whose cap on classifier teachers
    (max_teachers) the upload files exceed by what they declare, counted without parsing any
    (`exporters.declared_kinds`: seconds for 10,000 files, where validating them takes
    minutes). The refusal is the method's own after the ingest (`FusionContext.require`),
    which stays: a declaration is the client's word, and a file may yet be rejected."""
    if not any(p.method.teacher_cap(p.config) for p in plans):
        return {}
    declared = exporters.declared_kinds(uploads, recursive=recursive, max_bytes=max_upload_bytes)
    return over_caps(((p.method, p.config) for p in plans), declared["classifier"])


def _with_refused(plans: list[Planned], early: dict[str, FusionError], outcomes: list) -> list:
    """Each planned method's outcome in order: (None, its refusal) for those refused before
    the ingest, `outcomes` (of the others, in order) for the rest."""
    fused = iter(outcomes)
    return [(None, early[p.method.name]) if p.method.name in early else next(fused) for p in plans]


def _fuse_ingested(plans: list[Planned], run: FuseRun, jobs: int | None) -> list:
    """Each planned method's (report, None) or (None, its refusal), in order, from the one
    ingest of `run`: side by side in forked workers where that pays."""
    _check_classes(plans, run.found)
    plans = _in_effect(plans, run.found)
    for p in plans:  # before workers fork: they all read the one verdict
        if p.config.robust == "screen":
            _screen_verdict(p, run.found, run.device, run.log, run.progress)
    workers = _method_workers(jobs, len(plans), run.device)
    if workers > 1:
        return _fuse_forked(plans, run, workers)
    return [_outcome(p, run) for p in plans]


def _ingest_logged(
    uploads: str,
    log,
    progress,
    *,
    max_upload_bytes: int,
    strict: bool,
    jobs: int | None,
    recursive: bool,
    park_in: Path | None,
    max_epsilon: float | None = None,
) -> Ingest:
    """The run's one ingest, its folders not read and its counts logged."""
    log(f"ingesting {uploads}" + (", parking each checked model on disk" if park_in else ""))
    found = ingest(
        uploads,
        max_upload_bytes=max_upload_bytes,
        strict=strict,
        jobs=jobs,
        progress=progress,
        recursive=recursive,
        park_in=park_in,
        max_epsilon=max_epsilon,
    )
    for name, why in found.folders:
        log(f"not read: folder {name}: {why}")  # the log escapes upload text
    log(
        f"{len(found.uploads)} upload(s) accepted, {len(found.rejected)} rejected "
        f"({found.seconds:.1f}s)"
    )
    return found


def _in_effect(plans: list[Planned], found: Ingest) -> list[Planned]:
    """The plans with the options in effect for the uploads' input and dataset (those that
    default by data set): what each method runs with, its work is sized by, and its report
    and model record; never an unset one."""
    if not found.uploads:
        return plans  # nothing to fuse: each method refuses with the reasons
    task = found.uploads[0].meta
    shape, dataset = task["input_shape"], task.get("dataset")
    return [replace(p, config=effective(p.config, shape, dataset)) for p in plans]


def _check_classes(plans: list[Planned], found: Ingest) -> None:
    """--for: a class no classifier for this task fits, refused now (before any fusion)."""
    if not found.uploads:
        return
    task = found.uploads[0].meta
    for p in plans:
        if p.classes is not None and p.method.judged == "global":
            device_classes.check_task(p.classes, task["input_shape"], task["num_classes"])


def _reports(
    plans: list[Planned], outcomes: list, keep_going: bool, log, said: set[str] = frozenset()
) -> dict[str, dict[str, Any]]:
    """Each method's report by its name; a refused one's as `refused_report` when `keep_going`,
    else its error raised. Refusals are logged, but those of `said` (logged already)."""
    reports: dict[str, dict[str, Any]] = {}
    for p, (report, error) in zip(plans, outcomes, strict=True):
        name = p.method.name
        if error is not None:
            if not keep_going:
                raise error
            if name not in said:
                log(f"{name} refused: {error.message}")
            report = refused_report(name, error)
        reports[name] = report
    return reports


def refused_report(method: str, error: EdgeflError) -> dict[str, Any]:
    """A method's report slot when it could not fuse: a result of the run, not a crash."""
    return {"method": method, "error": error.message, "used": [], "total_seconds": 0.0}


@dataclass(frozen=True)
class FuseRun:
    """What every planned method of one `fuse_methods` call shares: the one ingest, the device,
    the evaluation split, how many methods the ingest serves, and where lines and steps go
    (in a forked worker: back to the parent)."""

    found: Ingest
    device: torch.device
    eval_ref: str | None
    data_dir: str | None
    shared: int
    log: Callable[[str], None]
    progress: Callable[..., None]


def _outcome(p: Planned, run: FuseRun):
    """(report, None) or (None, the FusionError that refused it)."""
    try:
        return _fuse_planned(p, run), None
    except FusionError as exc:
        return None, exc


def _method_workers(jobs: int | None, methods: int, device: torch.device) -> int:
    # fork only where it is safe and cheap: Linux, CPU (a CUDA context does not survive fork).
    if methods < 2 or device.type != "cpu" or sys.platform != "linux":
        return 1
    return max(1, min(methods, jobs if jobs is not None else default_jobs()))


def _work(p: Planned) -> float:
    """A rough size of a method's training (`Method.work`, else epochs x rounds x samples where
    it has them): the workers take the longest first, so that a long method does not start
    last."""
    if p.method.work is not None:
        return float(p.method.work(p.config))
    cfg = p.config.as_dict()
    size = 1.0
    for key in ("epochs", "rounds", "synthetic"):
        if isinstance(cfg.get(key), int):
            size *= cfg[key]
    return size


def _fuse_forked(plans, run: FuseRun, workers: int) -> list:
    order = sorted(range(len(plans)), key=lambda i: -_work(plans[i]))

    def one(i: int, log, progress):
        try:
            report, error = _outcome(plans[i], replace(run, log=log, progress=progress))
        except EdgeflError as exc:  # a user error met while fusing (e.g. no public set given)
            return None, ("raise", exc.message, exc.hint)
        # An exception crosses the process boundary as text: only its message and hint matter.
        return report, None if error is None else ("refused", error.message, error.hint)

    done = run_forked(order, one, workers, run.log, run.progress)
    outcomes = []
    for i, p in enumerate(plans):
        if isinstance(done[i], Died):
            why = f"{p.method.name}: {done[i].why} while fusing"
            run.log(why)
            hint = "run it alone (--method NAME) or with fewer at once (--jobs 1)"
            outcomes.append((None, FusionError(why, hint=hint)))
            continue
        report, error = done[i]
        if error is not None and error[0] == "raise":
            raise ConfigError(error[1], hint=error[2])
        outcomes.append((report, None if error is None else FusionError(*error[1:])))
    return outcomes


@dataclass(frozen=True)
class _Used:
    """What one method fuses: the uploads it uses, and (file, why not) for those it does not;
    with --robust screen, those screened out, the screen's notes and its verdict."""

    usable: list[Upload]
    skipped: list[tuple[str, str]]
    screened: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    verdict: Any = None


def _fuse_planned(p: Planned, run: FuseRun):
    start = time.perf_counter()
    used = _used(p, run)
    run.log(
        f"{p.method.name}: {len(used.usable)} upload(s) used; {len(run.found.rejected)} rejected"
        + (f"; {len(used.screened)} screened out" if used.screened else "")
    )
    try:
        ctx, result = fuse_one(p, used.usable, run.device, run.log, run.found.uploads, run.progress)
    except FusionError as exc:  # e.g. too few of a kind: say what became of the others
        why = _why_not(run.found.rejected, used.skipped, run.found.folders, used.screened)
        raise FusionError(exc.message + why, exc.hint) from None
    used = _set_aside(p, used, ctx, run.log)
    # Everything is written into a staging folder beside its target and published only once
    # the model, its extra outputs, its evaluation and its report are all complete: a failure
    # or Ctrl-C before then leaves the previous outputs byte-identical.
    with Staging() as stage:
        report = _staged_report(p, run, used, ctx, result, stage)
        report["total_seconds"] = run.found.seconds + time.perf_counter() - start
        text = json.dumps(report, indent=2, default=_jsonable)
        exporters.atomic_write_text(stage.path(p.report), text)
        stage.publish(last=p.report)
    report["report_path"] = str(p.report)
    return report


def _used(p: Planned, run: FuseRun) -> _Used:
    """The uploads the method's contract admits, less those the robust screen leaves out."""
    usable, skipped = select(p.method, run.found)
    if p.config.robust != "screen":
        return _Used(usable, skipped)
    verdict = _screen_verdict(p, run.found, run.device, run.log)
    usable, screened, notes = apply_screen(
        verdict, usable, lambda m: run.log(f"{p.method.name}: {m}")
    )
    if not usable:
        raise FusionError(
            f"{p.method.name}: every upload it could use was screened out",
            hint="see the reasons above; --robust off fuses them all",
        )
    return _Used(usable, skipped, screened, notes, verdict)


def _set_aside(p: Planned, used: _Used, ctx: FusionContext, log) -> _Used:
    """What the method itself set aside (FedAvg's other architectures) joins the pipeline's."""
    aside = {id(u) for u, _ in ctx.aside}
    usable = [u for u in used.usable if id(u) not in aside]
    skipped = used.skipped + [(u.name, why) for u, why in ctx.aside]
    if ctx.aside:  # the line before the fusion counted them as used
        log(f"{p.method.name}: {len(usable)} upload(s) used in the end, {len(ctx.aside)} set aside")
    return replace(used, usable=usable, skipped=skipped)


def _staged_report(
    p: Planned,
    run: FuseRun,
    used: _Used,
    ctx: FusionContext,
    result: FusionResult,
    stage: Staging,
) -> dict[str, Any]:
    """The global model, its device classes' models and extra outputs staged, evaluated, and
    the report on them (all but its total time), the seconds of each stage included."""
    stages = {"ingest": run.found.seconds, **ctx.stages}
    if p.config.robust == "screen":
        stages["screen"] = used.verdict.seconds  # the one judgement all methods of the run share
    staged = stage.path(p.out)
    t = time.perf_counter()
    privacy = privacy_of(used.usable, run.found)
    input_shape = export_global(p, ctx, result, staged, extra={"privacy": privacy})
    stages["export"] = time.perf_counter() - t
    report = _report(p, ctx, run, used, result, staged, stage)
    report["privacy"] = privacy
    if p.classes is not None:
        t = time.perf_counter()
        report["for_classes"] = _for_classes(p, ctx, result, stage, run)
        stages["for_classes"] = time.perf_counter() - t
    if run.eval_ref:
        t = time.perf_counter()
        report |= evaluate_global(p, input_shape, run.eval_ref, run.data_dir, staged)
        stages["eval"] = time.perf_counter() - t
        if near_chance(report.get("accuracy"), ctx.num_classes):
            report["warnings"] = [
                global_warning(
                    p.method.name,
                    report["accuracy"],
                    ctx.num_classes,
                    _val_accuracies(used.usable),
                )
            ]
    report["seconds"] = stages
    report["ingest_stages"] = run.found.stages
    report["uploads_parked"] = sum(u.parked is not None for u in run.found.uploads)
    if run.shared > 1:
        report["ingest_shared_by"] = run.shared  # one ingest served this many methods
    return report


def _for_classes(
    p: Planned, ctx: FusionContext, result: FusionResult, stage: Staging, run: FuseRun
) -> dict[str, Any]:
    """One model per device class of `--for`, staged with the global model (same unit)."""
    if p.method.judged != "global":
        why = (
            f"{p.method.name} yields no global classifier (it is judged per client), so "
            "there is nothing to distil per device class"
        )
        run.log(f"{p.method.name}: --for refused: {why}")
        return {"refused": why}
    teacher = result.model.to("cpu").eval()
    transfer, out = None, {}
    for i, (profile, target) in enumerate(p.class_outs):
        start = time.perf_counter()
        spec, model = device_classes.student_for(profile, ctx, result, p.classes.max_macs)
        if model is None:
            if transfer is None:  # one transfer set serves every class
                transfer = _transfer_set(p, ctx, result, teacher)
            model, entry = _distil_class(p, ctx, run, teacher, transfer, profile, spec, i)
        else:
            entry = {"from": "the global model itself (it fits this class)"}
        staged = stage.path(target)
        sub = FusionResult(model, spec, {})
        extra = {"profile": profile.name, "privacy": privacy_of(ctx.uploads, run.found)}
        shape = export_global(p, ctx, sub, staged, extra=extra)
        if run.eval_ref:
            entry |= evaluate_global(p, shape, run.eval_ref, run.data_dir, staged)
        entry["seconds"] = time.perf_counter() - start
        out[profile.name] = device_classes.class_entry(
            profile, spec, target, staged, sha256_file(staged), **entry
        )
    teacher.to(ctx.device)
    return out


def _transfer_set(p: Planned, ctx: FusionContext, result: FusionResult, teacher):
    """(samples, where they came from): what every device class's student is distilled on."""
    try:
        return device_classes.transfer_set(ctx, result, teacher, p.classes.samples, p.config.seed)
    except RuntimeError as exc:  # e.g. a global model with no gradient to invert
        raise FusionError(
            f"--for: no transfer data for distillation: {exc}",
            hint="use a method that exposes its samples",
        ) from None


def _distil_class(
    p: Planned,
    ctx: FusionContext,
    run: FuseRun,
    teacher,
    transfer,
    profile,
    spec,
    i: int,
) -> tuple[Any, dict[str, Any]]:
    """(the `i`th device class's student distilled from `teacher`, its report entries)."""
    req, name, progress = p.classes, p.method.name, run.progress
    x, source = transfer
    run.log(
        f"{name}: distilling {spec_label(spec)} for {profile.name} on {len(x)} samples ({source})"
    )
    steps = (
        (lambda task, d, n, note="": progress(f"{name} {profile.name} {task}", d, n, note))
        if progress
        else None
    )
    model, history = device_classes.distil(
        teacher,
        spec,
        x,
        epochs=req.epochs,
        seed=p.config.seed + i,
        device=ctx.device,
        progress=steps,
    )
    return model, {
        "from": "distilled",
        "transfer": {"source": source, "samples": len(x)},
        "epochs": req.epochs,
        "temperature": device_classes.TEMPERATURE,
        "loss_history": history,
    }


def _report(
    p: Planned,
    ctx: FusionContext,
    run: FuseRun,
    used: _Used,
    result: FusionResult,
    staged: Path,
    stage: Staging,
) -> dict[str, Any]:
    """The report's entries known once the model is staged: the method's own first, so that
    the core keys below can never be overwritten by a method."""
    found, device = run.found, run.device
    extra = p.method.outputs(result, staged) if p.method.outputs is not None else {}
    # A method names its extra outputs where it wrote them (staged): the report, where they go.
    extra = {k: str(stage.final(v)) if isinstance(v, str | Path) else v for k, v in extra.items()}
    return {
        **result.info,
        **extra,
        "method": p.method.name,
        "paper": p.method.paper,
        "config": p.config.as_dict(),
        "global_model": str(p.out),
        "global_bytes": staged.stat().st_size,
        # The bytes published (a rename moves them unchanged): a reader checks that the model
        # beside this report is the one it describes.
        "global_sha256": sha256_file(staged),
        "extra_outputs": extra,  # every file a method writes beside its global model, named
        "accepted": [
            {
                "file": u.name,
                "client_id": u.client_id,
                "kind": u.kind,
                "model": spec_label(u.spec) if u.spec else None,
            }
            for u in found.uploads
        ],
        "used": [u.client_id for u in used.usable],
        "rejected": [{"file": n, "reason": r} for n, r in found.rejected],
        "skipped": [{"file": n, "reason": r} for n, r in used.skipped],
        # Of skipped, those the method itself set aside (FedAvg's other architectures); those
        # it used in part only (FedMHO-MD's other architectures: teachers, not in w0); and what
        # the global model stands for when the method left uploads out ("5 of 10: vgg9 only").
        "set_aside": [{"file": u.name, "reason": r} for u, r in ctx.aside],
        "partly_used": [{"file": u.name, "reason": r} for u, r in ctx.partly],
        "scope": result.scope,
        "screened": used.screened,  # --robust screen: poisoned-looking uploads left out, and why
        "robust_notes": used.notes,
        "notes": found.notes,
        "folders_not_read": [{"folder": n, "reason": r} for n, r in found.folders],
        "device": str(device),
        "host": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
        },
        "edgefl_version": edgefl.__version__,
    }


def privacy_of(used: list[Upload], found: Ingest) -> dict[str, Any]:
    """The privacy of what a global model was made of, by the uploads' records (recomputed at
    the ingest). Each person's data is in one upload only, so the model is (epsilon, delta)-DP
    for each of them at the largest of the used uploads' own (parallel composition), when
    every used upload is private as a whole; otherwise epsilon is null and `not_private` says
    how many are not."""
    spent = [found.privacy.get(u.name) for u in used]
    private = [s for s in spent if s is not None and s.epsilon is not None]
    whole = len(private) == len(spent) and bool(spent)
    return {
        "max_epsilon_allowed": found.max_epsilon,
        "uploads": len(spent),
        "private": len(private),
        "not_private": len(spent) - len(private),
        "epsilon": max(s.epsilon for s in private) if whole else None,
        "delta": max(s.delta for s in private) if whole else None,
        "accountant": "rdp" if private else None,
        "label_counts_absent": sum("label_counts" not in u.meta for u in used),
        # a simulation's seeded noise: the epsilon it spent, replayable by who knows the seed
        "replayable": sum(s.replayable for s in private),
    }


def _screen_verdict(p: Planned, found: Ingest, device, log, progress=None):
    """The robust screen's verdict on the ingest for this method's seed and probe, judged the
    first time a method asks and kept with the ingest for the others (the decoders' draws, or
    else the method's public set, are the probe: with decoders the public set plays no part)."""
    cfg = p.config
    public = cfg.public_args() if isinstance(cfg, PublicSetConfig) else None
    decoders = any(u.kind == "decoder" for u in found.uploads)
    key = (cfg.seed, None if decoders or public is None else tuple(public.items()))
    if key not in found.screens:
        found.screens[key] = judge_screen(
            found.uploads, device, cfg.seed, public=lambda: _public_probe(public), progress=progress
        )
        v = found.screens[key]
        log(
            f"robust screen ({v.seconds:.1f}s): {len(v.out)} upload(s) screened out, "
            f"{len(v.swap)} used changed"
        )
    return found.screens[key]


def _public_probe(public: dict | None):
    """The public set's samples, for the robust screen to probe with (read only when used)."""
    if public is None:
        return None
    from edgefl.data.public import load_public

    return load_public(**public)


def _val_accuracies(uploads: list[Upload]) -> list[float]:
    """The validation accuracies the classifier uploads declare (numbers only: metadata is data)."""
    out = []
    for u in uploads:
        acc = (u.meta.get("training") or {}).get("val_accuracy") if u.kind == "classifier" else None
        if isinstance(acc, int | float) and not isinstance(acc, bool) and 0 <= acc <= 1:
            out.append(float(acc))
    return out


def run_fuse(job: FuseJob, log=None, progress=None) -> dict[str, Any]:
    """One method over one upload directory (`server fuse --method M --out G.onnx`)."""
    p = plan(job.method, job.options, job.out, job.uploads, job.report, overwrite=job.overwrite)
    resolve_device(job.device)  # a bad --device fails before the uploads are read
    return fuse_methods(
        [p],
        job.uploads,
        device=job.device,
        eval=job.eval,
        data_dir=job.data_dir,
        strict=job.strict,
        max_upload_bytes=job.max_upload_bytes,
        jobs=job.jobs,
        resident_mib=job.resident_mib,
        max_epsilon=job.max_epsilon,
        keep_going=False,
        log=log,
        progress=progress,
    )[p.method.name]


def _jsonable(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)
