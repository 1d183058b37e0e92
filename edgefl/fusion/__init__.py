"""Fusion methods, one file each, registered by name in METHODS (explicit list, no magic)."""

from edgefl.fusion import (
    dense,
    ensemble,
    fedavg,
    fedcvae_ens,
    feddf,
    fedgh,
    fedhydra,
    fedmho,
    fedol,
    pfedzkd,
)
from edgefl.fusion.base import METHODS, FusionConfig, FusionContext, FusionResult, Method

for _m in (
    fedavg.METHOD,
    ensemble.METHOD,
    fedcvae_ens.METHOD,
    *fedmho.METHODS,
    dense.METHOD,
    fedhydra.METHOD,
    pfedzkd.METHOD,
    feddf.METHOD,
    fedol.METHOD,
    fedgh.METHOD,
):
    METHODS.add(_m.name, _m)

__all__ = ["METHODS", "FusionConfig", "FusionContext", "FusionResult", "Method"]
