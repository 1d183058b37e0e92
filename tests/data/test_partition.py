"""Client partitions: disjoint covers, label skew, determinism, and the held-out public split."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgefl.data import (
    PartitionScheme,
    carve_public,
    label_count_matrix,
    load_dataset,
    parse_scheme,
    partition,
    train_val_split,
)
from edgefl.errors import ConfigError, DataError

SCHEMES = ["iid", "dirichlet:0.1", "dirichlet:0.5", "classes:2"]


@pytest.fixture(scope="module")
def digits_y() -> np.ndarray:
    return load_dataset("digits").y


def synthetic_labels(n: int = 3000, classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, size=n)


def assert_disjoint(parts: list[np.ndarray], n: int, cover: bool) -> None:
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined), "a sample went to two clients"
    assert joined.min() >= 0 and joined.max() < n
    if cover:
        assert len(joined) == n, "a sample went to no client"
    for p in parts:
        assert p.dtype == np.int64 and np.all(np.diff(p) > 0)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("source", ["digits", "synthetic"])
def test_partition_contract(scheme, source, digits_y):
    labels = digits_y if source == "digits" else synthetic_labels()
    parts = partition(labels, 10, scheme, seed=0)
    assert len(parts) == 10
    assert_disjoint(parts, len(labels), cover=not scheme.startswith("classes"))
    counts = label_count_matrix(labels, parts, 10)
    for p, row in zip(parts, counts, strict=True):
        assert np.array_equal(np.bincount(labels[p], minlength=10), row)
    if scheme.startswith("dirichlet"):
        assert counts.sum(axis=1).min() >= 10  # the default min_size
    # same seed, same split; another seed, another split
    again = partition(labels, 10, scheme, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = partition(labels, 10, scheme, seed=1)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_dirichlet_skew_grows_as_alpha_shrinks():
    labels = synthetic_labels()

    def mean_classes_held(alpha: float) -> float:
        parts = partition(labels, 10, f"dirichlet:{alpha}", seed=0)
        return float((label_count_matrix(labels, parts, 10) > 0).sum(axis=1).mean())

    assert mean_classes_held(0.1) < mean_classes_held(100.0) == 10.0


def test_classes_k_gives_exactly_k_classes(digits_y):
    for k in (1, 2, 3):
        parts = partition(digits_y, 10, f"classes:{k}", seed=4)
        counts = label_count_matrix(digits_y, parts, 10)
        assert np.all((counts > 0).sum(axis=1) == k)
        assert np.all(counts.sum(axis=0) > 0)  # K * clients >= C: every class is dealt
    with pytest.raises(ConfigError, match="classes:11"):
        partition(digits_y, 3, "classes:11", seed=0)


def test_classes_k_may_leave_samples_and_clients_empty():
    labels = np.repeat(np.arange(4), 5)
    parts = partition(labels, 2, "classes:1", seed=0)  # 2 of 4 classes dealt
    assert_disjoint(parts, len(labels), cover=False)
    assert sum(len(p) for p in parts) == 10
    labels = np.array([0, 0, 0, 1, 1, 1])
    parts = partition(labels, 2, "classes:1", seed=0, num_classes=3)  # class 2 has no samples
    assert sorted(len(p) for p in parts) in ([0, 3], [3, 3])


def test_min_size_respected_and_impossible_settings():
    labels = synthetic_labels(600)
    parts = partition(labels, 6, "dirichlet:0.3", seed=2, min_size=40)
    assert min(len(p) for p in parts) >= 40
    with pytest.raises(ConfigError, match="min_size"):
        partition(labels, 6, "dirichlet:0.3", seed=2, min_size=101)
    with pytest.raises(ConfigError, match="too extreme") as err:
        partition(labels, 50, "dirichlet:0.01", seed=0, min_size=12)
    assert "--num-clients" in err.value.hint


def test_bad_arguments():
    labels = synthetic_labels(20)
    for n in (0, 21):
        with pytest.raises(ConfigError, match="--num-clients"):
            partition(labels, n, "iid", seed=0)
    with pytest.raises(DataError, match="integer labels"):
        partition(np.zeros((4, 2), int), 2, "iid", seed=0)
    with pytest.raises(DataError, match="expected 0..4"):
        partition(labels, 2, "iid", seed=0, num_classes=5)


@pytest.mark.parametrize("text", ["iid", "dirichlet:0.5", "dirichlet:0.01", "classes:2"])
def test_parse_scheme_round_trip(text):
    scheme = parse_scheme(text)
    assert str(scheme) == text and parse_scheme(scheme) is scheme
    assert parse_scheme(f" {text.upper()} ") == scheme


@pytest.mark.parametrize(
    "text",
    [
        "",
        "dir:0.5",
        "dirichlet",
        "dirichlet:0",
        "dirichlet:-1",
        "dirichlet:nan",
        "classes:0",
        "classes:1.5",
        "iid:3",
    ],
)
def test_parse_scheme_rejects(text):
    with pytest.raises(ConfigError, match="for --partition") as err:
        parse_scheme(text)
    assert "dirichlet:ALPHA" in err.value.hint
    with pytest.raises(ConfigError):
        PartitionScheme("dirichlet", alpha=0.0)


@settings(max_examples=30, deadline=2000, database=None)  # no .hypothesis/ litter
@given(
    num_clients=st.integers(1, 12),
    alpha=st.floats(0.05, 10.0),
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(300, 1500),
)
def test_dirichlet_is_a_disjoint_cover(num_clients, alpha, seed, n):
    labels = synthetic_labels(n, seed=seed % 1000)
    parts = partition(labels, num_clients, PartitionScheme("dirichlet", alpha=alpha), seed)
    assert len(parts) == num_clients
    assert_disjoint(parts, n, cover=True)


def test_carve_public_and_train_val_split():
    rest, public = carve_public(1000, 100, seed=0)
    assert len(public) == 100 and len(rest) == 900
    assert len(np.intersect1d(rest, public)) == 0
    assert np.array_equal(np.union1d(rest, public), np.arange(1000))
    assert np.array_equal(carve_public(1000, 100, seed=0)[1], public)
    assert not np.array_equal(carve_public(1000, 100, seed=1)[1], public)
    with pytest.raises(ConfigError):
        carve_public(10, 11, seed=0)

    shard = np.arange(50, 80)
    tr, va = train_val_split(shard, 0.1, seed=0)
    assert len(va) == 3 and np.array_equal(np.union1d(tr, va), shard)
    assert len(np.intersect1d(tr, va)) == 0
    assert [len(v) for v in train_val_split(np.array([4, 9]), 0.1, seed=0)] == [1, 1]
    assert len(train_val_split(np.array([4]), 0.1, seed=0)[1]) == 0
    with pytest.raises(ConfigError, match="validation fraction"):
        train_val_split(shard, 1.0)


def test_carve_public_of_data_with_users_takes_whole_users():
    groups = np.repeat([3, 5, 8, 11, 12, 20], [40, 10, 30, 25, 50, 45])  # 200 samples, 6 users
    rest, public = carve_public(200, 60, seed=0, groups=groups)
    taken = set(groups[public].tolist())
    assert not taken & set(groups[rest].tolist())  # no user is on both sides
    assert np.array_equal(np.union1d(rest, public), np.arange(200))
    assert len(public) >= 60  # users of the seeded draw until they hold 60 samples, no more:
    assert any(len(public) - np.count_nonzero(groups == u) < 60 for u in taken)  # the last
    assert np.array_equal(carve_public(200, 60, seed=0, groups=groups)[1], public)
    # Users the clients' partition names are never drawn, whatever the seed.
    for seed in range(20):
        _, pub = carve_public(200, 50, seed, groups, partition="user:3,12,20")
        assert not {3, 12, 20} & set(groups[pub].tolist())
    # All of the unnamed users may go public; not more than they hold.
    _, pub = carve_public(200, 65, 0, groups, partition="user:3,12,20")
    assert set(groups[pub].tolist()) == {5, 8, 11}
    with pytest.raises(ConfigError, match="too few"):
        carve_public(200, 66, 0, groups, partition="user:3,12,20")
    # Without named clients, at least one user stays behind to be a client.
    with pytest.raises(ConfigError, match="leave any for the clients"):
        carve_public(200, 195, 0, groups)  # a user holds >= 10
