"""A device's job: what one client trains and uploads (`ClientJob`), the settings a simulation
adds around it that a real device never has (`SimSettings`), and what follows from the job and
the model before any data is read: the jitter it trains under, how its sensor windows are
presented, its local epochs and learning rate. Below client.run, which runs a job, and
client.rerun, which compares an existing upload with one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from device_profiles import OPTIMIZERS
from edgefl.bounds import OneOf, Range, check_fields, declare, declared
from edgefl.errors import ConfigError
from edgefl.models.augment import resolve as resolve_augment
from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import input_kind
from edgefl.privacy.config import DP_LR, DP_OPTIMIZER, DPConfig, optimizer_for
from edgefl.profiles import Profile
from edgefl.training import DEFAULT_LR, LR, SEED


@dataclass(frozen=True)
class SimSettings:
    """What a simulation (simulate, reproduce, the Flower engine, the benches) sets for a client
    and a device never does; the defaults are a real device's."""

    train_device: str = "cpu"  # cpu | cuda: a simulation's GPU (a device trains on its CPU)
    # A poisoned client (edgefl.client.attacks): for robustness runs; None = honest.
    attack: str | None = None
    # Seed of the label counts' noise; None: the system's entropy. A device must not use a
    # seed it records (anyone could replay the noise); a simulation may, to be reproducible.
    noise_seed: int | None = None


# What may leave the device; the planner's roles.
KINDS = ("model", "predictions", "prototypes")
ROLES = ("auto", "classifier", "generator")
COUNT = Range(1, integer=True)


@declared(profile="wristband")
@dataclass(frozen=True)
class ClientJob:
    profile: str
    dataset: str = "mnist"
    out_dir: str = "uploads"
    data_dir: str | None = None
    partition: str = "dirichlet:0.5"
    num_clients: int = declare(COUNT, 10)
    client_index: int = declare(SEED, 0, hint="pick an index below --num-clients")
    partition_seed: int = declare(SEED, 0)
    # samples held out of the train split as the public set (before partition)
    public_size: int = declare(SEED, 0)
    subset: int | None = declare(COUNT, None)  # a seeded subset of this many samples (quick runs)
    model: str | None = None  # NAME or NAME:key=value,... ; None = the planner's choice
    spec_file: str | None = None  # a spec JSON (`edgefl search --save`), instead of `model`
    role: str = declare(OneOf(ROLES), "auto")
    max_macs: int | None = declare(COUNT, None)  # cap for the planner (fast CPU simulations)
    epochs: int | None = declare(COUNT, None)  # None: the profile's
    batch_size: int | None = declare(COUNT, None)
    lr: float | None = declare(LR, None, hint="e.g. --lr 1e-3, or leave it out for the profile's")
    optimizer: str | None = declare(OneOf(OPTIMIZERS), None)  # None = the profile's
    seed: int = declare(SEED, 0, hint="e.g. --seed 0")
    fed_seed: int = declare(SEED, 0, hint="e.g. --fed-seed 0")
    quantize: str | None = declare(OneOf(("int8",)), None)
    force: bool = False
    client_id: str | None = None
    search: str | None = None  # "pso": search an architecture under the budget (pFedZKD)
    search_options: dict[str, Any] | None = None
    # What leaves the device: "model" (the weights), "predictions" (softmax outputs on the
    # `public` set, FedOL) or "prototypes" (per-class mean representations, FedGH).
    kind: str = declare(OneOf(KINDS), "model", flag="client artifact kind")
    public: str | None = None  # predictions: NAME:public (carved with public_size) or a .npz
    fp16: bool = False  # predictions stored as float16 (half the upload)
    keep_model: str | None = None  # predictions/prototypes: directory for the device's own model
    # Train-time jitter: None = rotate for classifiers of sensor windows (each user wears the
    # device at its own angle: edgefl.models.augment), else none; or none | rotate | affine.
    augment: str | None = None
    # Replace an upload (or kept model) at the output path that another command made; without
    # it such a run stops before training (edgefl.client.rerun). A rerun of the same command
    # replaces its own upload either way.
    overwrite: bool = False
    # Differential privacy (edgefl.client.privacy): DP-SGD's request as `--dp` writes it
    # (EPSILON[,delta=D][,clip=C][,batch=B]; None: plain training), and how the label counts are
    # released: exact | absent | noised | noised:EPSILON.
    dp: str | None = None
    label_counts: str = "exact"
    sim: SimSettings = SimSettings()  # a simulation's own settings; the default: a device's

    def __post_init__(self) -> None:
        check_fields(self)
        check_client_id(self.client_id)
        if self.search and (self.model or self.spec_file):  # the search picks the model
            flag = "--model" if self.model else "--spec"
            raise ConfigError(
                f"--search {self.search} with {flag}: the search chooses the architecture, "
                f"so {flag} would not be trained",
                hint=f"drop {flag} to search one, or drop --search to train {flag}'s",
            )
        if self.search and self.role == "generator":
            raise ConfigError(
                "--search with --role generator: the search finds classifiers",
                hint="drop --role (or --role classifier), or drop --search",
            )


