"""Fusion methods, one file each, registered by name in METHODS (explicit list, no magic);
methods of other packages come in through the entry-point group `edgefl.methods`."""

from importlib.metadata import entry_points

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

PLUGIN_GROUP = "edgefl.methods"


def load_plugins(group: str = PLUGIN_GROUP) -> None:
    """Register the methods installed packages declare (`[project.entry-points."edgefl.methods"]`
    `NAME = "package.module:METHOD"`): every process edgefl starts, a `server fuse` worker or
    Flower's deployed ServerApp, then knows them with no edit to edgefl. A plugin that fails to
    load, or names a Method otherwise, is not registered; asking for it says why (the other
    methods still run). A built-in name is never replaced."""
    for ep in entry_points(group=group):
        if ep.name in METHODS:
            continue
        try:
            method = ep.load()
            if not isinstance(method, Method):
                kind = type(method).__name__
                raise TypeError(f"{ep.value} is of type {kind}, not an edgefl Method")
            if method.name != ep.name:
                raise ValueError(f"{ep.value} is named {method.name!r}, not {ep.name!r}")
        except Exception as exc:  # any error in foreign code: the built-in methods still run
            METHODS.mark_broken(ep.name, f"{type(exc).__name__}: {exc}")
            continue
        METHODS.add(ep.name, method)


load_plugins()

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
    "load_plugins",
    "paper_reference",
]
