"""The papers' tables `edgefl reproduce` runs: one entry per table, explicit, like the methods.

An entry says what the paper measured: the dataset, the federation (device classes, clients,
public split), the client settings its methods ran in (each method in its own paper's setting:
FedMHO's Table 1 gives the baselines classifiers on every client and FedCVAE CVAEs on every
client) and the named budgets it can be run at. The paper's numbers are not here: each method's
registry entry holds its `references`, read through `edgefl.fusion.paper_reference`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields, replace
from typing import Any

from edgefl.fusion.base import PFEDZKD_TABLE2 as PFEDZKD_TABLE2_SOURCE
from edgefl.registry import Registry


@dataclass(frozen=True)
class Setting:
    """One client setting: the model each device class trains (the paper's prototype, by zoo
    name) and the methods the table reports from it."""

    name: str
    description: str
    models: dict[str, str]  # device profile -> the paper's prototype (a zoo model)
    methods: tuple[str, ...]


@dataclass(frozen=True)
class Budget:
    """A named way to run a table: which partitions and seeds, what replaces the paper's
    prototypes, the clients' local training and the fusion methods' options."""

    name: str
    description: str
    partitions: tuple[str, ...]
    seeds: tuple[int, ...]
    estimate: str  # how long it takes, and on what
    substitutes: dict[str, str] = field(default_factory=dict)  # paper prototype -> trained instead
    # Fields of edgefl.simulate.job.SimJob the clients' training takes from this budget
    # (classifier_epochs, generator_lr, ...); anything unset is the profile's.
    simulate: dict[str, Any] = field(default_factory=dict)
    fusion: str = "cpu"  # the methods' named budget (edgefl.fusion.BUDGETS)
    fuse_options: dict[str, dict[str, Any]] = field(default_factory=dict)  # over `fusion`'s
    reductions: tuple[str, ...] = ()  # what differs from the paper, in words (printed)


@dataclass(frozen=True)
class Table:
    name: str
    title: str
    source: str  # paper and table, as the methods' references name it
    dataset: str
    clients: int
    mix: str  # device classes, as `simulate --mix`
    settings: tuple[Setting, ...]
    budgets: dict[str, Budget]
    # Samples carved from train as the public set in every setting, so that client k holds the
    # same data whichever setting it trains in (a method with public data needs the carve).
    public_size: int = 0
    notes: tuple[str, ...] = ()
    # The datasets the paper's table has a block for, each with what the paper sets apart for
    # it, by budget (fields of SimJob over the budget's `simulate`): `on(dataset)`. The
    # methods' own per-dataset options resolve from the uploads (`option(by_dataset=...)`).
    datasets: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Every table with a paper budget runs at "code" too: the paper's clients (no authors'
        # code says they trained otherwise), each method fused at its `code` budget.
        if "paper" in self.budgets and "code" not in self.budgets:
            paper = self.budgets["paper"]
            code = replace(
                paper,
                name="code",
                description="the paper's clients; each method's fusion as its authors' "
                "public code runs it (`edgefl server methods NAME`): a GPU job",
                fusion="code",
                reductions=(
                    *paper.reductions,
                    "fusion at each method's code budget (its "
                    "paper budget where the authors' code follows the paper)",
                ),
            )
            object.__setattr__(self, "budgets", self.budgets | {"code": code})

    def on(self, dataset: str | None) -> Table:
        """This table's block for `dataset` (None: the table's own, MNIST)."""
        if dataset is None or dataset == self.dataset:
            return self
        if dataset not in self.datasets:
            from edgefl.errors import ConfigError

            close = difflib.get_close_matches(dataset, self.dataset_names, n=1, cutoff=0.5)
            raise ConfigError(
                f"--dataset must be one of {', '.join(self.dataset_names)} for {self.name}, "
                f"got {dataset!r}",
                hint=f"did you mean {close[0]!r}?"
                if close
                else "the paper's table has no block for it; `edgefl simulate --dataset "
                "NAME` runs a federation on any dataset",
            )
        over = self.datasets[dataset]
        label = DATASET_LABELS[dataset]
        budgets = {n: _on(b, over.get(n, {}), label) for n, b in self.budgets.items()}
        return replace(
            self,
            dataset=dataset,
            title=self.title.replace(DATASET_LABELS[self.dataset], label, 1),
            budgets=budgets,
        )

    @property
    def dataset_names(self) -> tuple[str, ...]:
        return (self.dataset, *self.datasets)

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(m for s in self.settings for m in s.methods)

    def setting(self, name: str) -> Setting:
        for s in self.settings:
            if s.name == name:
                return s
        from edgefl.errors import UnknownNameError

        raise UnknownNameError("setting", name, [s.name for s in self.settings])

    def setting_of(self, method: str) -> Setting:
        return next(s for s in self.settings if method in s.methods)


def _on(budget: Budget, over: dict[str, Any], label: str) -> Budget:
    """`budget` with a dataset block's client settings laid over its own, said in its
    reductions (they override what the budget's own lines say of those settings)."""
    if not over:
        return budget
    said = "; ".join(f"{k.replace('_', ' ')} {v}" for k, v in over.items())
    return replace(
        budget,
        simulate=budget.simulate | over,
        reductions=(*budget.reductions, f"on {label}, as the paper sets it there: {said}"),
    )


TABLES: Registry[Table] = Registry("table")
# How the tables' titles name each dataset a block covers.
DATASET_LABELS = {"mnist": "MNIST", "fmnist": "Fashion-MNIST"}
TABLE_FIELDS = {f.name for f in fields(Table)}


# FedMHO (Yao et al., WWW 2026), Table 3, MNIST. Table 1 gives each method its own clients:
# large = VGG-9 / CVAE-large, small = CNN / CVAE-small; Table 7 the local and global training.
FEDMHO_TABLE3 = Table(
    name="fedmho-table3",
    title="FedMHO Table 3: MNIST, 10 clients (5 large, 5 small), top-1 %",
    source="FedMHO paper, Table 3",
    dataset="mnist",
    clients=10,
    mix="smartphone:5,wristband:5",
    public_size=5_000,  # FedDF distils on a public set; carved in every setting alike
    settings=(
        Setting(
            "classifiers",
            "FedMHO Table 1 for FedAvg, FedDF, DENSE, Co-Boosting: classifiers on all 10 "
            "(VGG-9 on the large clients, CNN on the small)",
            {"smartphone": "vgg9", "wristband": "cnn"},
            ("fedavg", "ensemble", "feddf", "dense", "coboosting"),
        ),
        Setting(
            "fedcvae",
            "FedMHO Table 1 for FedCVAE: CVAEs on all 10 (CVAE-large on the "
            "large clients, CVAE-small on the small)",
            {"smartphone": "cvae-large", "wristband": "cvae-small"},
            ("fedcvae-ens",),
        ),
        Setting(
            "fedmho",
            "FedMHO Table 1 for the FedMHOs: VGG-9 on the large clients, CVAE-small on the small",
            {"smartphone": "vgg9", "wristband": "cvae-small"},
            ("fedmho", "fedmho-md", "fedmho-sd", "fedmho-cw"),
        ),
    ),
    budgets={
        "cpu": Budget(
            name="cpu",
            description="what 2 CPU cores finish in under an hour and a half",
            partitions=("dirichlet:0.5", "dirichlet:0.1"),
            seeds=(0, 1, 2),
            estimate="about 80 minutes on 2 quiet CPU cores with --jobs 2 (Fashion-MNIST: 78, "
            "2026-11-30): 18 cells of 2.5-7 min, the classifiers' 6 the longest (Co-Boosting's "
            "fusion ~5 min of each)",
            substitutes={"vgg9": "scnn:width=16,hidden=128", "cvae-large": "cvae-mlp:hidden=512"},
            simulate={
                "classifier_epochs": 30,
                "generator_epochs": 30,
                "classifier_optimizer": "sgd-momentum",
                "generator_optimizer": "adam",
                "classifier_batch_size": 64,
                "generator_batch_size": 16,
            },
            fusion="cpu",
            # Co-Boosting at 40 epochs: at its cpu budget's 10 it was 5.6 points under the
            # paper's MNIST Dir(0.1) cell (bench/results/fedmho_table3_cpu_coboosting_dir01_epochs.md)
            fuse_options={"fedcvae-ens": {"synthetic": 6_000}, "coboosting": {"epochs": 40}},
            reductions=(
                "VGG-9 -> scnn:width=16,hidden=128 (111k parameters, 1% of VGG-9's MACs)",
                "CVAE-large -> cvae-mlp:hidden=512 (an MLP CVAE twice CVAE-small's width)",
                "classifiers train 30 local epochs at SGD-momentum lr 0.01 (paper: 200 at 5e-3)",
                "CVAEs train at Adam lr 1e-3, batch 16 (paper: 5e-2, batch 64; 30 epochs as "
                "the paper)",
                "Dir(0.5) and Dir(0.1) only (paper: also Dir(0.3))",
                "fusion at each method's cpu budget (DENSE: 10 epochs, paper 200), "
                "Co-Boosting's at 40 epochs (its cpu budget: 10)",
            ),
        ),
        "smoke": Budget(
            name="smoke",
            description="a check that the table runs end to end, not a result: one local epoch "
            "and one fusion epoch on 3,000 training images",
            partitions=("dirichlet:0.5",),
            seeds=(0,),
            estimate="under a minute a cell on 2 CPU cores; 3 cells, fewer with --methods",
            substitutes={"vgg9": "scnn:width=16,hidden=128", "cvae-large": "cvae-mlp:hidden=512"},
            simulate={
                "subset": 3_000,
                "public_size": 500,
                "classifier_epochs": 1,
                "generator_epochs": 1,
                "classifier_optimizer": "sgd-momentum",
                "generator_optimizer": "adam",
                "classifier_batch_size": 64,
                "generator_batch_size": 16,
            },
            fusion="cpu",
            fuse_options={
                **{
                    m: {"epochs": 1, "synthetic": 600}
                    for m in ("fedcvae-ens", "fedmho", "fedmho-md", "fedmho-sd", "fedmho-cw")
                },
                "feddf": {"epochs": 1},
                "dense": {"epochs": 1, "gen_steps": 2},
                "coboosting": {"epochs": 1, "gen_steps": 2},
            },
            reductions=(
                "a smoke test, not the paper's setting: its numbers say the table runs",
                "3,000 training images (500 of them the public set); by default one seed, "
                "Dir(0.5) only",
                "clients train 1 local epoch (VGG-9 and CVAE-large replaced as at --budget cpu)",
                "fusion: 1 epoch, 600 synthetic samples, 2 generator steps where a method has them",
            ),
        ),
        "paper": Budget(
            name="paper",
            description="the paper's own settings (Table 7): a GPU job",
            partitions=("dirichlet:0.5", "dirichlet:0.3", "dirichlet:0.1"),
            seeds=(0, 1, 2),
            estimate="days on 2 CPU cores; hours on one GPU (--train-device cuda --device cuda)",
            simulate={
                "classifier_epochs": 200,
                "classifier_lr": 5e-3,
                "classifier_optimizer": "sgd-momentum",
                "generator_epochs": 30,
                "generator_lr": 5e-2,
                "generator_optimizer": "adam",
                "classifier_batch_size": 64,
                "generator_batch_size": 64,
            },
            fusion="paper",
            fuse_options={"fedcvae-ens": {"synthetic": 6_000}},
        ),
    },
    # Table 7's FMNIST column: CVAEs train 40 local epochs (30 on MNIST), as at --budget cpu
    # (which keeps the paper's CVAE epochs); the global lr and epochs are FedMHO's options by
    # dataset (5e-4, 20).
    datasets={"fmnist": {b: {"generator_epochs": 40} for b in ("cpu", "paper", "code")}},
    notes=(
        "FedAvg averages parameters, which needs one architecture: in Table 1's classifier "
        "setting the large and small clients differ, so edgefl's fedavg averages the larger "
        "group of one architecture (5 and 5: the group holding more training samples) and sets "
        "the other 5 aside by name; its cell says which ('5 of 10: ... only') and has no gap: "
        "it is not the paper's FedAvg row. "
        "The paper reports FedAvg and FedDF as 'the voting outcome of model prototypes' "
        "(Sec. 5.1.2); the ensemble row (the logit average of all 10 classifiers) is the "
        "nearest edgefl measures to that vote. With --federation fedmho, fedavg averages the "
        "5 large classifiers.",
        "CNN classifiers on the small clients train with the classifiers' optimizer "
        "(SGD-momentum); Table 7 names it for VGG-9 only.",
        "Every setting first carves FedDF's public set from train (5,000 samples; 500 at "
        "--budget smoke), so client k holds the same data in every setting.",
    ),
)

TABLES.add(FEDMHO_TABLE3.name, FEDMHO_TABLE3)


# FedHydra (fedhydra.txt), Table 1, MNIST: 5 clients with one two-layer CNN each (Sec. 4.1.3),
# SGD lr 0.01, batch 128, 200 local epochs (Sec. 4.1.5). FedHydra's and Co-Boosting's rows have
# a paper number here; the other baselines' registry entries cite FedMHO's 10-client table.
FEDHYDRA_TABLE1 = Table(
    name="fedhydra-table1",
    title="FedHydra Table 1: MNIST, 5 clients, homogeneous two-layer CNN, top-1 %",
    source="FedHydra paper, Table 1",
    dataset="mnist",
    clients=5,
    mix="smartphone:5",
    public_size=5_000,  # FedDF distils on a public set, carved from train before the shards
    settings=(
        Setting(
            "cnn",
            "FedHydra Sec. 4.1.3: the same two-layer CNN on every client",
            {"smartphone": "cnn"},
            ("fedavg", "ensemble", "feddf", "dense", "fedhydra", "coboosting"),
        ),
    ),
    budgets={
        "cpu": Budget(
            name="cpu",
            description="the methods' cpu fusion on clients of 40 local epochs: under 90 min "
            "on 2 cores",
            partitions=("dirichlet:0.5", "dirichlet:0.3", "dirichlet:0.1"),
            seeds=(0, 1, 2),
            estimate="about 80 min on 2 quiet CPU cores with --jobs 2: 9 cells of ~9 min "
            "(Fashion-MNIST, 2026-12-01: 78.7 min)",
            # 40 local epochs, not 5: the teachers are what every method distils, and a client's
            # epoch costs ~1 s here (measured, Fashion Dir(0.5) seed 0: fedavg 57.77 -> 70.81,
            # the teachers' ensemble 58.41 -> 63.14 from 5 to 40 epochs)
            simulate={"classifier_epochs": 40, "classifier_optimizer": "sgd-momentum"},
            # DENSE and Co-Boosting at 40 epochs: their students climb with the generator's
            # epochs (Fashion, DENSE 60.48 / 58.52 / 51.52 at 10, 67.02 / 66.16 / 53.79 at 40,
            # bench/results/dense_epochs.md; Co-Boosting 70.77 / 63.37 at 10, 76.60 / 71.69 at
            # 40, bench/results/fashion_fedhydra_table1_cpu_coboosting40.md)
            fuse_options={"dense": {"epochs": 40}, "coboosting": {"epochs": 40}},
            reductions=(
                "clients train 40 local epochs, SGD-momentum lr 0.01, batch 64 (paper: 200, "
                "SGD lr 0.01, batch 128)",
                "Dir(0.5), Dir(0.3) and Dir(0.1) (paper: also Dir(0.01))",
                "fusion at each method's cpu budget, DENSE's and Co-Boosting's at 40 epochs "
                "(FedHydra 24; paper 200)",
            ),
        ),
        "paper": Budget(
            name="paper",
            description="the paper's own settings (Sec. 4.1.5): a GPU job",
            partitions=("dirichlet:0.5", "dirichlet:0.3", "dirichlet:0.1", "dirichlet:0.01"),
            seeds=(0, 1, 2),
            estimate="hours on one GPU (--train-device cuda --device cuda)",
            simulate={
                "classifier_epochs": 200,
                "classifier_lr": 0.01,
                "classifier_optimizer": "sgd",
                "classifier_batch_size": 128,
            },
            fusion="paper",
        ),
    },
    # Sec. 4.1.5 sets one training for every dataset: FashionMNIST's block as MNIST's.
    datasets={"fmnist": {}},
    notes=(
        "The CNN is edgefl's `cnn` (FedMHO's two-conv MNIST CNN); FedHydra's appendix G model "
        "may differ in widths.",
        "FedDF distils on a public set of 5,000 training samples carved out before the shards "
        "are drawn (the paper does not say which public data its FedDF used); since 2026-12-04 "
        "every row's clients train on the other 55,000. OT is not implemented.",
    ),
)

TABLES.add(FEDHYDRA_TABLE1.name, FEDHYDRA_TABLE1)


# pFedZKD (pfedzkd.txt), Table 2, MNIST: clients search their own CNN with PSO-FedNAS and train
# it with Adam lr 1e-3, batch 64 (Sec. 4.1.2): the raspberry-pi-5 profile's optimizer and batch.
# The paper does not say how many clients; its Fig. 2 shows ten, as does FedMHO's table it cites.
PFEDZKD_TABLE2 = Table(
    name="pfedzkd-table2",
    title="pFedZKD Table 2: MNIST, 10 clients, top-1 %",
    source=PFEDZKD_TABLE2_SOURCE,
    dataset="mnist",
    clients=10,
    mix="raspberry-pi-5:10",
    public_size=5_000,  # FedDF distils on a public set; carved in every setting alike
    settings=(
        Setting(
            "pso",
            "pFedZKD Sec. 3: each client searches its own CNN (PSO-FedNAS) on its own data",
            {"raspberry-pi-5": "search:pso"},
            ("pfedzkd", "ensemble"),
        ),
        Setting(
            "cnn",
            "the baselines' predefined architecture: the same CNN on every client (edgefl's "
            "`cnn`; the paper does not name theirs)",
            {"raspberry-pi-5": "cnn"},
            ("fedavg", "feddf", "dense"),
        ),
    ),
    budgets={
        "cpu": Budget(
            name="cpu",
            description="what 2 CPU cores finish in under an hour",
            partitions=("dirichlet:0.1", "dirichlet:0.3", "dirichlet:0.5"),
            seeds=(0, 1, 2),
            # Fashion end to end, 2026-12-04 (fashion_pfedzkd_table2_cpu_1204.md): pFedZKD's
            # cells 307-503 s alone (846 beside a test run), the baselines' ~3 min loaded.
            estimate="about 80-90 min on 2 CPU cores with --jobs 2: pFedZKD's 9 cells of "
            "5-8 min, the baselines' 9 of 2-3 min",
            simulate={
                "classifier_epochs": 5,
                "search_options": {
                    "particles": 5,
                    "generations": 3,
                    "candidate_epochs": 1,
                    "fitness_samples": 1_000,
                    "max_macs": 500_000,
                },
            },
            fusion="cpu",
            # Sec. 3.3.3 predefines the global student "according to deployment requirements"
            # and names none; these devices are Pis. Against edgefl's 8,490-parameter `cnn`,
            # FedGH's CNN holds more of ten searched teachers: Fashion +1.94 +- 0.57 over nine
            # cells, MNIST +3.46 over nine (bench/results/fashion_pfedzkd_student.md).
            fuse_options={"pfedzkd": {"student": "fedgh-cnn5"}},
            reductions=(
                "PSO-FedNAS: 5 particles x 3 generations, once, 1 epoch a candidate on at most "
                "1,000 local samples, at most 500k MACs (paper: 20 x 10, 10 restarts, 10 epochs "
                "on the whole shard)",
                "the chosen model trains 5 local epochs (paper: 50)",
                "fusion at each method's cpu budget (pFedZKD: 200 inversion steps, 30 epochs)",
                "pFedZKD's global student: FedGH's CNN (`fedgh-cnn5`, 525k parameters; the "
                "paper predefines one and does not name it)",
            ),
        ),
        "paper": Budget(
            name="paper",
            description="the paper's own settings (Sec. 4.1.2): a GPU job",
            partitions=("dirichlet:0.1", "dirichlet:0.3", "dirichlet:0.5"),
            seeds=(0, 1, 2),
            estimate="hours a client on a CPU (the search); a GPU job with --train-device cuda",
            simulate={
                "classifier_epochs": 50,
                "search_options": {"particles": 20, "generations": 10, "candidate_epochs": 10},
            },
            fusion="paper",
            reductions=("PSO-FedNAS runs once per client (paper: 10 restarts, the best kept)",),
        ),
    },
    # Sec. 4.1.2 sets one training (and N_syn 4,000) for MNIST and Fashion-MNIST alike.
    datasets={"fmnist": {}},
    notes=(
        "The baselines' rows are pFedZKD's Table 2 (FedMHO's own table reports other numbers "
        "for them); FedProx (multi-round), FedMHO (CVAE clients), FedOM and FedLPA have no "
        "row here.",
        "ensemble (the searched teachers' logit average) has no paper number: it shows what "
        "Multi-ZSKD distils.",
    ),
)

TABLES.add(PFEDZKD_TABLE2.name, PFEDZKD_TABLE2)
