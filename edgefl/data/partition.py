"""Splitting one labelled set among simulated clients: iid, Dirichlet label skew, K classes each,
or one client per user where the data says whose each sample is (a wearable's natural split).

Every function is deterministic for a seed (one `np.random.default_rng(seed)` per call) and
returns sorted int64 index arrays into the labels it was given.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgefl.bounds import OneOf, Range, check_fields, declare, declared
from edgefl.errors import ConfigError, DataError

SCHEME_FORMS = (
    "iid, dirichlet:ALPHA (ALPHA > 0, e.g. dirichlet:0.5), classes:K (K >= 1), or "
    "user / user:ID,ID,... (one client per user, for data that names its users)"
)
MAX_REDRAWS = 1000
# The schemes' parameters (tests generate values past each bound from here).
ALPHA = Range(0, low_open=True)
K = Range(1, integer=True)
VAL_FRACTION = Range(0, 1, high_open=True)


KINDS = ("iid", "dirichlet", "classes", "user")


@declared(kind="dirichlet", alpha=0.5)
@dataclass(frozen=True)
class PartitionScheme:
    kind: str = declare(OneOf(KINDS), flag="--partition", hint=f"--partition takes {SCHEME_FORMS}")
    # Dirichlet concentration (dirichlet only)
    alpha: float | None = declare(ALPHA, None, flag="--partition dirichlet:ALPHA")
    k: int | None = declare(K, None, flag="--partition classes:K")  # classes per client
    users: tuple[int, ...] | None = None  # user: these users, client k = users[k] (None: all)

    def __post_init__(self) -> None:
        # Each kind takes exactly its own parameter, in range (a number out of range is told
        # which way to move).
        check_fields(self)
        if self.kind == "iid":
            ok = self.alpha is None and self.k is None
        elif self.kind == "dirichlet":
            ok = self.k is None and self.alpha is not None
        elif self.kind == "classes":
            ok = self.alpha is None and self.k is not None
        elif self.kind == "user":
            ok = (
                self.alpha is None
                and self.k is None
                and (
                    self.users is None
                    or (len(self.users) > 0 and len(set(self.users)) == len(self.users))
                )
            )
        else:
            ok = False
        if not ok:
            raise ConfigError(
                f"invalid partition scheme {self.kind!r} (alpha={self.alpha}, k={self.k})",
                hint=f"--partition takes {SCHEME_FORMS}",
            )

    def __str__(self) -> str:
        if self.kind == "dirichlet":
            short = f"{self.alpha:g}"
            return f"dirichlet:{short if float(short) == self.alpha else repr(self.alpha)}"
        if self.kind == "classes":
            return f"classes:{self.k}"
        if self.kind == "user":
            return "user" + (":" + ",".join(map(str, self.users)) if self.users else "")
        return "iid"


def parse_scheme(text: str | PartitionScheme) -> PartitionScheme:
    """Parse "iid", "dirichlet:0.5" or "classes:2"."""
    if isinstance(text, PartitionScheme):
        return text
    kind, _, arg = str(text).strip().lower().partition(":")
    _check_parameter(kind, arg or None)
    try:
        if kind == "iid" and not arg:
            return PartitionScheme("iid")
        if kind == "dirichlet" and arg:
            return PartitionScheme("dirichlet", alpha=float(arg))
        if kind == "classes" and arg:
            return PartitionScheme("classes", k=int(arg))
        if kind == "user":
            return PartitionScheme(
                "user", users=tuple(int(u) for u in arg.split(",")) if arg else None
            )
    except (ValueError, ConfigError):
        pass
    raise ConfigError(
        f"invalid partition scheme {text!r} for --partition",
        hint=f"use {SCHEME_FORMS}",
    )


# dirichlet:ALPHA and classes:K: their bounds, how the text is read, the name and an example.
_PARAMETERS = {
    "dirichlet": (ALPHA, float, "ALPHA", "dirichlet:0.5"),
    "classes": (K, int, "K", "classes:2"),
}


def _check_parameter(kind: str, value: float | str | None) -> None:
    """dirichlet:ALPHA or classes:K (a number, or the text after the colon) in range, told
    which way to move where it is not. Any other kind, no value, or text that is no number:
    nothing to check here (the scheme's own message lists the forms)."""
    if kind not in _PARAMETERS or value is None:
        return
    bounds, cast, name, example = _PARAMETERS[kind]
    text = value
    if isinstance(value, str):
        try:
            value = cast(value)
        except ValueError:
            return
    bounds.check(
        f"invalid partition scheme '{kind}:{text}' for --partition: {name}",
        value,
        hint=f"--partition takes {SCHEME_FORMS}",
        below=f"e.g. {example}; --partition takes {SCHEME_FORMS}",
    )


def partition(
    labels: np.ndarray,
    num_clients: int,
    scheme: str | PartitionScheme,
    seed: int,
    *,
    num_classes: int | None = None,
    min_size: int | None = None,
    groups: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Split sample indices among `num_clients` clients; one sorted int64 array per client.

    iid and dirichlet assign every sample exactly once; classes:K assigns each sample at most
    once (a class no client holds stays unassigned) and may leave a client empty. user gives
    client k every sample of its user (`groups`: the user of each sample); with fewer clients
    than users and none named, a seeded draw of whole users (`client_users` names them).
    """
    scheme = parse_scheme(scheme)
    if scheme.kind == "user":
        return _users(groups, len(np.asarray(labels)), num_clients, scheme.users, seed)
    labels = _check_labels(labels, num_classes)
    n = len(labels)
    num_classes = int(num_classes if num_classes is not None else (labels.max() + 1 if n else 0))
    Range(1, n, integer=True).check(
        "--num-clients", num_clients, above=f"{n} samples: use fewer clients or a larger dataset"
    )
    rng = np.random.default_rng(seed)
    if scheme.kind == "iid":
        parts = np.array_split(rng.permutation(n), num_clients)
    elif scheme.kind == "dirichlet":
        parts = _dirichlet(labels, num_clients, num_classes, scheme.alpha, min_size, rng)
    else:
        parts = _classes(labels, num_clients, num_classes, scheme.k, rng)
    return [np.sort(p).astype(np.int64) for p in parts]


def check_for_data(text: str | PartitionScheme, num_classes: int, users: bool) -> None:
    """What `partition` would refuse of this scheme on a dataset of `num_classes` classes (and
    with or without `users`), refused from the dataset's description, before any data is read:
    a table or a simulation states its partitions before its first client trains."""
    scheme = parse_scheme(text)
    if scheme.kind == "classes" and scheme.k > num_classes:
        raise _too_many_classes(scheme.k, num_classes)
    if scheme.kind == "user" and not users:
        raise _no_users()


def _no_users() -> ConfigError:
    return ConfigError(
        "--partition user needs data that says whose each sample is",
        hint="use a dataset with users (e.g. hapt), or iid / dirichlet:ALPHA",
    )


def _too_many_classes(k: int, num_classes: int) -> ConfigError:
    return ConfigError(
        f"classes:{k} asks for {k} classes per client but the dataset has {num_classes}",
        hint=f"use classes:K with K <= {num_classes}",
    )


def _users(groups, n: int, num_clients: int, chosen, seed: int) -> list[np.ndarray]:
    if groups is None:
        raise _no_users()
    groups = np.asarray(groups)
    if groups.shape != (n,):
        raise DataError(
            f"{n} samples but user ids of shape {groups.shape}",
            hint="give one user id per sample (a 1-D array as long as y)",
        )
    present = np.unique(groups).tolist()
    users = list(chosen) if chosen else present
    absent = [u for u in users if u not in present]
    if absent:
        raise ConfigError(
            f"--partition user: no sample of user(s) {absent} in this split",
            hint=f"its users: {','.join(map(str, present))}",
        )
    if not chosen and 1 <= num_clients < len(users):
        # Fewer clients than users: a seeded draw of whole users (client k: the k-th drawn
        # user by id), as a deployment that reaches some of the wearers would have.
        drawn = np.random.default_rng(seed).choice(len(users), num_clients, replace=False)
        users = sorted(users[i] for i in drawn.tolist())
    if num_clients != len(users):
        raise ConfigError(
            f"--partition {'user:' + ','.join(map(str, users)) if chosen else 'user'} makes "
            f"{len(users)} clients (one per user), but the run has {num_clients}",
            hint=f"set the number of clients to {len(users)} or fewer"
            if not chosen
            else f"set the number of clients to {len(users)}, or name that many users "
            "(user:ID,ID,...)",
        )
    return [np.flatnonzero(groups == u).astype(np.int64) for u in users]


def _check_labels(labels, num_classes: int | None) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or not (np.issubdtype(labels.dtype, np.integer) or labels.size == 0):
        raise DataError(
            f"expected a 1-D array of integer labels, got shape {labels.shape} ({labels.dtype})",
            hint="pass dataset.y (int64, one label per sample)",
        )
    if labels.size and (labels.min() < 0 or (num_classes and labels.max() >= num_classes)):
        top = f"{num_classes - 1}" if num_classes else "C-1"
        raise DataError(
            f"labels span {labels.min()}..{labels.max()}, expected 0..{top}",
            hint="labels must be class indices 0..num_classes-1",
        )
    return labels.astype(np.int64, copy=False)


def _dirichlet(labels, num_clients, num_classes, alpha, min_size, rng) -> list[np.ndarray]:
    # Label skew as in NIID-Bench / FedDF / FedMHO: per class, split its samples by proportions
    # drawn from Dir(alpha); a client already holding N/K samples takes no more, which keeps
    # sizes from exploding; re-draw until every client holds min_size samples.
    n = len(labels)
    if min_size is None:
        min_size = min(10, n // (2 * num_clients))  # tiny sets (digits) cannot promise 10 each
    if min_size > n // num_clients:
        raise ConfigError(
            f"min_size {min_size} is more than an equal share ({n // num_clients}) of {n} samples "
            f"among {num_clients} clients",
            hint="lower min_size or --num-clients",
        )
    by_class = [np.flatnonzero(labels == c) for c in range(num_classes)]
    cap = n / num_clients
    for _ in range(MAX_REDRAWS):
        shards: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(num_clients, alpha))
            open_ = sizes < cap
            p = p * open_
            # Tiny alphas can underflow every open share to 0; then split evenly among the open.
            p = p / p.sum() if p.sum() > 0 else open_ / open_.sum()
            cuts = (np.cumsum(p) * len(idx)).astype(np.int64)[:-1]
            for j, piece in enumerate(np.split(idx, cuts)):
                shards[j].append(piece)
                sizes[j] += len(piece)
        if sizes.min() >= min_size:
            return [np.concatenate(s) if s else np.empty(0, np.int64) for s in shards]
    raise ConfigError(
        f"dirichlet:{alpha:g} over {num_clients} clients could not give every client "
        f"{min_size} samples in {MAX_REDRAWS} draws: alpha/num_clients are too extreme for "
        f"{n} samples",
        hint="lower --num-clients or raise alpha (e.g. dirichlet:0.5)",
    )


def _classes(labels, num_clients, num_classes, k, rng) -> list[np.ndarray]:
    if k > num_classes:
        raise _too_many_classes(k, num_classes)
    # Walk a seeded class order round-robin: K consecutive positions are K distinct classes, and
    # every class is dealt once K * num_clients >= C.
    order = rng.permutation(num_classes)
    held = [order[(i * k + np.arange(k)) % num_classes] for i in range(num_clients)]
    holders: list[list[int]] = [[] for _ in range(num_classes)]
    for client, classes in enumerate(held):
        for c in classes:
            holders[c].append(client)
    shards: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(num_classes):
        if not holders[c]:
            continue
        idx = rng.permutation(np.flatnonzero(labels == c))
        for client, piece in zip(holders[c], np.array_split(idx, len(holders[c])), strict=True):
            shards[client].append(piece)
    return [np.concatenate(s) if s else np.empty(0, np.int64) for s in shards]


def label_count_matrix(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """(clients x classes) int64 matrix of how many samples of each class each client holds."""
    labels = np.asarray(labels)
    counts = np.zeros((len(parts), num_classes), dtype=np.int64)
    for i, p in enumerate(parts):
        counts[i] = np.bincount(labels[p], minlength=num_classes)[:num_classes]
    return counts


def carve_public(
    n: int,
    size: int,
    seed: int,
    groups: np.ndarray | None = None,
    partition: str | PartitionScheme | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Hold out `size` of `n` samples as an unlabeled public split: (rest, public), sorted.

    With `groups` (the user of each sample), the public split is whole users: the fewest of a
    seeded draw of users that hold at least `size` samples, never one that the clients'
    `partition` names (user:ID,...). Public data then comes from people no client is, as a
    server's would; a random slice of samples would share every client's users (and their
    wearing habits) and flatter FedDF and FedOL.
    """
    Range(0, n, integer=True).check(
        "--public-size", size, above=f"the training set has {n} samples: use fewer"
    )
    if groups is None or size == 0:
        perm = np.random.default_rng(seed).permutation(n)
        return np.sort(perm[size:]).astype(np.int64), np.sort(perm[:size]).astype(np.int64)
    groups = np.asarray(groups)
    public = np.isin(groups, _public_users(groups, size, seed, _named_users(partition)))
    return np.flatnonzero(~public).astype(np.int64), np.flatnonzero(public).astype(np.int64)


def _named_users(partition: str | PartitionScheme | None) -> set[int]:
    """The users a user:ID,... `partition` gives the clients (none for any other scheme)."""
    scheme = parse_scheme(partition) if partition is not None else None
    return set(scheme.users or ()) if scheme is not None and scheme.kind == "user" else set()


def _public_users(groups: np.ndarray, size: int, seed: int, named: set[int]) -> np.ndarray:
    """The fewest users of a seeded draw, none of them `named`, holding >= `size` samples."""
    users = np.random.default_rng(seed).permutation(np.unique(groups))
    users = users[[u not in named for u in users.tolist()]]
    counts = np.array([np.count_nonzero(groups == u) for u in users], dtype=np.int64)
    taken = users[: int(np.searchsorted(np.cumsum(counts), size)) + 1]
    # Every user left to draw from may go public when the clients are named ones; otherwise
    # at least one user must stay behind to be a client.
    if counts.sum() < size or (not named and len(taken) == len(users)):
        raise _too_few_users(size, len(users), counts, named)
    return taken


def _too_few_users(size: int, n_users: int, counts: np.ndarray, named: set[int]) -> ConfigError:
    pool = "users the clients' --partition does not name" if named else "users"
    return ConfigError(
        f"a public set of {size:,} samples is whole users here, and the {n_users} "
        f"{pool} hold {counts.sum():,} samples: too few"
        + ("" if named else " to leave any for the clients"),
        hint="lower --public-size"
        + (
            f" (users here hold {counts.min():,}-{counts.max():,} samples each)"
            if len(counts)
            else ""
        ),
    )


def train_val_split(
    indices: np.ndarray, val_fraction: float = 0.1, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Split a client's shard into local (train, val); >= 1 val sample once it has >= 2 samples."""
    VAL_FRACTION.check("validation fraction", val_fraction, below="e.g. 0.1", above="e.g. 0.1")
    indices = np.asarray(indices, dtype=np.int64)
    n = len(indices)
    n_val = round(n * val_fraction)
    if val_fraction > 0 and n >= 2:
        n_val = min(max(n_val, 1), n - 1)
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(indices[perm[n_val:]]), np.sort(indices[perm[:n_val]])


def client_users(groups: np.ndarray | None, parts: list[np.ndarray]) -> list[int] | None:
    """The user each client of a user partition holds (None when the data names no users or a
    client holds several)."""
    if groups is None:
        return None
    groups = np.asarray(groups)
    users = [np.unique(groups[p]).tolist() for p in parts]
    if any(len(u) != 1 for u in users):
        return None
    return [int(u[0]) for u in users]
