"""What one simulation is asked to do: `SimJob`, its defaults and its checks (every flag said
wrong before any client trains), and the --mix of device classes it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from device_profiles import OPTIMIZERS
from edgefl.bounds import OneOf, Range, check_fields, declare, declared
from edgefl.client.attacks import parse_attacks
from edgefl.client.privacy import SEARCH_UNDER_DP, check_request
from edgefl.data import load_dataset
from edgefl.data.locate import file_based, require
from edgefl.data.partition import check_for_data
from edgefl.data.public import DEFAULT_PUBLIC_SIZE
from edgefl.data.registry import DATASETS
from edgefl.errors import ConfigError
from edgefl.fusion import DEFAULT_METHODS, METHODS
from edgefl.outputs import check_writable
from edgefl.profiles import get_profile
from edgefl.search import METHODS as SEARCHES
from edgefl.search import PSOConfig
from edgefl.server.classes import EPOCHS as FOR_EPOCHS
from edgefl.server.classes import SAMPLES as FOR_SAMPLES
from edgefl.server.classes import ClassRequest, parse_request
from edgefl.server.plan import resolve_device
from edgefl.training import LR, SEED

# Budget-true classifiers are capped so a 10-client CPU simulation of every method stays within
# minutes (bench/ records the effect); the cap never lets a model exceed its device's budget.
DEFAULT_MAX_CLASSIFIER_MACS = 2_000_000
SEARCH = "search:"  # --client-model PROFILE=search:pso
# The ranges of simulate's own numbers: counts and batch sizes, and the local schedules.
COUNT = Range(1, integer=True)
POSITIVE = Range(0, low_open=True)


def _local(constraint: Range, example: str) -> Any:
    """A client schedule simulate may set for every client, unset: the default."""
    return declare(
        constraint, None, hint=f"e.g. {{flag}} {example}, or leave it out for the default"
    )


def _profiles(constraint: Range | OneOf, example: str) -> Any:
    """A training setting simulate may set for every client, unset: the profile's."""
    return declare(
        constraint, None, hint=f"e.g. {{flag}} {example}, or leave it out for the profile's"
    )


