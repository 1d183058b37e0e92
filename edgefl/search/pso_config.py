"""The options of a PSO-FedNAS search (`PSOConfig`): the paper's defaults, the bounds each
is checked against, and their parsing from command-line text (`--search-opt key=value`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from edgefl.bounds import OneOf, Range, check_fields, declare, declared
from edgefl.errors import ConfigError
from edgefl.models.nas import KERNELS, MAX_CHANNELS, MAX_DEPTH, MAX_HIDDEN, MIN_DEPTH

COUNT = Range(1, integer=True)
SHARE = Range(0, 1)
# Candidates one search may train: 45x the paper's 20 x (10 + 1) = 220. Past it a typo
# (--particles 1000000) began a search its own estimate put at 13,339 hours.
MAX_CANDIDATES = 10_000


@declared()
@dataclass(frozen=True)
class PSOConfig:
    """Defaults are the paper's (Sec. 4.1.2) unless marked. The CLIs pass smaller, quicker
    values (see `edgefl search --help`): the paper's budget is hours of CPU per client. The
    caps stay inside the `nas-cnn` search space."""

    particles: int = declare(COUNT, 20)
    # the paper also restarts the whole search 10 times; we run it once
    generations: int = declare(Range(0, integer=True), 10)
    candidate_epochs: int = declare(COUNT, 10)
    cg: float = declare(SHARE, 0.5)  # the paper gives no value for its control factor C_g
    p_conv: float = declare(SHARE, 0.7)
    max_depth: int = declare(Range(MIN_DEPTH, MAX_DEPTH, integer=True), MAX_DEPTH)
    max_channels: int = declare(Range(1, MAX_CHANNELS, integer=True), MAX_CHANNELS)
    max_hidden: int = declare(Range(1, MAX_HIDDEN, integer=True), MAX_HIDDEN)
    max_kernel: int = declare(OneOf(KERNELS), 7)
    # hidden FC layers before the head (paper's example: [C P C P F F])
    max_fc_layers: int = declare(Range(0, 4, integer=True), 2)
    # edgefl: train candidates on a subset (of 2 at least: BatchNorm takes no batch of one)
    fitness_samples: int | None = declare(Range(2, integer=True), None)
    max_macs: int | None = declare(COUNT, None)  # edgefl: extra MACs cap for fast simulations
    redraws: int = declare(COUNT, 8)  # edgefl: infeasible random draws before repairing one

    def __post_init__(self) -> None:
        check_fields(self)
        candidates = self.particles * (self.generations + 1)
        if candidates > MAX_CANDIDATES:
            raise ConfigError(
                f"--particles {self.particles} x (--generations {self.generations} + the first "
                f"swarm) = {candidates:,} candidates to train, more than {MAX_CANDIDATES:,} "
                "(the paper's search trains 220)",
                hint="lower --particles or --generations, e.g. --particles 20 --generations 10 "
                "(the paper's)",
            )

    @classmethod
    def from_options(cls, options: dict[str, Any] | None) -> PSOConfig:
        options = {k.replace("-", "_"): v for k, v in (options or {}).items() if v is not None}
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise ConfigError(
                f"unknown search option(s) {', '.join('--' + _flag(u) for u in unknown)}",
                hint=f"PSO options: {', '.join('--' + _flag(n) for n in sorted(names))}",
            )
        return cls(**options)

    @classmethod
    def from_text(cls, texts: dict[str, str]) -> PSOConfig:
        """Command-line text (`--search-opt key=value`), each value typed by its field's
        annotation (int, float; `none` for a field that may be unset), not by its look."""
        kinds = {f.name: f.type for f in fields(cls)}
        options = {}
        for key, text in texts.items():
            name = key.strip().replace("-", "_")
            options[name] = _typed(name, kinds.get(name), text.strip())
        return cls.from_options(options)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# PSOConfig's field annotations (strings: this module defers them) -> (type, may be unset).
_KINDS = {"int": (int, False), "float": (float, False), "int | None": (int, True)}


def _typed(name: str, annotation: str | None, text: str) -> Any:
    """`text` as the type `annotation` names; an unknown name is left as text for
    `from_options` to refuse."""
    if annotation is None:
        return text
    if annotation not in _KINDS:  # a new field of a kind the command line cannot type yet
        raise TypeError(f"PSOConfig.{name}: no command-line parsing for {annotation!r}")
    cast, nullable = _KINDS[annotation]
    if nullable and text.lower() in ("none", "unset"):
        return None
    try:
        return cast(text)
    except ValueError:
        what = "an integer" if cast is int else "a number"
        unset = " (or none)" if nullable else ""
        raise ConfigError(
            f"--{_flag(name)} must be {what}{unset}, got {text!r}",
            hint=f"e.g. --{_flag(name)} {'10' if cast is int else '0.5'}",
        ) from None


def _flag(name: str) -> str:
    return name.replace("_", "-")
