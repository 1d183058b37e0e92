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
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import torch

from edgefl.bounds import Range
from edgefl.data.registry import DatasetInfo
from edgefl.errors import BudgetError, ConfigError, DataError
from edgefl.models.cost import costs
from edgefl.models.nas import (
    KERNELS,
    MAX_CHANNELS,
    MAX_DEPTH,
    MAX_HIDDEN,
    MIN_DEPTH,
    arch_string,
)
from edgefl.models.plan import Fit, check_fit
from edgefl.models.spec import ModelSpec
from edgefl.profiles import Profile
from edgefl.progress import fmt_seconds, no_progress
from edgefl.training import DEFAULT_LR, TrainConfig, init_model, one_thread, train

Genes = list[dict[str, Any]]
Status = Callable[[str], None]
METHODS = ("pso",)


@dataclass(frozen=True)
class PSOConfig:
    """Defaults are the paper's (Sec. 4.1.2) unless marked. The CLIs pass smaller, quicker
    values (see `edgefl search --help`): the paper's budget is hours of CPU per client."""

    particles: int = 20
    generations: int = 10  # the paper also restarts the whole search 10 times; we run it once
    candidate_epochs: int = 10
    cg: float = 0.5  # the paper gives no value for its control factor C_g
    p_conv: float = 0.7
    max_depth: int = MAX_DEPTH
    max_channels: int = MAX_CHANNELS
    max_hidden: int = MAX_HIDDEN
    max_kernel: int = 7
    max_fc_layers: int = 2  # hidden FC layers before the head (paper's example: [C P C P F F])
    fitness_samples: int | None = None  # edgefl: train candidates on a subset (None: all)
    max_macs: int | None = None  # edgefl: extra MACs cap to keep CPU simulations fast
    redraws: int = 8  # edgefl: infeasible random draws before repairing one

    def __post_init__(self) -> None:
        for name, bounds in BOUNDS.items():
            value = getattr(self, name)
            if value is not None or name not in NULLABLE:
                bounds.check(f"--{_flag(name)}", value)
        if self.max_kernel not in KERNELS:
            raise ConfigError(f"--max-kernel must be one of {KERNELS}, got {self.max_kernel!r}")

    @classmethod
    def from_options(cls, options: dict[str, Any] | None) -> PSOConfig:
        options = {k.replace("-", "_"): v for k, v in (options or {}).items() if v is not None}
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise ConfigError(
                f"unknown search option(s) {', '.join('--' + _flag(u) for u in unknown)}",
                hint=f"PSO options: {', '.join('--' + _flag(n) for n in sorted(names))}",
            )
        return cls(**options)

    @classmethod
    def from_text(cls, texts: dict[str, str]) -> PSOConfig:
        """Command-line text (`--search-opt key=value`), each value typed by its field's
        annotation (int, float; `none` for a field that may be unset), not by its look."""
        kinds = {f.name: f.type for f in fields(cls)}
        options = {}
        for key, text in texts.items():
            name = key.strip().replace("-", "_")
            options[name] = _typed(name, kinds.get(name), text.strip())
        return cls.from_options(options)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# PSOConfig's numeric fields and their ranges (the caps stay inside the `nas-cnn` search space);
# a field in NULLABLE may also be None (unset). Tests generate values past each bound from here.
BOUNDS = {
    "particles": Range(1, integer=True),
    "generations": Range(0, integer=True),
    "candidate_epochs": Range(1, integer=True),
    "cg": Range(0, 1),
    "p_conv": Range(0, 1),
    "max_depth": Range(MIN_DEPTH, MAX_DEPTH, integer=True),
    "max_channels": Range(1, MAX_CHANNELS, integer=True),
    "max_hidden": Range(1, MAX_HIDDEN, integer=True),
    "max_fc_layers": Range(0, 4, integer=True),
    "fitness_samples": Range(1, integer=True),
    "max_macs": Range(1, integer=True),
    "redraws": Range(1, integer=True),
}
NULLABLE = ("fitness_samples", "max_macs")