@declared()
@dataclass(frozen=True)
class SimJob:
    dataset: str = "mnist"
    clients: int = declare(COUNT, 10, hint="e.g. --clients 10")
    partition: str = "dirichlet:0.5"
    mix: str | None = None  # None: half smartphones, half wristbands (even_mix)
    methods: tuple[str, ...] = DEFAULT_METHODS
    seed: int = declare(SEED, 0, hint="e.g. --seed 0")
    out: str = "runs/sim"
    jobs: int = declare(COUNT, 1, hint="e.g. --jobs 2")
    device: str = "auto"  # fusion
    train_device: str = "cpu"  # client training: cpu (device-like) | cuda | auto
    paper_models: bool = False
    paper_classifier: str = "cnn"  # with --paper-models: cnn (small prototype) or vgg9
    max_classifier_macs: int | None = declare(COUNT, DEFAULT_MAX_CLASSIFIER_MACS, nullable=True)
    classifier_epochs: int | None = _local(POSITIVE, "10")  # default: the profile's
    generator_epochs: int | None = _local(POSITIVE, "10")
    # default: the client's for its optimizer
    classifier_lr: float | None = _local(LR, "1e-3")
    generator_lr: float | None = _local(LR, "1e-3")
    subset: int | None = declare(COUNT, None)  # use only this many training samples (quick runs)
    data_dir: str | None = None
    fuse_options: dict[str, dict[str, Any]] = field(default_factory=dict)  # method -> options
    # public split carved from train (default 5,000 if needed)
    public_size: int | None = declare(SEED, None)
    # The model every client of a device class trains, whatever the planner or --paper-models
    # would pick, and regardless of its budget: {"wristband": "cnn"} puts classifiers on the
    # wristbands (a paper's own client setting, e.g. FedMHO's Table 1 for its baselines).
    # "search:pso" instead of a model: each such client searches its own architecture under
    # its budget on its own data (pFedZKD's PSO-FedNAS), with `search_options`.
    client_models: dict[str, str] = field(default_factory=dict)
    search_options: dict[str, Any] = field(default_factory=dict)  # PSOConfig fields
    # Poisoned clients (edgefl.client.attacks): kind -> count; for each kind in order, the first
    # COUNT clients of a role it applies to. Recorded in the report, never in an upload.
    attacks: dict[str, int] = field(default_factory=dict)
    # sgd | sgd-momentum | adam (default: the profile's)
    classifier_optimizer: str | None = _profiles(OneOf(OPTIMIZERS), "adam")
    generator_optimizer: str | None = _profiles(OneOf(OPTIMIZERS), "adam")
    classifier_batch_size: int | None = _profiles(COUNT, "64")  # default: the profile's
    generator_batch_size: int | None = _profiles(COUNT, "64")
    # --for: every global model distilled into one model per device class (server fuse --for).
    for_classes: str | None = None
    for_epochs: int = FOR_EPOCHS  # checked by ClassRequest's declarations (classes())
    for_samples: int = FOR_SAMPLES
    for_max_macs: int | None = None
    # Every client's privacy (edgefl.client.privacy): --dp's text and --label-counts.
    dp: str | None = None
    label_counts: str = "exact"

    def __post_init__(self) -> None:
        check_fields(self)
        if self.mix is None:  # resolved here, so the run records the mix it trained
            object.__setattr__(self, "mix", even_mix(self.clients))

    def classes(self) -> ClassRequest | None:
        return parse_request(
            self.for_classes,
            epochs=self.for_epochs,
            samples=self.for_samples,
            max_macs=self.for_max_macs,
            eval_ref=f"{self.dataset}:test",
        )

    def validate(self) -> None:
        check_writable(self.out, "--out", "runs/sim", folder_ok=True)
        self.classes()  # an unknown profile or one no classifier fits: before any training
        for m in self.methods:
            METHODS.get(m)
        for m in self.fuse_options:
            METHODS.get(m)
        resolve_device(self.train_device, "--train-device")
        self._check_public()
        if self.dataset in DATASETS:  # classes:K past the classes, user without users
            info = DATASETS.get(self.dataset)
            check_for_data(self.partition, info.num_classes, info.users)
            if file_based(self.dataset):  # both splits' files, before a client trains
                require(self.dataset, self.data_dir)
                # and the test split read (a client reads train at once): a corrupt file was
                # said after every client trained and every method fused
                load_dataset(self.dataset, "test", data_dir=self.data_dir)
        profiles = set(parse_mix(self.mix, self.clients))
        if self.attacks:
            parse_attacks(",".join(f"{k}:{n}" for k, n in self.attacks.items()))
        self._check_searches()
        self._check_client_models(profiles)
        check_request(self.dp, self.label_counts)

    def _check_public(self) -> None:
        train = DATASETS.get(self.dataset).train_size if self.dataset in DATASETS else None
        if self.public and train is not None and self.public >= train:
            # Said now, not by every client worker once training starts.
            raise ConfigError(
                f"the public set ({self.public:,} samples) must be smaller than {self.dataset}'s "
                f"{train:,} training samples",
                hint=f"e.g. --public-size {max(1, train // 5)}",
            )

    def _check_searches(self) -> None:
        """--client-model PROFILE=search:NAME names a known search; --search-opt, one asked for."""
        searched = {p: m for p, m in self.client_models.items() if m.startswith(SEARCH)}
        for prof, model in searched.items():
            if model[len(SEARCH) :] not in SEARCHES:
                raise ConfigError(
                    f"--client-model {prof}={model}: unknown search",
                    hint=f"e.g. {prof}={SEARCH}{SEARCHES[0]}",
                )
            if self.dp is not None:
                raise ConfigError(
                    f"--client-model {prof}={model} with --dp: {SEARCH_UNDER_DP}",
                    hint="name a zoo model for that profile, or simulate without --dp",
                )
        if self.search_options:
            if not searched:
                raise ConfigError(
                    "--search-opt is given, but no --client-model PROFILE="
                    f"{SEARCH}{SEARCHES[0]} searches",
                    hint=f"e.g. --client-model wristband={SEARCH}{SEARCHES[0]}",
                )
            PSOConfig.from_options(self.search_options)  # an unknown or bad option: now

    def _check_client_models(self, profiles: set[str]) -> None:
        for prof in self.client_models:
            if prof not in profiles:
                raise ConfigError(
                    f"--client-model names {prof!r}, which no client of --mix {self.mix} is",
                    hint=f"name one of {', '.join(sorted(profiles))}, e.g. --client-model "
                    f"{sorted(profiles)[0]}=cnn",
                )

    @property
    def needs_predictions(self) -> bool:
        return any("predictions" in METHODS.get(m).consumes for m in self.methods)

    @property
    def needs_public(self) -> bool:
        return any(METHODS.get(m).public_data for m in self.methods)

    @property
    def public(self) -> int:
        """Samples carved out of train as the unlabeled public set (0 when no method uses it)."""
        if self.public_size is not None:
            return self.public_size
        return DEFAULT_PUBLIC_SIZE if self.needs_public else 0


def even_mix(clients: int) -> str:
    """simulate's default --mix: FedMHO's federation, half resource-sufficient smartphones and
    half wristbands (the odd one a smartphone), for any number of clients."""
    phones = (clients + 1) // 2
    parts = [("smartphone", phones), ("wristband", clients - phones)]
    return ",".join(f"{name}:{n}" for name, n in parts if n)


def parse_mix(mix: str, clients: int) -> list[str]:
    """'smartphone:5,wristband:5' -> a profile name per client, in order."""
    out: list[str] = []
    for part in filter(None, (p.strip() for p in mix.split(","))):
        name, _, count = part.rpartition(":")
        if not name or not count.isdigit():
            raise ConfigError(
                f"--mix expects PROFILE:COUNT,..., got {part!r}",
                hint="e.g. --mix smartphone:5,wristband:5",
            )
        get_profile(name)
        out += [name] * int(count)
    if len(out) != clients:
        raise ConfigError(
            f"--mix assigns {len(out)} clients but --clients is {clients}",
            hint=f"make the counts in --mix add up to --clients, e.g. --mix {even_mix(clients)}"
            " (or leave --mix out: half smartphones, half wristbands)",
        )
    return out
