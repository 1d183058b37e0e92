"""A particle of the search: a `nas-cnn` gene sequence (conv/pool genes, the FC head last),
forced into the search space (`legalize`), drawn at random, and moved by the paper's discrete
update (`make_target`, then `align`)."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np

from edgefl.models.nas import MIN_DEPTH
from edgefl.search.pso_config import PSOConfig

Genes = list[dict[str, Any]]


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
