"""Run a paper's table at a named budget, cell by cell, and set our numbers beside the paper's.

A cell is one setting x partition x seed: one `edgefl simulate` run in its own directory,
`<out>/<setting>/<partition>-s<seed>/`. A cell whose results.json shows it finished with the
settings asked for now is skipped; a half-finished one resumes (simulate reuses its finished
uploads and global models); one made with other settings stops the run before any work, saying
what differs. The summary (JSON, markdown, PNG) is rewritten atomically after every cell, so an
interrupted run keeps the table of what it finished.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

import exporters
from edgefl.bounds import Range, check_fields, declare, declared
from edgefl.data.partition import parse_scheme
from edgefl.errors import ConfigError, UnknownNameError
from edgefl.fusion import paper_reference
from edgefl.fusion.layering import layer
from edgefl.progress import no_progress, printable
from edgefl.reproduce.render import plot_table, table_markdown
from edgefl.reproduce.tables import TABLES, Budget, Table
from edgefl.server.plan import resolve_device
from edgefl.simulate.job import SEARCH, SimJob
from edgefl.simulate.run import check_dp_models, check_resumable, simulate
from edgefl.training import SEED

OWN = "own"  # --federation: each method in its own paper's client setting


@declared(table="fedmho-table3")
@dataclass(frozen=True)
class ReproduceJob:
    table: str
    budget: str = "cpu"
    dataset: str | None = None  # the table's block for this dataset (default: the table's own)
    out: str = "runs/reproduce"
    seeds: tuple[int, ...] | None = None  # default: the budget's
    partitions: tuple[str, ...] | None = None  # default: the budget's
    # "own": each method in its paper's setting; a setting's name: every method of the table
    # in that one federation (e.g. "fedmho": all methods on the FedMHO federation's uploads).
    federation: str = OWN
    # Only these rows of the table (each in its setting; a setting none of them is in does not
    # run); default: every method.
    methods: tuple[str, ...] | None = None
    jobs: int = declare(Range(1, integer=True), 1, hint="e.g. --jobs 2")
    device: str = "auto"  # fusion
    train_device: str = "cpu"  # client training
    data_dir: str | None = None

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class Cell:
    setting: str
    partition: str
    seed: int
    sim: SimJob

    @property
    def label(self) -> str:
        return f"{self.setting} {self.partition} seed {self.seed}"


def resolve(job: ReproduceJob) -> tuple[Table, Budget]:
    """The table and budget, after every check a user can fail (before any work)."""
    table = TABLES.get(job.table).on(job.dataset)  # unknown: UnknownNameError listing them
    if job.budget not in table.budgets:
        raise ConfigError(
            f"--budget must be one of {', '.join(table.budgets)} for {table.name}, "
            f"got {job.budget!r}",
            hint="; ".join(f"{b.name}: {b.description}" for b in table.budgets.values()),
        )
    _check_rows(job, table)
    if job.seeds is not None:
        if not job.seeds:
            raise ConfigError("--seeds names no seed", hint="--seeds 0,1,2")
        for seed in job.seeds:
            SEED.check("--seeds", seed, hint="--seeds 0,1,2")
        _once("--seeds", [str(s) for s in job.seeds], "--seeds 0,1,2")
    schemes = []
    for p in job.partitions or ():
        try:
            schemes.append(str(parse_scheme(p)))
        except ConfigError:
            raise ConfigError(
                f"--partitions: invalid partition {p!r}",
                hint="e.g. --partitions dirichlet:0.5,dirichlet:0.1",
            ) from None
    _once("--partitions", schemes, "--partitions dirichlet:0.5,dirichlet:0.1")
    resolve_device(job.device, "--device")
    resolve_device(job.train_device, "--train-device")
    check_out_dir(job.out, output_stem(job))  # last: it makes the folder
    return table, table.budgets[job.budget]


def _once(flag: str, values: list[str], example: str) -> None:
    """A seed or partition named twice would be one cell counted twice in its mean."""
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise ConfigError(f"{flag} names {', '.join(twice)} more than once", hint=f"e.g. {example}")


def _check_rows(job: ReproduceJob, table: Table) -> None:
    """--federation names a setting of the table (or own); --methods names its rows."""
    names = [s.name for s in table.settings]
    if job.federation != OWN and job.federation not in names:
        raise ConfigError(
            f"--federation must be {OWN} or one of {', '.join(names)}, got {job.federation!r}",
            hint=f"{OWN}: each method in its paper's client setting; a setting: every method "
            "of the table on that setting's uploads",
        )
    if job.methods is not None and not job.methods:
        raise ConfigError("--methods names no method", hint=f"e.g. --methods {table.methods[0]}")
    _once("--methods", list(job.methods or ()), f"--methods {','.join(table.methods[:2])}")
    for m in job.methods or ():
        if m not in table.methods:
            raise UnknownNameError(f"{table.name} method", m, table.methods)


def check_out_dir(out: str, stem: str = "table") -> None:
    """--out must be a folder this process can create and write in (made now if missing), and
    the table's files in it files (one that is a folder failed after the first cell)."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {out} is a file", hint="name a folder, e.g. --out runs/table3")
    for suffix in (".json", ".md", ".png"):
        if (path / f"{stem}{suffix}").is_dir():
            raise ConfigError(
                f"{path / (stem + suffix)} is a folder: the table is written there",
                hint="move it away, or use another --out",
            )
    _check_table_files_are_ours(path, stem)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ConfigError(
            f"--out {out} cannot be written: {exc.strerror or exc}",
            hint="name a folder you can write, e.g. --out runs/table3",
        ) from None


