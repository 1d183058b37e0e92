"""The configs every fusion method's options build on: `FusionConfig`, the knobs every
method has, and `PublicSetConfig`, the public set a method that distils on one reads (its
config derives from it). Below the method contract (edgefl.fusion.base), which reads both."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from edgefl.bounds import SEED
from edgefl.data.public import DEFAULT_PUBLIC_SIZE
from edgefl.fusion.options import option, option_rules, validate

ROBUST = ("off", "screen")
ROBUST_HELP = (
    "judge uploads by their outputs against the others (poisoned clients; "
    "edgefl.fusion.screen): repair relabelled or negated ones, temper scaled ones, "
    "leave out the rest that disagree; each named in the report: off | screen"
)


@dataclass(frozen=True)
class FusionConfig:
    """Knobs every method has. Subclasses add theirs with `option(...)`; each field is a flag of
    `server fuse` (`--name value`) and is checked against its declaration when built."""

    # torch seeds are 64-bit: past 2^63 - 1 torch.manual_seed raised an OverflowError
    seed: int = option(
        0, "seed of generation, initialisation and training", low=SEED.low, high=SEED.high
    )
    robust: str = option("off", ROBUST_HELP, choices=ROBUST)

    def __post_init__(self) -> None:
        validate(self)

    @classmethod
    def __rules__(cls) -> dict:
        """Its options as edgefl.bounds Rules: the one invalid-value test reads them."""
        return option_rules(cls)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class PublicSetConfig(FusionConfig):
    """Where the server finds the public set: the same reference, size and seed as the clients."""

    public: str | None = option(
        None,
        "the public set: NAME:public (carved from NAME's train split) or a .npz with x",
    )
    public_size: int = option(
        DEFAULT_PUBLIC_SIZE, "public samples carved (FedOL paper: 5,000)", low=1
    )
    public_seed: int = option(0, "the clients' --partition-seed (the carve uses it)", low=0)
    public_subset: int | None = option(None, "the clients' --subset, if they used one", low=1)
    public_partition: str | None = option(
        None,
        "the clients' --partition, if it names users (user:ID,...): the carve never "
        "makes those users public",
    )
    data_dir: str | None = option(None, "folder with standard dataset files")

    @staticmethod
    def carved(ref: str, size: int, seed: int, subset: int | None, partition: str) -> dict:
        """The options naming the slice a simulation's clients carved as public (`ref` is
        NAME:public): what `simulate` and Flower's server hand such a method."""
        return {
            "public": ref,
            "public_size": size,
            "public_seed": seed,
            "public_subset": subset,
            "public_partition": partition,
        }

    def public_args(self) -> dict | None:
        """load_public's arguments for this public set; None without one."""
        if not self.public:
            return None
        return {
            "ref": self.public,
            "public_size": self.public_size,
            "seed": self.public_seed,
            "subset": self.public_subset,
            "data_dir": self.data_dir,
            "partition": self.public_partition,
        }