# PSOConfig's field annotations (strings: this module defers them) -> (type, may be unset).
_KINDS = {"int": (int, False), "float": (float, False), "int | None": (int, True)}


def _typed(name: str, annotation: str | None, text: str) -> Any:
    """`text` as the type `annotation` names; an unknown name is left as text for
    `from_options` to refuse."""
    if annotation is None:
        return text
    if annotation not in _KINDS:  # a new field of a kind the command line cannot type yet
        raise TypeError(f"PSOConfig.{name}: no command-line parsing for {annotation!r}")
    cast, nullable = _KINDS[annotation]
    if nullable and text.lower() in ("none", "unset"):
        return None
    try:
        return cast(text)
    except ValueError:
        what = "an integer" if cast is int else "a number"
        unset = " (or none)" if nullable else ""
        raise ConfigError(f"--{_flag(name)} must be {what}{unset}, got {text!r}") from None


def _flag(name: str) -> str:
    return name.replace("_", "-")


# --- gene sequences -------------------------------------------------------------------------


def _split(genes: Genes) -> tuple[Genes, list[int]]:
    """Body (conv/pool genes) and hidden FC widths."""
    if genes and genes[-1].get("type") == "fc":
        return copy.deepcopy(genes[:-1]), list(genes[-1]["hidden"])
    return copy.deepcopy(genes), []


def _join(body: Genes, hidden: list[int]) -> Genes:
    return body + [{"type": "fc", "hidden": list(hidden)}]


def _sizes(body: Genes, hw: tuple[int, int]) -> list[tuple[int, int]]:
    """Spatial size at the input of each body gene."""
    h, w = hw
    out = []
    for g in body:
        out.append((h, w))
        if g["type"] == "pool":
            h, w = h // 2, w // 2
    return out


def legalize(genes: Genes, cfg: PSOConfig, input_shape: tuple[int, ...]) -> Genes:
    """Force a gene list into the search space: first gene a conv, limits clipped, pools that
    would shrink the map below 1x1 dropped, depth within MIN_DEPTH..cfg.max_depth."""
    body, hidden = _split(genes)
    body = [g for g in body if g.get("type") in ("conv", "pool")]
    if not body or body[0]["type"] != "conv":
        body.insert(0, {"type": "conv", "out": min(8, cfg.max_channels), "kernel": 3})
    for g in body:
        if g["type"] == "conv":
            g["out"] = int(min(max(1, g["out"]), cfg.max_channels))
            k = int(min(max(1, g["kernel"]), cfg.max_kernel))
            g["kernel"] = k if k % 2 else k - 1
    hidden = [int(min(max(1, h), cfg.max_hidden)) for h in hidden][: cfg.max_fc_layers]
    body = _fit_pools(body, input_shape)
    return _join(*_fit_depth(body, hidden, cfg.max_depth))


def _fit_pools(body: Genes, input_shape: tuple[int, ...]) -> Genes:
    """`body` without the pools that would shrink the map below 1x1."""
    h, w = input_shape[1], input_shape[2]
    kept = []
    for g in body:
        if g["type"] == "pool":
            if min(h, w) < 2:
                continue
            h, w = h // 2, w // 2
        kept.append(g)
    return kept


def _fit_depth(body: Genes, hidden: list[int], max_depth: int) -> tuple[Genes, list[int]]:
    """(body, hidden) with depth in MIN_DEPTH..max_depth: too deep drops hidden FC layers, then
    the last body genes; too shallow repeats the last conv."""
    body, hidden = list(body), list(hidden)
    while len(body) + len(hidden) + 1 > max_depth:
        if hidden:
            hidden.pop()
        else:
            body.pop()
    while len(body) + len(hidden) + 1 < MIN_DEPTH:
        last_conv = next(g for g in reversed(body) if g["type"] == "conv")
        body.append(dict(last_conv))
    return body, hidden


