"""A seed table's Fashion-MNIST block (issue 56 item 2): `edgefl reproduce TABLE --dataset
fmnist` runs the table's federation on Fashion-MNIST with what the paper sets apart for it, the
paper's Fashion numbers beside ours, and each method's per-dataset options resolved from the
uploads (FedMHO's Table 7: lr 5e-4 on FMNIST)."""

from __future__ import annotations

import json

import pytest

from edgefl.data import locate
from edgefl.errors import ConfigError
from edgefl.reproduce.tables import TABLES


@pytest.mark.parametrize("name", ["fedmho-table3", "fedhydra-table1", "pfedzkd-table2"])
def test_every_seed_table_has_a_fashion_block(name):
    base = TABLES.get(name)
    fashion = base.on("fmnist")
    assert base.dataset == "mnist" and fashion.dataset == "fmnist"
    assert "Fashion-MNIST" in fashion.title and "Fashion-MNIST" not in base.title
    assert fashion.methods == base.methods and fashion.budgets.keys() == base.budgets.keys()
    assert base.on(None) is base and base.on("mnist") is base
    with pytest.raises(ConfigError, match="--dataset must be one of mnist, fmnist"):
        base.on("cifar10")


def test_fedmho_table3_fashion_clients_train_table_7s_fmnist_column():
    """CVAEs: 40 local epochs on FMNIST (30 on MNIST), at the paper's and the cpu budget."""
    base, fashion = TABLES.get("fedmho-table3"), TABLES.get("fedmho-table3").on("fmnist")
    for budget in ("cpu", "paper", "code"):
        assert base.budgets[budget].simulate["generator_epochs"] == 30
        assert fashion.budgets[budget].simulate["generator_epochs"] == 40
    assert fashion.budgets["smoke"] == base.budgets["smoke"]


def test_an_unknown_block_is_refused_before_any_work(cli, tmp_path):
    out = tmp_path / "never"
    result = cli("reproduce", "fedhydra-table1", "--dataset", "svhn", "--out", str(out))
    assert result.exit_code == 2 and "--dataset must be one of mnist, fmnist" in result.output
    assert not out.exists()


@pytest.mark.skipif(
    locate.find("fmnist") is None, reason="Fashion-MNIST is not installed (make setup does it)"
)
def test_one_fashion_cell_through_the_cli(cli, tmp_path):
    out = tmp_path / "fashion"
    args = ["fedmho-table3", "--dataset", "fmnist", "--budget", "smoke"]
    result = cli("reproduce", *args, "--methods", "fedmho", "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["dataset"] == "fmnist" and "Fashion-MNIST" in summary["title"]
    cell = summary["rows"][0]["partitions"]["dirichlet:0.5"]
    assert cell["paper"] == 75.30  # FedMHO Table 3, Fashion, Dir(0.5)
    assert 0 <= cell["mean"] <= 100 and cell["gap"] == pytest.approx(cell["mean"] - 75.30)
    report = json.loads((out / "fedmho" / "dirichlet0.5-s0" / "global" / "fedmho.json").read_text())
    assert report["config"]["lr"] == 5e-4  # Table 7's FMNIST global lr, from the uploads
    assert report["config"]["epochs"] == 1  # the smoke budget's, given: it wins
    md = (out / "table.md").read_text()
    assert "--budget smoke --dataset fmnist --methods fedmho" in md and "| 75.30 |" in md