def _check_table_files_are_ours(path: Path, stem: str) -> None:
    """A table file already in --out is rewritten only if an earlier reproduce wrote it (its
    JSON names a table): a user's own table.json or table.md there was replaced, exit 0."""
    data, page = path / f"{stem}.json", path / f"{stem}.md"
    ours = False
    if data.is_file():
        try:
            held = json.loads(data.read_text(errors="replace"))
            ours = isinstance(held, dict) and isinstance(held.get("table"), str)
        except (ValueError, TypeError, OSError):
            ours = False
    theirs = [f for f in (data, page) if f.is_file() and not ours]
    if theirs:
        raise ConfigError(
            f"--out {path} holds {', '.join(str(f) for f in theirs)}, which edgefl reproduce did "
            "not write: the table would replace it",
            hint="use another --out, or move the file away",
        )


def rows_of(job: ReproduceJob, table: Table) -> tuple[str, ...]:
    """The table's methods this job reports (--methods), in the table's order."""
    return tuple(m for m in table.methods if job.methods is None or m in job.methods)


def cells(job: ReproduceJob, table: Table, budget: Budget) -> list[Cell]:
    settings = table.settings if job.federation == OWN else (table.setting(job.federation),)
    rows = rows_of(job, table)
    out = []
    for setting in settings:
        methods = tuple(
            m for m in (setting.methods if job.federation == OWN else rows) if m in rows
        )
        if not methods:  # --methods names none of this setting's rows
            continue
        models = {prof: budget.substitutes.get(m, m) for prof, m in setting.models.items()}
        extra = _client_settings(table, budget, models)
        fuse = layer(
            methods,
            budget.fusion,
            targeted={m: o for m, o in budget.fuse_options.items() if m in methods},
        )
        for partition in job.partitions or budget.partitions:
            for seed in job.seeds if job.seeds is not None else budget.seeds:
                run_dir = Path(job.out) / setting.name / f"{partition.replace(':', '')}-s{seed}"
                sim = SimJob(
                    dataset=table.dataset,
                    clients=table.clients,
                    partition=partition,
                    mix=table.mix,
                    methods=methods,
                    seed=seed,
                    out=str(run_dir),
                    jobs=job.jobs,
                    device=job.device,
                    train_device=job.train_device,
                    client_models=models,
                    fuse_options=fuse,
                    data_dir=job.data_dir,
                    **extra,
                )
                out.append(Cell(setting.name, partition, seed, sim))
    return out


def _client_settings(table: Table, budget: Budget, models: dict[str, str]) -> dict[str, Any]:
    """The SimJob fields a setting's clients take from the budget: the table's public split
    unless the budget sets its own (a smaller subset's); search options only where they search."""
    extra = {"public_size": table.public_size} | budget.simulate
    if not any(m.startswith(SEARCH) for m in models.values()):
        extra.pop("search_options", None)
    return extra


# What may differ between runs of one cell without changing its results.
_VOLATILE = {"out", "jobs", "device", "train_device", "data_dir", "methods", "fuse_options"}


