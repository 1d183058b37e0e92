"""Fusion methods, one file each, registered by name in METHODS (explicit list, no magic)."""

from edgefl.fusion import (
    coboosting,
    dense,
    ensemble,
    fedavg,
    fedcvae_ens,
    feddf,
    fedgh,
    fedhydra,
    fedmho,
    fedmho_cw,
    fedol,
    pfedzkd,
)
from edgefl.fusion.base import (
    BUDGETS,
    METHODS,
    FusionConfig,
    FusionContext,
    FusionResult,
    Method,
    Reference,
    check_budget,
)

for _m in (
    fedavg.METHOD,
    ensemble.METHOD,
    fedcvae_ens.METHOD,
    *fedmho.METHODS,
    fedmho_cw.METHOD,
    dense.METHOD,
    coboosting.METHOD,
    fedhydra.METHOD,
    pfedzkd.METHOD,
    feddf.METHOD,
    fedol.METHOD,
    fedgh.METHOD,
):
    METHODS.add(_m.name, _m)

# What `edgefl simulate` runs when no --methods is given: the FedMHO paper's MNIST table.
DEFAULT_METHODS = ("fedavg", "ensemble", "fedcvae-ens", "fedmho", "fedmho-md", "fedmho-sd")


def paper_reference(
    dataset: str, partition: str, clients: int, source: str | None = None
) -> dict[str, float]:
    """method -> the published accuracy (%) for this setting, where a paper (`source`, when
    given: "FedMHO paper, Table 3") reports one."""
    out = {}
    for m in METHODS:
        ref = m.reference(dataset, partition, clients, source)
        if ref is not None:
            out[m.name] = ref.accuracy
    return out


__all__ = [
    "BUDGETS",
    "check_budget",
    "DEFAULT_METHODS",
    "METHODS",
    "FusionConfig",
    "FusionContext",
    "FusionResult",
    "Method",
    "Reference",
    "paper_reference",
]