def _log_uniform_int(rng: np.random.Generator, lo: int, hi: int) -> int:
    lo, hi = max(1, lo), max(1, hi)
    if hi <= lo:
        return hi
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def random_genes(
    rng: np.random.Generator, cfg: PSOConfig, input_shape: tuple[int, ...], scale: float = 1.0
) -> Genes:
    """One draw from the paper's space; `scale` < 1 shrinks the caps (after infeasible draws)."""
    max_depth = max(MIN_DEPTH, int(cfg.max_depth * scale))
    max_ch = max(1, int(cfg.max_channels * scale))
    max_fc = max(1, int(cfg.max_hidden * scale))
    total = int(rng.integers(MIN_DEPTH, max_depth + 1))
    n_fc = int(rng.integers(0, min(cfg.max_fc_layers, total - 2) + 1))
    kernels = [k for k in (3, 5, 7) if k <= cfg.max_kernel] or [1]
    h, w = input_shape[1], input_shape[2]
    body: Genes = []
    for j in range(total - 1 - n_fc):
        if j > 0 and rng.random() >= cfg.p_conv and min(h, w) >= 2:
            body.append({"type": "pool", "kind": str(rng.choice(["max", "avg"]))})
            h, w = h // 2, w // 2
        else:
            out = _log_uniform_int(rng, min(4, max_ch), max_ch)
            body.append({"type": "conv", "out": out, "kernel": int(rng.choice(kernels))})
    hidden = [_log_uniform_int(rng, min(16, max_fc), max_fc) for _ in range(n_fc)]
    return legalize(_join(body, hidden), cfg, input_shape)


def make_target(pbest: Genes, gbest: Genes, cg: float, rng: np.random.Generator) -> Genes:
    """Paper's X_target: layer j from gBest with probability Cg, else from pBest_i. Where the
    chosen parent has no layer j the target gets none (it follows the shorter parent there)."""
    (pb, ph), (gb, gh) = _split(pbest), _split(gbest)

    def pick(a: list, b: list) -> list:
        out = []
        for j in range(max(len(a), len(b))):
            src = b if rng.random() <= cg else a
            if j < len(src):
                out.append(copy.deepcopy(src[j]))
        return out

    # Both parents have a first gene and it is a conv, so the target starts with a conv.
    return _join(pick(pb, gb), pick(ph, gh))


def align(
    particle: Genes, target: Genes, rng: np.random.Generator, cfg: PSOConfig, input_shape
) -> Genes:
    """The paper's topological operator T(X_i, X_target): delete (or insert target genes at)
    random positions until the lengths match, then replace genes whose type differs; genes of
    the same type are retained. The result has the target's layer types, so it is valid when
    the target is (the target is legalized first)."""
    target = legalize(target, cfg, input_shape)
    (body, hidden), (tb, th) = _split(particle), _split(target)
    while len(body) > len(tb):
        del body[int(rng.integers(1, len(body)))]  # never the first conv
    while len(body) < len(tb):
        k = int(rng.integers(1, len(body) + 1))
        body.insert(k, copy.deepcopy(tb[k]))
    body = [
        g if g["type"] == t["type"] else copy.deepcopy(t) for g, t in zip(body, tb, strict=True)
    ]
    while len(hidden) > len(th):
        del hidden[int(rng.integers(0, len(hidden)))]
    while len(hidden) < len(th):
        k = int(rng.integers(0, len(hidden) + 1))
        hidden.insert(k, th[k])
    return legalize(_join(body, hidden), cfg, input_shape)


# --- the budget -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    fits: bool
    excess: float  # sum of log(need / have) over exceeded budgets: 0 when it fits
    fit: Fit
    macs: int


