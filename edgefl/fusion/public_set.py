"""The unlabeled public set a method distils on (FedDF, FedOL), loaded checked against the
uploads' input shape. Its options are `PublicSetConfig` (edgefl.fusion.config), which a
method's config derives from (that is what `Method.public_data` reads)."""

from __future__ import annotations

import numpy as np

from edgefl.data.public import DEFAULT_PUBLIC_SIZE, load_public
from edgefl.errors import ConfigError, FusionError
from edgefl.fusion.base import FusionContext
from edgefl.fusion.config import PublicSetConfig


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
            f"expect {list(ctx.input_shape)}",
            hint="name a public set of the uploads' task, e.g. --public mnist:public for MNIST",
        )
    return x
