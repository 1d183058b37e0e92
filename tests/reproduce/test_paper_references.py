"""The seed papers' Fashion-MNIST numbers beside ours (issue 56): FedMHO Table 3, FedHydra Table
1 and pFedZKD Table 2 each hold a Fashion block; every method those tables report carries its
cell, so `simulate` and `reproduce` print the paper's number on fmnist as on mnist."""

from __future__ import annotations

import pytest

from edgefl.fusion import METHODS, paper_reference

FEDMHO = "FedMHO paper, Table 3"
FEDHYDRA = "FedHydra paper, Table 1"
PFEDZKD = "pFedZKD paper, Table 2"


@pytest.mark.parametrize(
    ("source", "clients", "partitions", "methods"),
    [
        (
            FEDMHO,
            10,
            (0.5, 0.3, 0.1),
            (
                "fedavg",
                "feddf",
                "dense",
                "coboosting",
                "fedcvae-ens",
                "fedmho",
                "fedmho-md",
                "fedmho-sd",
            ),
        ),
        (
            FEDHYDRA,
            5,
            (0.5, 0.3, 0.1, 0.01),
            ("fedavg", "feddf", "dense", "coboosting", "fedhydra"),
        ),
        (PFEDZKD, 10, (0.1, 0.3, 0.5), ("pfedzkd", "fedavg", "feddf", "dense", "fedmho")),
    ],
)
def test_every_cell_of_each_fashion_block_has_its_paper_number(
    source, clients, partitions, methods
):
    for alpha in partitions:
        got = paper_reference("fmnist", f"dirichlet:{alpha:g}", clients, source)
        assert set(methods) <= set(got), (source, alpha, set(methods) - set(got))
        assert all(20 < v < 100 for v in got.values())


def test_spot_checks_against_the_papers_text():
    """A few cells as printed in the papers (shared/papers/*.txt)."""
    assert paper_reference("fmnist", "dirichlet:0.5", 10, FEDMHO)["fedmho-sd"] == 77.73
    assert paper_reference("fmnist", "dirichlet:0.1", 10, FEDMHO)["fedmho-md"] == 71.04
    assert paper_reference("fmnist", "dirichlet:0.3", 10, FEDMHO)["fedcvae-ens"] == 68.39
    assert paper_reference("fmnist", "dirichlet:0.5", 5, FEDHYDRA)["fedhydra"] == 77.20
    assert paper_reference("fmnist", "dirichlet:0.01", 5, FEDHYDRA)["coboosting"] == 42.38
    # pFedZKD's columns run MNIST, SVHN, Fashion-MNIST, CIFAR-10: its Fashion row is the third.
    assert paper_reference("fmnist", "dirichlet:0.5", 10, PFEDZKD)["pfedzkd"] == 83.98
    assert paper_reference("fmnist", "dirichlet:0.1", 10, PFEDZKD)["dense"] == 58.00


def test_simulate_prints_fedmho_table3_first_on_fashion_as_on_mnist():
    """Where two papers report a method in one setting, simulate's column is FedMHO's Table 3
    (the setting its default mix reproduces), on either dataset."""
    ref = paper_reference("fmnist", "dirichlet:0.5", 10)
    assert ref["fedavg"] == 60.24 and ref["dense"] == 72.29 and ref["fedmho"] == 75.30
    assert METHODS.get("pfedzkd").reference("fmnist", "dirichlet:0.5", 10).accuracy == 83.98