class Budget:
    """The device's hard constraint, as `check_fit` computes it (plus an optional MACs cap)."""

    def __init__(
        self,
        profile: Profile,
        input_shape,
        num_classes: int,
        *,
        samples: int,
        batch_size: int | None,
        max_macs: int | None,
    ):
        self.profile = profile
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.samples = samples
        self.batch_size = batch_size
        self.max_macs = max_macs
        self._cache: dict[str, Check] = {}

    def spec(self, genes: Genes) -> ModelSpec:
        return ModelSpec("nas-cnn", self.input_shape, self.num_classes, {"genes": genes})

    def check(self, genes: Genes) -> Check:
        key = json.dumps(genes, sort_keys=True)
        if key not in self._cache:
            spec = self.spec(genes)
            with one_thread():
                fit = check_fit(
                    spec, self.profile, samples=self.samples, batch_size=self.batch_size
                )
            c, p = costs(spec), self.profile
            ratios = [
                fit.train_bytes / p.ram_budget_bytes,
                c.infer_peak_bytes / p.ram_budget_bytes,
                c.weight_bytes / p.storage_bytes,
                fit.epoch_seconds / p.max_epoch_seconds,
            ]
            if self.max_macs:
                ratios.append(c.macs / self.max_macs)
            fits = fit.fits and (not self.max_macs or c.macs <= self.max_macs)
            excess = sum(math.log(r) for r in ratios if r > 1)
            self._cache[key] = Check(fits, excess, fit, c.macs)
        return self._cache[key]

    def fits(self, genes: Genes) -> bool:
        return self.check(genes).fits


Move = tuple[Genes, list[int]]  # (body, hidden FC widths) of a candidate reduction


def _shrink_moves(genes: Genes, input_shape) -> list[Genes]:
    """Candidate one-step reductions, aimed at the layers that cost most."""
    body, hidden = _split(genes)
    convs = _conv_costs(body, input_shape)
    moves = (
        _width_moves(body, hidden, convs)
        + _kernel_moves(body, hidden, convs)
        + _fc_moves(body, hidden)
        + _layer_moves(body, hidden, convs)
    )
    return [_join(b, h) for b, h in moves]


def _conv_costs(body: Genes, input_shape) -> list[tuple[int, int, int, int]]:
    """(index, activation elems, params, macs) of each conv in `body`."""
    sizes = _sizes(body, (input_shape[1], input_shape[2]))
    cin, convs = input_shape[0], []
    for i, (g, (h, w)) in enumerate(zip(body, sizes, strict=True)):
        if g["type"] == "conv":
            k2 = g["kernel"] ** 2
            convs.append((i, g["out"] * h * w, cin * g["out"] * k2, g["out"] * h * w * cin * k2))
            cin = g["out"]
    return convs


