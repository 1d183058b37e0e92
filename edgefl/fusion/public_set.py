"""The unlabeled public set a method distils on (FedDF, FedOL): its options, which a method's
config takes by deriving from `PublicSetConfig` (that is what `Method.public_data` reads), and
loading it checked against the uploads' input shape."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgefl.data.public import DEFAULT_PUBLIC_SIZE, load_public
from edgefl.errors import ConfigError, FusionError
from edgefl.fusion.base import FusionConfig, FusionContext
from edgefl.fusion.options import option


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


def public_samples(ctx: FusionContext, cfg: PublicSetConfig) -> np.ndarray:
    method = ctx.who
    if not cfg.public:
        raise ConfigError(
            f"{method} distils on a public set: pass --opt public=NAME:public (or a .npz)",
            hint=f"the same set the clients used, e.g. --opt public=mnist:public "
            f"--opt public_size={DEFAULT_PUBLIC_SIZE}",
        )
    x = load_public(**cfg.public_args())
    if tuple(x.shape[1:]) != tuple(ctx.input_shape):
        raise FusionError(
            f"public set {cfg.public} has samples of shape {list(x.shape[1:])}, the uploads "
            f"expect {list(ctx.input_shape)}"
        )
    return x
