"""PSO-FedNAS (pFedZKD, Yang et al., Appl. Sci. 2026, Sec. 3.2; shared/papers/pfedzkd.txt).

As in the paper (Algorithm 2): each particle is a variable-length `nas-cnn` gene sequence
(conv/pool genes, first a conv, the FC head last; P(conv) = 0.7, P(pool) = 0.3); fitness is the
validation cross-entropy after `candidate_epochs` epochs of local training; the discrete update
builds a target layer by layer (gBest[j] with probability Cg, else pBest_i[j]) and aligns the
particle to it: insert/delete genes until the lengths match, then replace every gene whose type
differs (same-type genes keep their own widths).

Beyond the paper: the device profile is a hard constraint. Every particle is checked with
`check_fit` (MACs -> epoch time, training memory at the profile's batch size and optimizer,
inference peak, storage) before it is trained; an infeasible draw is redrawn with tighter caps,
an infeasible update is repaired by greedy shrinking (narrower convs, smaller kernels, fewer or
narrower FC layers, an extra early pool, fewer convs). Nothing infeasible is trained or returned.

This module is the search loop; its options are in `pso_config`, the particles in `genes`,
the budget and its repair in `budget`.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from edgefl.data.registry import DatasetInfo
from edgefl.errors import BudgetError, ConfigError, DataError
from edgefl.models.cost import costs
from edgefl.models.nas import arch_string
from edgefl.models.spec import ModelSpec
from edgefl.profiles import Profile
from edgefl.progress import fmt_seconds, no_progress
from edgefl.search.budget import Budget, repair, sample_feasible
from edgefl.search.genes import Genes, align, make_target
from edgefl.search.pso_config import PSOConfig
from edgefl.training import DEFAULT_LR, TrainConfig, init_model, stop_if_interrupted, train

Status = Callable[[str], None]
METHODS = ("pso",)


@dataclass
class Candidate:
    """One architecture trained during the search."""

    genes: Genes
    arch: str
    generation: int  # 0 = the initial swarm
    params: int
    macs: int
    train_bytes: int
    infer_bytes: int
    val_accuracy: float
    fitness: float  # validation cross-entropy (lower is better)
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fitness"] = d["fitness"] if math.isfinite(d["fitness"]) else None  # JSON has no inf
        return d


@dataclass
class SearchResult:
    spec: ModelSpec
    best: Candidate
    candidates: list[Candidate]  # every distinct architecture trained, in order
    history: list[dict[str, Any]]  # per generation: best fitness so far and its costs
    evaluations: int  # particle evaluations (repeats of an architecture reuse its fitness)
    seconds: float
    config: PSOConfig
    profile: Profile
    budget: dict[str, Any] = field(default_factory=dict)
    estimate_seconds: float | None = None  # said before the search (estimate_search_seconds)

    def as_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_dict(),
            "arch": self.best.arch,
            "best": self.best.as_dict(),
            "costs": costs(self.spec).as_dict(),
            "budget": self.budget,
            "history": self.history,
            "candidates": [c.as_dict() for c in self.candidates],
            "evaluations": self.evaluations,
            "seconds": self.seconds,
            "config": self.config.as_dict(),
            "profile": self.profile.name,
            "estimate_seconds": self.estimate_seconds,
        }


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


# Flags that shorten a search, as `edgefl search` names them (`client train --search` has the
# first three).
SHORTEN_FLAGS = ("--particles", "--generations", "--candidate-epochs")


def estimate_search_seconds(
    budget: Budget,
    cfg: PSOConfig,
    train_cfg: TrainConfig,
    x_tr,
    y_tr,
    num_classes: int,
    seed: int,
    probes: int = 3,
    batches: int = 2,
) -> float:
    """Seconds the whole search should take here: `batches` batches of training timed on
    `probes` feasible candidates drawn with their own generator (the search's draws, weights
    and results are untouched), times samples x epochs x particles x (generations + 1), plus
    a third for validation. An upper bound: a repeated architecture is not trained again."""
    rng = np.random.default_rng([seed, 0x5EA7C4])  # never the search's generator
    n = min(len(x_tr), batches * train_cfg.batch_size)
    probe_cfg = TrainConfig(
        epochs=1,
        batch_size=train_cfg.batch_size,
        optimizer=train_cfg.optimizer,
        lr=train_cfg.lr,
        seed=seed,
    )
    per_sample = []
    with torch.random.fork_rng(devices=[]):
        for i in range(probes + 1):
            spec = budget.spec(sample_feasible(rng, budget, cfg))
            model = init_model(spec, seed)
            t = time.perf_counter()
            train(model, "classifier", x_tr[:n], y_tr[:n], num_classes, probe_cfg)
            if i:  # the first draw warms up (allocators, kernels): not timed
                per_sample.append((time.perf_counter() - t) / n)
    per_candidate = float(np.mean(per_sample)) * len(x_tr) * cfg.candidate_epochs * 4 / 3
    return per_candidate * cfg.particles * (cfg.generations + 1)


def search_architecture(
    profile: Profile,
    info: DatasetInfo,
    local: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    *,
    samples: int | None = None,
    batch_size: int | None = None,
    seed: int = 0,
    config: PSOConfig | None = None,
    on_status: Status | None = None,
    on_progress=None,
    shorten: tuple[str, ...] = SHORTEN_FLAGS,
    estimate: bool = True,
) -> SearchResult:
    """Algorithm 2 of the paper under the device budget. `local` = (x_tr, y_tr, x_val, y_val).
    `on_progress(task, done, total, note)` follows the candidate evaluations. With `estimate`,
    the time the search will take is said first (`shorten`: the flags that cut it)."""
    cfg = config or PSOConfig()
    status = on_status or (lambda msg: None)
    total_evals = cfg.particles * (cfg.generations + 1)
    rng = np.random.default_rng(seed)
    data = _fitness_data(local, cfg, rng)
    budget = Budget(
        profile,
        info.input_shape,
        info.num_classes,
        samples=samples or len(local[0]),
        batch_size=batch_size,
        max_macs=cfg.max_macs,
    )
    train_cfg = _candidate_training(profile, cfg, batch_size, seed)
    start = time.perf_counter()
    evals = _Evaluations(budget, data, train_cfg, on_progress or no_progress, total_evals)
    status(
        f"PSO-FedNAS on {profile.name}: {cfg.particles} particles x ({cfg.generations} "
        f"generations + the first swarm) = {total_evals} candidates, {cfg.candidate_epochs} "
        f"epoch(s) each on {len(data[0]):,} samples"
    )
    guess = None
    if estimate:
        guess = estimate_search_seconds(budget, cfg, train_cfg, *data[:2], info.num_classes, seed)
        status(
            f"this will take about {fmt_seconds(guess)} here (at most: a repeated architecture "
            f"is not trained again); shorter with smaller {', '.join(shorten)}"
        )
    evals.progress("search candidate", 0, total_evals)
    gbest, gbest_c, history = _swarm(rng, budget, cfg, evals.evaluate, status)
    return SearchResult(
        spec=budget.spec(gbest),
        best=gbest_c,
        candidates=evals.order,
        history=history,
        evaluations=evals.count,
        seconds=time.perf_counter() - start,
        config=cfg,
        profile=profile,
        estimate_seconds=guess,
        budget=_budget_record(budget, cfg, train_cfg.batch_size),
    )


def _candidate_training(
    profile: Profile, cfg: PSOConfig, batch_size: int | None, seed: int
) -> TrainConfig:
    """How every candidate is trained: the profile's optimizer and batch size."""
    return TrainConfig(
        epochs=cfg.candidate_epochs,
        batch_size=batch_size or profile.batch_size,
        optimizer=profile.optimizer,
        lr=DEFAULT_LR[("classifier", profile.optimizer)],
        seed=seed,
    )