def _plain(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def finished_cell(cell: Cell) -> dict | None:
    """The results of a cell a previous run finished with the same settings, else None."""
    path = Path(cell.sim.out) / "results.json"
    if not path.exists():
        return None
    done = json.loads(path.read_text())
    have, want = done.get("job", {}), _plain(asdict(cell.sim))
    if any(have.get(k) != v for k, v in want.items() if k not in _VOLATILE):
        return None
    rows = {r["method"]: r for r in done.get("results", [])}
    for m in cell.sim.methods:
        if m not in rows or have["fuse_options"].get(m) != want["fuse_options"].get(m):
            return None
        if rows[m].get("error"):  # refused then: fused again (only the method's fusion reruns)
            return None
    return done


def check_table_kept(job: ReproduceJob, todo: list[Cell]) -> None:
    """The table in --out is rewritten whole from this run's cells and methods: one that holds
    a method or cell this run leaves out (a narrower --methods, --seeds or --partitions) would
    lose it silently, so the run stops first and says what to name."""
    path = Path(job.out) / f"{output_stem(job)}.json"
    try:
        had = json.loads(path.read_text())
        methods = {r["method"] for r in had["rows"]}
        cells = {(c["setting"], c["partition"], c["seed"]) for c in had["cells"]}
    except (OSError, ValueError, KeyError, TypeError):
        return  # none, or not a table: nothing of a table's to lose
    asked = {m for c in todo for m in c.sim.methods}
    lost = sorted(m for m in methods if isinstance(m, str) and m not in asked)
    lost += [
        f"{s} {p} seed {seed}"
        for s, p, seed in sorted(cells - {(c.setting, c.partition, c.seed) for c in todo}, key=str)
    ]
    if lost:
        shown = ", ".join(map(printable, lost[:4])) + (", ..." if lost[4:] else "")
        raise ConfigError(
            f"{path} holds {shown} as well; this run would rewrite it without them",
            hint="name them too (their finished cells are reused), or use another --out",
        )


def output_stem(job: ReproduceJob) -> str:
    return "table" if job.federation == OWN else f"table-{job.federation}-federation"


def reproduce(job: ReproduceJob, log=None, progress=None) -> dict:
    """`log(text)` gets the table's lines; `progress(task, done, total, note)` each cell's own
    steps (clients trained, a method's epochs and teachers), named by the cell's place."""
    log = log or (lambda m: None)
    progress = progress or no_progress
    table, budget = resolve(job)
    todo = cells(job, table, budget)
    for c in todo:  # a bad model name or option fails here, not after an hour
        c.sim.validate()
        check_dp_models(c.sim)
    check_table_kept(job, todo)
    previous = [finished_cell(c) for c in todo]
    for c, done in zip(todo, previous, strict=True):
        if done is None and Path(c.sim.out).exists():
            check_resumable(c.sim)
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    n, reused = len(todo), sum(d is not None for d in previous)
    log(
        f"{table.name} at budget {budget.name}: {n} cells ({reused} finished earlier); "
        f"{budget.estimate}"
    )
    records: list[dict] = []
    spent: dict[str, list[float]] = {}  # setting -> seconds of its cells run here
    summary: dict = {}
    for i, (c, done) in enumerate(zip(todo, previous, strict=True), 1):
        if done is not None:
            log(f"[{i}/{n}] {c.label}: finished earlier, skipped")
        else:
            rest = zip(todo[i - 1 :], previous[i - 1 :], strict=True)
            secs = time_left([t.setting for t, d in rest if d is None], spent)
            eta = f", about {secs / 60:.0f} min left" if secs is not None else ""
            models = ", ".join(f"{p} {m}" for p, m in c.sim.client_models.items())
            log(f"[{i}/{n}] {c.label}: {models} -> {', '.join(c.sim.methods)}{eta}")
            t = time.perf_counter()
            done = simulate(
                c.sim,
                log=lambda m, i=i: log(f"  [{i}/{n}] {m}"),
                progress=lambda task, *a, i=i: progress(f"  [{i}/{n}] {task}", *a),
            )
            spent.setdefault(c.setting, []).append(time.perf_counter() - t)
            log(f"[{i}/{n}] {c.label}: done in {spent[c.setting][-1]:.0f} s")
        records.append(cell_record(c, done, skipped=previous[i - 1] is not None))
        summary = summarize(job, table, budget, records, planned=n)
        write(out / output_stem(job), summary)
    return summary


def time_left(settings: list[str], spent: dict[str, list[float]]) -> float | None:
    """Seconds the cells of `settings` (one entry a cell) will take: each at the mean of its
    setting's cells run so far, a setting not yet run at the mean of all (a table's settings
    differ by 10x: pFedZKD's searched clients against the baselines' CNNs). None before any."""
    every = [s for times in spent.values() for s in times]
    if not every:
        return None
    overall = sum(every) / len(every)
    return sum(sum(spent[s]) / len(spent[s]) if spent.get(s) else overall for s in settings)


def cell_record(cell: Cell, results: dict, skipped: bool) -> dict:
    return {
        "setting": cell.setting,
        "partition": cell.partition,
        "seed": cell.seed,
        "dir": cell.sim.out,
        "skipped": skipped,
        "seconds": results["seconds"],
        "results": [
            {k: r.get(k) for k in ("method", "accuracy", "error", "fuse_seconds", "scope")}
            for r in results["results"]
            if r["method"] in cell.sim.methods
        ],
        "clients": [
            {k: c.get(k) for k in ("client_id", "profile", "role", "model")}
            for c in results["clients"]
        ],
    }


def command_of(job: ReproduceJob) -> str:
    """The command that makes this table again: every option that chooses its cells or where
    they are (a finished cell in --out is reused, so the same --out finishes an interrupted
    table); --jobs and the devices change how fast, not which cells."""
    words = ["edgefl", "reproduce", job.table, "--budget", job.budget]
    for flag, value in (
        ("--dataset", job.dataset),
        ("--federation", None if job.federation == OWN else job.federation),
        ("--methods", job.methods and ",".join(job.methods)),
        ("--partitions", job.partitions and ",".join(job.partitions)),
        ("--seeds", job.seeds and ",".join(map(str, job.seeds))),
        ("--data-dir", job.data_dir),
        ("--out", job.out),
    ):
        if value:
            words += [flag, str(value)]
    return shlex.join(words)


def summarize(
    job: ReproduceJob,
    table: Table,
    budget: Budget,
    records: list[dict],
    planned: int | None = None,
) -> dict:
    """Per method and partition: our accuracies over the finished seeds (mean +- sample std),
    the paper's number (the method's registry reference) and the gap, ours - paper. `planned`:
    the cells the job asked for (default: those recorded); fewer recorded is a partial table."""
    partitions = list(job.partitions or budget.partitions)
    rows = []
    for m in rows_of(job, table):
        setting = table.setting_of(m).name if job.federation == OWN else job.federation
        per = {p: _partition_summary(table, m, setting, p, records) for p in partitions}
        rows.append({"method": m, "setting": setting, "partitions": per})
    return {
        "table": table.name,
        "title": table.title,
        "source": table.source,
        "dataset": table.dataset,
        "clients": table.clients,
        "federation": job.federation,
        "budget": asdict(budget),
        "partitions": partitions,
        "settings": [
            {
                "name": s.name,
                "description": s.description,
                "methods": list(s.methods),
                "models": {p: budget.substitutes.get(v, v) for p, v in s.models.items()},
                "paper_models": s.models,
            }
            for s in table.settings
            if job.federation == s.name
            or (job.federation == OWN and set(s.methods) & set(rows_of(job, table)))
        ],
        "notes": list(table.notes),
        "rows": rows,
        "cells": records,
        "cells_planned": len(records) if planned is None else planned,
        "complete": planned is None or len(records) >= planned,
        "command": command_of(job),
        "job": _plain(asdict(job)),
        "host": {
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


def _partition_summary(
    table: Table, m: str, setting: str, p: str, records: list[dict]
) -> dict[str, Any]:
    """Method `m` on partition `p` in `setting`, over the seeds the records finished."""
    hits = [  # (seed, m's result in that cell)
        (r["seed"], x)
        for r in records
        if (r["setting"], r["partition"]) == (setting, p)
        for x in r["results"]
        if x["method"] == m
    ]
    # Rounded to 4 decimals (a test set's accuracy in percent has 2 or 3): the JSON reads
    # 12.74, not the float sum's 12.740000000000002.
    accs = [(s, round(100 * x["accuracy"], 4)) for s, x in hits if x["accuracy"] is not None]
    scopes = _scopes(hits)
    values = [a for _, a in accs]
    mean, std = map(_rounded, _mean_std(values))
    paper = paper_reference(table.dataset, p, table.clients, table.source).get(m)
    return {
        "seeds": [s for s, _ in accs],
        "accuracies": values,
        "n": len(values),
        "mean": mean,
        "std": std,
        "paper": paper,
        # Not the paper's row when part of the federation was left out: no gap.
        "gap": None if mean is None or paper is None or scopes else round(mean - paper, 4),
        "scope": scopes,
        "error": next((x["error"] for _, x in hits if x["accuracy"] is None), None),
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """(mean, sample std) of `values`: std 0 for one value, both None for none."""
    mean = statistics.mean(values) if values else None
    std = statistics.stdev(values) if len(values) > 1 else (0.0 if values else None)
    return mean, std


def _scopes(hits: list[tuple[int, dict]]) -> dict[str, list[int]]:
    """What the numbers stand for where a method fused part of the federation only (FedAvg over
    two architectures: "5 of 10: vgg9 only"), with the seeds it held for."""
    scopes: dict[str, list[int]] = {}
    for seed, x in hits:
        if x.get("scope") and x["accuracy"] is not None:
            scopes.setdefault(x["scope"], []).append(seed)
    return scopes


def write(stem: Path, summary: dict) -> None:
    """JSON, markdown and PNG beside each other, each written atomically."""
    exporters.atomic_write_text(stem.with_suffix(".json"), json.dumps(summary, indent=2))
    exporters.atomic_write_text(stem.with_suffix(".md"), table_markdown(summary))
    plot_table(summary, stem.with_suffix(".png"))


__all__ = ["Cell", "ReproduceJob", "cells", "reproduce", "resolve", "summarize"]
