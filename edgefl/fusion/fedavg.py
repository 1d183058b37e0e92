"""FedAvg, one-shot (McMahan et al., AISTATS 2017): the plain average of the classifiers'
parameters, once. Meaningful only for one architecture started from one initialisation, which
edgefl's federation seed guarantees. Over several architectures it averages the largest group
of one (`one_architecture`) and sets the others aside by name; the report's `scope` says what
the average stands for ("5 of 10: vgg9 only")."""

from __future__ import annotations

from dataclasses import dataclass

from edgefl.fusion.averaging import average_classifiers, average_scope, one_architecture
from edgefl.fusion.base import (
    FusionContext,
    FusionResult,
    Method,
    fedhydra_table1,
    fedmho_table3,
    pfedzkd_table2,
)
from edgefl.fusion.config import FusionConfig


@dataclass(frozen=True)
class FedAvgConfig(FusionConfig):
    pass


def fuse(ctx: FusionContext, cfg: FedAvgConfig) -> FusionResult:
    classifiers = ctx.require("classifier")
    kept, left = one_architecture(classifiers, "fedavg")
    ctx.set_aside(left)
    with ctx.stage("average"):
        spec, model = average_classifiers(kept, "fedavg")
    return FusionResult(
        model,
        spec,
        {"averaged": [u.client_id for u in kept]},
        scope=average_scope(kept, classifiers),
    )


METHOD = Method(
    name="fedavg",
    description="one-shot parameter average of same-architecture classifiers (the "
    "largest group of one architecture; the others set aside by name)",
    paper="McMahan et al., AISTATS 2017 (one-shot baseline in FedMHO)",
    consumes=("classifier",),
    needs_modules=True,  # needs the weights themselves, i.e. rebuildable edgefl classifiers
    config_cls=FedAvgConfig,
    fuse=fuse,
    trains=False,
    references=fedmho_table3((85.91, 74.57, 49.12))
    + fedmho_table3((60.24, 47.36, 30.37), "fmnist")
    + pfedzkd_table2((51.62, 74.92, 86.91))
    + pfedzkd_table2((48.48, 58.24, 66.05), "fmnist")
    + fedhydra_table1((81.89, 69.89, 25.96, 10.10))
    + fedhydra_table1((75.76, 74.81, 35.35, 33.71), "fmnist"),
)
