"""The unlabeled public set that FedDF and FedOL share between clients and server: loaded the
same way on both sides (`load_public`) and compared by fingerprint (`public_fingerprint`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from edgefl.bounds import Range
from edgefl.data import carve_public, load_dataset, parse_dataset_ref
from edgefl.errors import ConfigError, DataError

DEFAULT_PUBLIC_SIZE = 5_000  # FedOL's paper: 5,000 unlabeled public samples


def public_fingerprint(x: np.ndarray) -> str:
    """sha256 over the shape and float32 bytes of the samples only: the set is unlabeled, and a
    server with a user .npz may have no labels to hash."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    digest = hashlib.sha256(repr(tuple(x.shape)).encode())
    digest.update(x.data)
    return digest.hexdigest()


def is_carved(ref: str) -> bool:
    """`NAME:public`: a held-out slice of NAME's train split (disjoint from every client)."""
    return parse_dataset_ref(ref)[1] == "public"


def load_public(
    ref: str,
    *,
    public_size: int = DEFAULT_PUBLIC_SIZE,
    seed: int = 0,
    subset: int | None = None,
    data_dir: str | None = None,
    partition: str | None = None,
) -> np.ndarray:
    """The public samples x (N, C, H, W), float32 in [0, 1].

    `NAME:public` carves exactly what `edgefl.client.run.client_shard` holds out of every client
    (seed = the partition seed, after the optional --subset; whole users where the data names
    them, never one the clients' `partition` names); anything else is a dataset
    reference whose samples are used as they are (a user .npz needs only an array `x`).
    """
    name, split = parse_dataset_ref(ref)
    if split == "public":
        problem = Range(1).problem("--public-size", public_size)
        if problem is not None:
            raise ConfigError(
                f"public set {ref!r} is carved out of {name}'s train split: {problem}",
                hint=f"pass --public-size (the same on every client and the server), "
                f"e.g. {DEFAULT_PUBLIC_SIZE}",
            )
        data = load_dataset(name, "train", data_dir=data_dir)
        rest = np.arange(len(data))
        if subset is not None:
            Range(1, len(data), integer=True).check("--subset", subset)
            rest = np.sort(np.random.default_rng(seed).permutation(len(data))[:subset])
        groups = None if data.groups is None else data.groups[rest]  # whole users, as clients
        _, public = carve_public(len(rest), public_size, seed, groups, partition)
        x = data.x[rest[public]]
    elif name.endswith(".npz") and Path(name).is_file():
        x = _npz_samples(Path(name))
    else:
        x = load_dataset(ref, data_dir=data_dir).x
    if len(x) == 0:
        raise DataError(
            f"public set {ref!r} is empty",
            hint="name a public set with samples, e.g. --public mnist:public",
        )
    return np.ascontiguousarray(x, dtype=np.float32)


def _npz_samples(path: Path) -> np.ndarray:
    # An unlabeled public .npz needs only `x`; pixels are normalised as for any user dataset.
    from edgefl.data.datasets import _npz_images
    from edgefl.data.npz import check_numpy_file

    check_numpy_file(path, ".npz", "save the public set with np.savez(path, x=images)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            if "x" not in npz.files:
                raise DataError(
                    f"{path}: expected an array 'x' of public samples, found {sorted(npz.files)}",
                    hint="save the public set with np.savez(path, x=images)",
                )
            x = npz["x"]
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(
            f"cannot read {path} as .npz: {exc}",
            hint="save the public set with np.savez(path, x=images)",
        ) from None
    return _npz_images(x, f"{path} [x]")
