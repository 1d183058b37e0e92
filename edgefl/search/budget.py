"""The device profile as a hard constraint on the search: every particle checked against it
(`Budget`, `check_fit` plus an optional MACs cap), an infeasible one repaired by greedy
shrinking (`repair`), and feasible random draws (`sample_feasible`)."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass

import numpy as np

from edgefl.errors import BudgetError
from edgefl.models.cost import costs
from edgefl.models.nas import MIN_DEPTH, arch_string
from edgefl.models.plan import Fit, check_fit
from edgefl.models.spec import ModelSpec
from edgefl.profiles import Profile
from edgefl.search.genes import Genes, _join, _sizes, _split, legalize, random_genes
from edgefl.search.pso_config import PSOConfig
from edgefl.training import one_thread


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
    # the one to name: the cheapest in MACs of those the profile holds (then only the cap binds)
    held = [t for t in tiny if budget.check(t).fit.fits]
    least = min(held, key=lambda t: budget.check(t).macs) if held else tiny[0]
    chk = budget.check(least)
    why = "; ".join(chk.fit.reasons) or f"MACs {chk.macs:,} > --max-macs {budget.max_macs:,}"
    raise BudgetError(
        f"no nas-cnn architecture fits profile {budget.profile.name!r}: even "
        f"{arch_string(least)} needs {why}",
        hint=_no_fit_hint(budget, tiny),
    )


def _no_fit_hint(budget: Budget, tiny: list[Genes]) -> str:
    """The fix for the constraint that binds: the profile's budget, --max-macs, or both."""
    checks = [budget.check(t) for t in tiny]
    least = min(c.macs for c in checks)
    raise_macs = f"raise --max-macs to at least {least:,}"
    if not any(c.fit.fits for c in checks):
        larger = "use a larger device profile, a smaller --batch-size, or fewer samples"
        over = budget.max_macs and least > budget.max_macs
        return f"{larger}; and {raise_macs}" if over else larger
    return raise_macs  # the profile holds the tiniest architectures: only the cap binds
