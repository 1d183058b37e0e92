"""The cap on classifier uploads of a method whose cost grows with each teacher (its option
max_teachers), and the refusal past it, the same before the ingest as after."""

from __future__ import annotations

from edgefl.errors import FusionError

# Data-free methods distil every classifier at every step: on 2 CPUs FedHydra took 143 s for 20
# teachers and over 15 minutes for 200, DENSE 57 s and 350 s (bench/results/scale.md). Past
# this many, a run would take hours on such a server; each such method refuses it up front.
MAX_TEACHERS = 500
MAX_TEACHERS_HELP = (
    "refuse more classifier uploads than this (0: no cap); their cost grows with each"
)


GROWS = "its cost grows with each teacher"  # a capped method that says no more (teacher_cost)


def over_caps(configured, classifiers: int, flag: str = "--opt") -> dict[str, FusionError]:
    """Each (method, config) of `configured` that `classifiers` classifier uploads put over its
    max_teachers, by name, with its refusal (`flag`: the command's option flag the fix names)."""
    refused = {}
    for method, cfg in configured:
        error = method.over_cap(cfg, classifiers, flag)
        if error is not None:
            refused[method.name] = error
    return refused


def too_many(
    method: str, kind: str, count: int, at_most: int, cost: str, flag: str = "--opt"
) -> FusionError:
    """The refusal of `count` uploads of `kind`, more than the method's max_teachers `at_most`
    (`cost`: what grows with each): the same words before the ingest (from what the files
    declare) as after it (what was accepted)."""
    scoped = f"{method}:" if method else ""
    return FusionError(
        f"{method or 'this method'} refuses {count:,} {kind} uploads, more than its "
        f"max_teachers ({at_most:,}): {cost}",
        hint=f"{flag} {scoped}max_teachers={count} runs it anyway (a GPU helps); "
        "fedmho-md, fedcvae-ens and ensemble fuse 10,000 uploads in minutes "
        "(docs/performance.md)",
    )