def _fitness_data(local, cfg: PSOConfig, rng: np.random.Generator):
    """(x_tr, y_tr, x_val, y_val) candidates are trained and scored on: a held-out fifth of a
    shard with no validation split, then at most `cfg.fitness_samples` training samples."""
    x_tr, y_tr, x_val, y_val = local
    if len(x_tr) < 2:
        raise DataError(
            f"architecture search needs local training data, got {len(x_tr)} sample(s)",
            hint="use fewer clients, a larger alpha, or another --client-index",
        )
    if len(x_val) == 0:  # a tiny shard: hold out a fifth of the training samples instead
        order = rng.permutation(len(x_tr))
        cut = max(1, len(x_tr) // 5)
        x_val, y_val, x_tr, y_tr = (
            x_tr[order[:cut]],
            y_tr[order[:cut]],
            x_tr[order[cut:]],
            y_tr[order[cut:]],
        )
    if cfg.fitness_samples and cfg.fitness_samples < len(x_tr):
        keep = np.sort(rng.choice(len(x_tr), cfg.fitness_samples, replace=False))
        x_tr, y_tr = x_tr[keep], y_tr[keep]
    return x_tr, y_tr, x_val, y_val


class _Evaluations:
    """Every particle evaluation of one search: each distinct architecture is trained once,
    in order; a repeat reuses its candidate."""

    def __init__(self, budget: Budget, data, train_cfg: TrainConfig, progress, total: int):
        self.budget, self.data, self.train_cfg = budget, data, train_cfg
        self.progress, self.total = progress, total
        self.seen: dict[str, Candidate] = {}
        self.order: list[Candidate] = []  # every distinct architecture trained, in order
        self.count = 0  # particle evaluations, repeats included

    def evaluate(self, genes: Genes, generation: int) -> Candidate:
        self.count += 1
        key = json.dumps(genes, sort_keys=True)
        if key not in self.seen:  # same architecture, same seed: same fitness; skip retraining
            cand = self._train(genes, generation)
            self.seen[key] = cand
            self.order.append(cand)
        best = min(self.seen.values(), key=lambda c: c.fitness)
        self.progress(
            "search candidate",
            self.count,
            self.total,
            f"generation {generation}, best val CE {best.fitness:.4f}",
        )
        return self.seen[key]

    def _train(self, genes: Genes, generation: int) -> Candidate:
        chk = self.budget.check(genes)
        if not chk.fits:  # never reached: every particle is repaired first
            raise BudgetError(
                f"internal: {arch_string(genes)} does not fit the budget",
                hint="report it with the profile and dataset: the search's own bound failed",
            )
        spec = self.budget.spec(genes)
        x_tr, y_tr, x_val, y_val = self.data
        t = time.perf_counter()
        model = init_model(spec, self.train_cfg.seed)
        try:
            s = train(
                model,
                "classifier",
                x_tr,
                y_tr,
                self.budget.num_classes,
                self.train_cfg,
                x_val=x_val,
                y_val=y_val,
            )
            fitness, acc = float(s.val_loss), float(s.val_accuracy)
        except ConfigError:  # diverged: the worst possible fitness, the search goes on
            fitness, acc, s = math.inf, 0.0, None
        stop_if_interrupted(s)
        c = costs(spec)
        return Candidate(
            genes,
            arch_string(genes),
            generation,
            c.params,
            c.macs,
            chk.fit.train_bytes,
            c.infer_peak_bytes,
            acc,
            fitness,
            time.perf_counter() - t,
        )


def _swarm(
    rng: np.random.Generator,
    budget: Budget,
    cfg: PSOConfig,
    evaluate: Callable[[Genes, int], Candidate],
    status: Status,
) -> tuple[Genes, Candidate, list[dict[str, Any]]]:
    """The PSO loop: (gBest, its candidate, the per-generation history)."""
    particles = [sample_feasible(rng, budget, cfg) for _ in range(cfg.particles)]
    scores = [evaluate(p, 0) for p in particles]
    pbest, pbest_c = [copy.deepcopy(p) for p in particles], list(scores)
    g = int(np.argmin([c.fitness for c in scores]))
    gbest, gbest_c = copy.deepcopy(particles[g]), scores[g]
    history = [_report(0, cfg.generations, gbest_c, budget, status)]
    for t in range(1, cfg.generations + 1):
        for i in range(cfg.particles):
            target = make_target(pbest[i], gbest, cfg.cg, rng)
            moved = align(particles[i], target, rng, cfg, budget.input_shape)
            particles[i] = repair(moved, budget, cfg) or sample_feasible(rng, budget, cfg)
            cand = evaluate(particles[i], t)
            if cand.fitness < pbest_c[i].fitness:
                pbest[i], pbest_c[i] = copy.deepcopy(particles[i]), cand
                if cand.fitness < gbest_c.fitness:
                    gbest, gbest_c = copy.deepcopy(particles[i]), cand
        history.append(_report(t, cfg.generations, gbest_c, budget, status))
    return gbest, gbest_c, history


def _budget_record(budget: Budget, cfg: PSOConfig, batch: int) -> dict[str, Any]:
    p = budget.profile
    return {
        "ram_budget_bytes": p.ram_budget_bytes,
        "storage_bytes": p.storage_bytes,
        "max_epoch_seconds": p.max_epoch_seconds,
        "max_macs": cfg.max_macs,
        "batch_size": batch,
        "optimizer": p.optimizer,
        "samples": budget.samples,
    }


def _report(t: int, total: int, best: Candidate, budget: Budget, status: Status) -> dict:
    ram = budget.profile.ram_budget_bytes
    fit = budget.check(best.genes).fit
    status(
        f"generation {t}/{total}: best val CE {best.fitness:.4f} (acc {100 * best.val_accuracy:.1f}%)"
        f" {best.arch}; {best.macs:,} MACs, train {_mib(best.train_bytes)} / infer "
        f"{_mib(best.infer_bytes)} of {_mib(ram)}, est. {fit.epoch_seconds:.1f} s/epoch of "
        f"{budget.profile.max_epoch_seconds:.0f} s"
    )
    return {
        "generation": t,
        "fitness": best.as_dict()["fitness"],
        "val_accuracy": best.val_accuracy,
        "arch": best.arch,
        "macs": best.macs,
        "train_bytes": best.train_bytes,
        "infer_bytes": best.infer_bytes,
        "epoch_seconds": fit.epoch_seconds,
    }


def run_search(
    method: str,
    *,
    profile: Profile,
    info: DatasetInfo,
    local,
    samples: int | None = None,
    batch_size: int | None = None,
    seed: int = 0,
    options: dict[str, Any] | None = None,
    on_status: Status | None = None,
    on_result: Callable[[SearchResult], None] | None = None,
    on_progress=None,
) -> ModelSpec:
    """The client hook: the best `nas-cnn` spec that fits `profile`. `on_result` receives the
    whole SearchResult (candidates, history) for callers that report it."""
    if method not in METHODS:
        raise ConfigError(f"unknown --search {method!r}", hint=f"valid: {', '.join(METHODS)}")
    if local is None:
        raise ConfigError(
            "architecture search needs the client's local data",
            hint="run the search on the device that holds the data (client train --search)",
        )
    result = search_architecture(
        profile,
        info,
        local,
        samples=samples,
        batch_size=batch_size,
        seed=seed,
        config=PSOConfig.from_options(options),
        on_status=on_status,
        on_progress=on_progress,
    )
    if on_result:
        on_result(result)
    return result.spec
