"""`nas-cnn`: the variable-length CNN that PSO-FedNAS searches (pFedZKD, Sec. 3.2.1 and 4.1.2).

`params = {"genes": [...]}`: conv and pool genes in order, then exactly one fc gene, last:

- `{"type": "conv", "out": C, "kernel": K}`: Conv2d(K x K, same padding) -> BatchNorm -> ReLU
  (the paper puts BN after every conv);
- `{"type": "pool", "kind": "max" | "avg"}`: 2 x 2, stride 2;
- `{"type": "fc", "hidden": [h1, ...]}`: Linear(h) -> ReLU -> Dropout(0.3) per hidden width (the
  paper's dropout rate), then the zoo's `head` (one nn.Linear to the classes).

The first gene is a conv and the spatial size never drops below 1. Depth (conv + pool genes +
hidden FC layers + the head) is in 3..20, conv widths <= 128, FC widths <= 300, kernels odd
<= 7: the paper's search space. This module imports nothing from the zoo, which registers it.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from edgefl.errors import ConfigError
from edgefl.models.nets import Classifier
from edgefl.models.spec import ModelSpec

MIN_DEPTH, MAX_DEPTH = 3, 20
MAX_CHANNELS = 128
MAX_HIDDEN = 300
KERNELS = (1, 3, 5, 7)  # odd, so "same" padding k // 2 keeps the spatial size exactly
POOL_KINDS = ("max", "avg")
DROPOUT = 0.3

DEFAULT_GENES: list[dict[str, Any]] = [
    {"type": "conv", "out": 16, "kernel": 3},
    {"type": "pool", "kind": "max"},
    {"type": "conv", "out": 32, "kernel": 3},
    {"type": "pool", "kind": "max"},
    {"type": "fc", "hidden": [64]},
]
# On windows (C, 1, L), where a 2 x 2 pool would leave no row: the same convs, unpooled.
WINDOW_GENES: list[dict[str, Any]] = [g for g in DEFAULT_GENES if g["type"] != "pool"]


def depth(genes: list[dict[str, Any]]) -> int:
    """Layers as the paper counts them: [C P F] is 3, [C P C P F F] is 6."""
    return len(genes) + len(genes[-1].get("hidden", [])) if genes else 0


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# The keys each gene type has, exactly.
_GENE_KEYS = {
    "conv": {"type", "out", "kernel"},
    "pool": {"type", "kind"},
    "fc": {"type", "hidden"},
}


def gene_problems(genes: Any, input_shape: tuple[int, ...]) -> list[str]:
    """Every reason `genes` is not in the search space (empty list: valid)."""
    if not isinstance(genes, list) or not genes:
        return ["genes must be a non-empty list"]
    problems: list[str] = []
    hw = (input_shape[1], input_shape[2])
    for i, g in enumerate(genes):
        found, hw = _gene_problems(i, g, i == len(genes) - 1, hw)
        problems += found
    if not problems and not MIN_DEPTH <= depth(genes) <= MAX_DEPTH:
        problems.append(f"depth {depth(genes)} is outside {MIN_DEPTH}..{MAX_DEPTH}")
    return problems


def _gene_problems(
    i: int, g: Any, last: bool, hw: tuple[int, int]
) -> tuple[list[str], tuple[int, int]]:
    """Problems of gene `i` on an `hw` (height, width) map, and the map's size after it."""
    where = f"gene {i}"
    if not isinstance(g, dict):
        return [f"{where}: expected an object, got {type(g).__name__}"], hw
    kind = g.get("type")
    if kind not in _GENE_KEYS:
        return [f"{where}: type must be conv, pool or fc, got {kind!r}"], hw
    if set(g) != _GENE_KEYS[kind]:
        return [f"{where}: {kind} genes have exactly the keys {sorted(_GENE_KEYS[kind])}"], hw
    problems = _position_problems(i, kind, last)
    if kind == "conv":
        return problems + _conv_problems(where, g), hw
    if kind == "pool":
        return problems + _pool_problems(where, g, hw), (hw[0] // 2, hw[1] // 2)
    return problems + _fc_problems(where, g), hw


def _position_problems(i: int, kind: str, last: bool) -> list[str]:
    problems = []
    if i == 0 and kind != "conv":
        problems.append("gene 0 must be a conv (the paper's topology rule)")
    if kind == "fc" and not last:
        problems.append(f"gene {i}: the fc gene must be the last one")
    if last and kind != "fc":
        problems.append("the last gene must be the fc head")
    return problems


def _conv_problems(where: str, g: dict[str, Any]) -> list[str]:
    problems = []
    if not _int(g["out"]) or not 1 <= g["out"] <= MAX_CHANNELS:
        problems.append(f"{where}: out must be an integer in 1..{MAX_CHANNELS}")
    if g["kernel"] not in KERNELS or not _int(g["kernel"]):
        problems.append(f"{where}: kernel must be one of {KERNELS}")
    return problems


def _pool_problems(where: str, g: dict[str, Any], hw: tuple[int, int]) -> list[str]:
    h, w = hw
    problems = []
    if g["kind"] not in POOL_KINDS:
        problems.append(f"{where}: pool kind must be one of {POOL_KINDS}")
    if min(h, w) < 2:
        problems.append(f"{where}: pooling a {h}x{w} map would leave nothing")
    return problems


def _fc_problems(where: str, g: dict[str, Any]) -> list[str]:
    hidden = g["hidden"]
    if not isinstance(hidden, list) or not all(_int(n) and 1 <= n <= MAX_HIDDEN for n in hidden):
        return [f"{where}: hidden must be a list of integers in 1..{MAX_HIDDEN}"]
    return []


def check_genes(genes: Any, input_shape: tuple[int, ...]) -> None:
    problems = gene_problems(genes, input_shape)
    if problems:
        hint = "genes are conv/pool objects starting with a conv, then one fc object last"
        if input_shape[1] == 1:  # a window (C, 1, L): a 2x2 pool leaves no row
            hint = "on sensor windows no pool gene fits; `edgefl search` finds genes that do"
        raise ConfigError("invalid nas-cnn genes: " + "; ".join(problems), hint=hint)


def build_nas_cnn(spec: ModelSpec) -> Classifier:
    genes = spec.params["genes"]
    check_genes(genes, spec.input_shape)  # also guards the server against hostile specs
    c, h, w = spec.input_shape
    layers: list[nn.Module] = []
    for g in genes[:-1]:
        if g["type"] == "conv":
            k = g["kernel"]
            layers += [
                nn.Conv2d(c, g["out"], k, padding=k // 2),
                nn.BatchNorm2d(g["out"]),
                nn.ReLU(),
            ]
            c = g["out"]
        else:
            pool = nn.MaxPool2d if g["kind"] == "max" else nn.AvgPool2d
            layers.append(pool(2))
            h, w = h // 2, w // 2
    layers.append(nn.Flatten())
    n = c * h * w  # computed, not traced: the server builds hostile specs on the meta device
    for hsize in genes[-1]["hidden"]:
        layers += [nn.Linear(n, hsize), nn.ReLU(), nn.Dropout(DROPOUT)]
        n = hsize
    return Classifier(nn.Sequential(*layers), nn.Linear(n, spec.num_classes))


def arch_string(genes: list[dict[str, Any]]) -> str:
    """Compact, human-readable: C16k3-Pm-C32k5-Pa-F64-F32 (the head is implied)."""
    parts = []
    for g in genes:
        if g["type"] == "conv":
            parts.append(f"C{g['out']}k{g['kernel']}")
        elif g["type"] == "pool":
            parts.append("P" + g["kind"][0])
        else:
            parts += [f"F{h}" for h in g["hidden"]] or ["F"]
    return "-".join(parts)
