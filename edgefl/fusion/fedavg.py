"""FedAvg, one-shot (McMahan et al., AISTATS 2017): the plain average of the classifiers'
parameters, once. Meaningful only for one architecture started from one initialisation, which
edgefl's federation seed guarantees."""

from __future__ import annotations

from dataclasses import dataclass

from edgefl.fusion.base import (
    FusionConfig,
    FusionContext,
    FusionResult,
    Method,
    average_classifiers,
    fedmho_table3,
    pfedzkd_table2,
)


@dataclass(frozen=True)
class FedAvgConfig(FusionConfig):
    pass


def fuse(ctx: FusionContext, cfg: FedAvgConfig) -> FusionResult:
    classifiers = ctx.require("classifier", "fedavg")
    with ctx.stage("average"):
        spec, model = average_classifiers(classifiers, "fedavg")
    return FusionResult(model, spec, {"averaged": [u.client_id for u in classifiers]})


METHOD = Method(
    name="fedavg",
    description="one-shot parameter average of same-architecture classifiers",
    paper="McMahan et al., AISTATS 2017 (one-shot baseline in FedMHO)",
    consumes=("classifier",),
    needs_gradients=True,  # needs the weights themselves, i.e. rebuildable edgefl classifiers
    config_cls=FedAvgConfig,
    fuse=fuse,
    references=fedmho_table3((85.91, 74.57, 49.12)) + pfedzkd_table2((51.62, 74.92, 86.91)),
)
