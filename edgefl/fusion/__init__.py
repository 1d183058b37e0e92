"""Fusion methods, one file each, registered by name in METHODS (explicit list, no magic);
methods of other packages come in through the entry-point group `edgefl.methods`, looked up
at the registry's first read (importing this package scans nothing)."""

from collections.abc import Iterator
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
from edgefl.fusion.base import BUDGETS, FusionContext, FusionResult, Method, Reference, check_budget
from edgefl.fusion.config import FusionConfig
from edgefl.registry import Registry


class _Methods(Registry[Method]):
    """The fusion methods: the built-ins, added below, then the ones installed packages
    declare (load_plugins), looked up once at the first read (a name asked for, the list
    printed), in whichever process reads first: a `server fuse` worker, Flower's ServerApp."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self._scanned = False

    def _scan_once(self) -> None:
        if not self._scanned:
            self._scanned = True  # first: a plugin may read the registry while it loads
            load_plugins()

    def get(self, name: str) -> Method:
        self._scan_once()
        return super().get(name)

    def names(self) -> list[str]:
        self._scan_once()
        return super().names()

    def __contains__(self, name: object) -> bool:
        self._scan_once()
        return super().__contains__(name)

    def __iter__(self) -> Iterator[Method]:
        self._scan_once()
        return super().__iter__()

    def __len__(self) -> int:
        self._scan_once()
        return super().__len__()


METHODS: Registry[Method] = _Methods("fusion method")

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
    `NAME = "package.module:METHOD"`): METHODS calls it at its first read, so every process
    edgefl starts, a `server fuse` worker or Flower's deployed ServerApp, knows them with no
    edit to edgefl. A plugin that fails to load, or names a Method otherwise, is not
    registered; asking for it says why (the other methods still run). A built-in name is never
    replaced."""
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
