"""The server pipeline every method shares, in named stages, read top to bottom here:

    plan (options, output paths: checked before any long work) -> claim (--eval and public
    sets resolved, the outputs locked) -> count (a method over its max_teachers by what the
    files declare, refused) -> ingest (once per run) -> select (what each method can use) ->
    fuse -> export -> extra outputs -> evaluate -> report -> publish

Each stage's work lives in a module named for it: plan and claim in edgefl.server.plan, ingest
in .ingest, select (the robust screen included) in .selection, export and evaluate in .export,
the models per device class (--for) in .class_models, the report in .report, the forked
workers in .workers; this module runs them in order.

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
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

import exporters
from edgefl.artifacts import Upload
from edgefl.errors import EdgeflError, FusionError
from edgefl.fusion.base import FusionContext, FusionResult
from edgefl.fusion.caps import over_caps
from edgefl.fusion.options import effective
from edgefl.outputs import Staging, lock_outputs
from edgefl.progress import log_lines, no_progress
from edgefl.server import classes as device_classes
from edgefl.server.ingest import (
    Ingest,
    check_jobs,
    check_max_epsilon,
    ingest,
    parking,
    resident_limit,
)
from edgefl.server.plan import (
    FuseRun,
    Planned,
    check_eval_declared,
    check_eval_fits,
    check_inputs,
    check_replacing,
    plan,
    resolve_device,
)
from edgefl.server.report import jsonable, staged_report
from edgefl.server.selection import screen_verdict, set_aside, uses, why_not
from edgefl.server.workers import fuse_forked, method_workers


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


# --- the pipeline ---------------------------------------------------------------------------


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
    _check_run(plans, eval, data_dir, jobs, max_epsilon, resident_mib)
    check_eval_declared(uploads, eval, recursive=recursive, max_bytes=max_upload_bytes)
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
            log_lines(log, f"{name} refused: {error.message}")
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


def _check_run(plans, eval_ref, data_dir, jobs, max_epsilon, resident_mib) -> None:
    """What the run reads besides the uploads and how: before the folder is read to count or
    check a file."""
    check_inputs(plans, eval_ref, data_dir)
    check_jobs(jobs)
    check_max_epsilon(max_epsilon)
    resident_limit(resident_mib)


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
    check_eval_fits(run.found.uploads, run.eval_ref)  # before any method, not after
    _check_classes(plans, run.found)
    plans = _in_effect(plans, run.found)
    for p in plans:  # before workers fork: they all read the one verdict
        if p.config.robust == "screen":
            screen_verdict(p, run.found, run.device, run.log, run.progress)
    workers = method_workers(jobs, len(plans), run.device)
    if workers > 1:
        # The cores go to the methods that train (`Method.trains`): one that trains beside an
        # average still gets a forked worker of its own (a kill costs its task only), with
        # every core.
        crew = max(1, min(workers, sum(p.method.trains for p in plans)))
        return fuse_forked(plans, run, crew, _outcome)
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
                log_lines(log, f"{name} refused: {error.message}")
            report = refused_report(name, error)
        reports[name] = report
    return reports


def refused_report(method: str, error: EdgeflError) -> dict[str, Any]:
    """A method's report slot when it could not fuse: a result of the run, not a crash."""
    return {"method": method, "error": error.message, "used": [], "total_seconds": 0.0}


def _outcome(p: Planned, run: FuseRun):
    """(report, None) or (None, the FusionError that refused it)."""
    try:
        return _fuse_planned(p, run), None
    except FusionError as exc:
        return None, exc


def _fuse_planned(p: Planned, run: FuseRun):
    start = time.perf_counter()
    used = uses(p, run)
    run.log(
        f"{p.method.name}: {len(used.usable)} upload(s) used; {len(run.found.rejected)} rejected"
        + (f"; {len(used.screened)} screened out" if used.screened else "")
    )
    try:
        ctx, result = fuse_one(p, used.usable, run.device, run.log, run.found.uploads, run.progress)
    except FusionError as exc:  # e.g. too few of a kind: say what became of the others
        why = why_not(run.found.rejected, used.skipped, run.found.folders, used.screened)
        raise FusionError(exc.message + why, exc.hint) from None
    used = set_aside(p, used, ctx, run.log)
    # Everything is written into a staging folder beside its target and published only once
    # the model, its extra outputs, its evaluation and its report are all complete: a failure
    # or Ctrl-C before then leaves the previous outputs byte-identical.
    with Staging() as stage:
        report = staged_report(p, run, used, ctx, result, stage)
        report["total_seconds"] = run.found.seconds + time.perf_counter() - start
        text = json.dumps(report, indent=2, default=jsonable)
        exporters.atomic_write_text(stage.path(p.report), text)
        stage.publish(last=p.report)
    report["report_path"] = str(p.report)
    return report


# --- stage: fuse ---------------------------------------------------------------------------


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