def check_client_id(client_id: str | None) -> None:
    """The id names the upload file `<id>.onnx` in --out: one plain name, never a path."""
    if client_id is None:
        return
    # A control character would be a file name and a report field that edgefl escapes, but
    # other tools (ls, a shell, a spreadsheet) would not.
    odd = any(c in client_id for c in "/\\") or not client_id.isprintable()
    if not client_id.strip() or client_id in (".", "..") or odd:
        raise ConfigError(
            f"--client-id {client_id!r}: the upload is written as <client-id>.onnx inside "
            "--out, so the id must be one plain name (not empty, no / or \\, no control "
            "characters, not . or ..)",
            hint="e.g. --client-id band-07, or leave it out for client-<index>",
        )


def _default_augment(spec: ModelSpec, role: str) -> str:
    """A classifier of sensor windows learns each user's own wearing angle unless its windows
    are turned (edgefl.models.augment: 54 % -> 71 % on other users, UCI HAPT). A CVAE is not:
    its 2-D latent then spends itself on the angle, and FedCVAE trained on its samples lost 3-5
    points (bench/results/hapt.md). Images: none, as every recorded MNIST result."""
    return "rotate" if role == "classifier" and input_kind(spec.input_shape) == "signal" else "none"


def job_augment(job: ClientJob, spec: ModelSpec, role: str) -> str:
    """The jitter a job trains under: its --augment (checked against the input kind), else the
    default for the model and role. An upload records it; a rerun compares it (client.rerun)."""
    return (
        resolve_augment(job.augment, spec.input_shape)
        if job.augment
        else _default_augment(spec, role)
    )


def window_treatment(spec: ModelSpec, role: str) -> str | None:
    """How a client's sensor windows are presented to its model: "aligned" (edgefl.data.align)
    for a CVAE on windows, else as recorded (None)."""
    return "aligned" if role == "generator" and input_kind(spec.input_shape) == "signal" else None


def job_optimizer(job: ClientJob, profile: Profile) -> str:
    """The job's optimizer, else DP-SGD's under --dp (edgefl.privacy.config), else the
    profile's."""
    return optimizer_for(job.optimizer, profile.optimizer, job.dp is not None)


def local_schedule(job: ClientJob, profile: Profile, role: str, samples: int) -> tuple[int, float]:
    """(epochs, lr) a client trains with on `samples` training samples: the job's, else its
    profile's for that much data (Profile.local_epochs: its min_steps counted in the steps the
    client takes, DP-SGD's Poisson batches under --dp) and the role's default rate (DP-SGD's
    for its optimizer under --dp)."""
    optimizer = job_optimizer(job, profile)
    batch = job.batch_size or profile.batch_size
    if job.dp is not None:  # a DP-SGD step is one Poisson batch, of its expected size
        batch = DPConfig.parse(job.dp).expected_batch(batch, samples)
    epochs = job.epochs or profile.local_epochs(samples, batch)
    dp_default = job.dp is not None and optimizer == DP_OPTIMIZER
    return epochs, job.lr or (DP_LR if dp_default else DEFAULT_LR[(role, optimizer)])