def _width_moves(body: Genes, hidden: list[int], convs) -> list[Move]:
    moves: list[Move] = []
    if any(body[c[0]]["out"] > 1 for c in convs) or any(h > 1 for h in hidden):
        # Far over budget: halve every width at once (few steps from a huge draw).
        b = [dict(g, out=max(1, g["out"] // 2)) if g["type"] == "conv" else g for g in body]
        moves.append((b, [max(1, h // 2) for h in hidden]))
    for key in (1, 2):  # halve the conv with the most activations, then the most parameters
        wide = [c for c in convs if body[c[0]]["out"] > 1]
        if wide:
            i = max(wide, key=lambda c: c[key])[0]
            b = copy.deepcopy(body)
            b[i]["out"] = max(1, b[i]["out"] // 2)
            moves.append((b, hidden))
    return moves


def _kernel_moves(body: Genes, hidden: list[int], convs) -> list[Move]:
    big_k = [c for c in convs if body[c[0]]["kernel"] > 1]
    if not big_k:
        return []
    b = copy.deepcopy(body)
    b[max(big_k, key=lambda c: c[3])[0]]["kernel"] -= 2
    return [(b, hidden)]


def _fc_moves(body: Genes, hidden: list[int]) -> list[Move]:
    moves: list[Move] = []
    if hidden:
        i = int(np.argmax(hidden))
        if hidden[i] > 1:
            moves.append((body, hidden[:i] + [max(1, hidden[i] // 2)] + hidden[i + 1 :]))
        if len(body) + len(hidden) + 1 > MIN_DEPTH:
            moves.append((body, hidden[:-1]))
    return moves


def _layer_moves(body: Genes, hidden: list[int], convs) -> list[Move]:
    # One more pool right after the first conv: the activations and MACs of everything after
    # it drop ~4x, and the head's input with them (legalize drops it if the map is too small).
    moves: list[Move] = [(body[:1] + [{"type": "pool", "kind": "max"}] + body[1:], hidden)]
    pools = [i for i, g in enumerate(body) if g["type"] == "pool"]
    if pools:  # fewer pool outputs to keep for backward (helps only a big batch on a tiny net)
        moves.append((body[: pools[-1]] + body[pools[-1] + 1 :], hidden))
    if len(body) + len(hidden) + 1 > MIN_DEPTH and len(convs) > 1:
        i = max(convs[1:], key=lambda c: c[3])[0]
        moves.append((body[:i] + body[i + 1 :], hidden))
    return moves


def repair(genes: Genes, budget: Budget, cfg: PSOConfig, max_steps: int = 200) -> Genes | None:
    """Greedy shrinking until the architecture fits: each step takes the unvisited one-step
    change that leaves the least budget excess (ties: the one keeping the most MACs). When the
    greedy path runs out of changes, the first of the tiniest architectures that fits; None
    when none does."""
    genes = legalize(genes, cfg, budget.input_shape)
    visited = {json.dumps(genes)}
    for _ in range(max_steps):
        if budget.fits(genes):
            return genes
        moves = [
            legalize(m, cfg, budget.input_shape) for m in _shrink_moves(genes, budget.input_shape)
        ]
        moves = [m for m in moves if json.dumps(m) not in visited]
        if not moves:
            break
        genes = min(moves, key=lambda m: (budget.check(m).excess, -budget.check(m).macs))
        visited.add(json.dumps(genes))
    if budget.fits(genes):
        return genes
    return next((t for t in tiniest(cfg, budget.input_shape) if budget.fits(t)), None)


def tiniest(cfg: PSOConfig, input_shape) -> list[Genes]:
    """The smallest architectures of the space: one 1x1 conv of width 1, j pools, and the bare
    head or one hidden unit (the cheapest way to the minimum depth: a second conv keeps a whole
    feature map for training, a 1-unit layer one number)."""
    out = []
    for j in range(int(math.log2(max(1, min(input_shape[1:])))) + 1):
        for hidden in ([], [1]):
            body = [{"type": "conv", "out": 1, "kernel": 1}] + [{"type": "pool", "kind": "max"}] * j
            out.append(legalize(body + [{"type": "fc", "hidden": hidden}], cfg, input_shape))
    return out


def sample_feasible(rng: np.random.Generator, budget: Budget, cfg: PSOConfig) -> Genes:
    """A random architecture that fits: redraw with caps halved every other failure, then
    repair the last draw, then the tiniest architectures. BudgetError when none of them fits."""
    genes: Genes = []
    for attempt in range(cfg.redraws):
        genes = random_genes(rng, cfg, budget.input_shape, scale=0.5 ** (attempt // 2))
        if budget.fits(genes):
            return genes
    fixed = repair(genes, budget, cfg)
    if fixed is not None:
        return fixed
    tiny = tiniest(cfg, budget.input_shape)
    for genes in tiny:
        if budget.fits(genes):
            return genes
    chk = budget.check(tiny[0])
    why = "; ".join(chk.fit.reasons) or f"MACs {chk.macs:,} > --max-macs {budget.max_macs:,}"
    raise BudgetError(
        f"no nas-cnn architecture fits profile {budget.profile.name!r}: even "
        f"{arch_string(tiny[0])} needs {why}",
        hint="use a larger device profile, a smaller --batch-size, or fewer samples",
    )


# --- the search -----------------------------------------------------------------------------


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
            raise BudgetError(f"internal: {arch_string(genes)} does not fit the budget")
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
        if s is not None and s.interrupted:
            raise KeyboardInterrupt
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
        raise ConfigError("architecture search needs the client's local data")
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
