"""The fusion method contract: what every method declares (`Method`, its registry entry: the
pipeline, `simulate` and the CLI read its fields instead of method names), what it returns
(`FusionResult`), the context it runs in (`FusionContext`), the named budgets and the published
accuracies printed beside ours (`Reference`). Its config base lives in edgefl.fusion.config.

A method is one file with a frozen config dataclass (its defaults, each field declared
with `option(...)`; the paper's values where 2 cores can afford them, else a named `paper`
budget, and a `code` budget where the authors' public code runs otherwise than the paper
says) and a `fuse(ctx, cfg)` function, plus one line in `edgefl/fusion/__init__.py`;
the pipeline around it (ingest, rebuild, export, report) lives in edgefl.server.fuse.

The pieces several methods reuse live beside it, one module per job: parameter and logit
averaging (`averaging`), synthetic samples from decoders (`samples`), model inversion
(`inversion`), training a student (`student`), the cap on teachers (`caps`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import exporters
from edgefl.artifacts import Upload
from edgefl.errors import ConfigError, FusionError
from edgefl.fusion.caps import GROWS, generator_estimate, scale_options, too_many, upload_cap
from edgefl.fusion.config import FusionConfig, PublicSetConfig
from edgefl.fusion.options import (
    UnknownOptionError,
    describe_options,
    effective,
    refuse_on_every_input,
)
from edgefl.models.parse import parse_model_arg
from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import build_model, input_kind
from edgefl.progress import no_progress

# What a client may upload and a method consume: every artifact kind but the server's own.
UPLOAD_KINDS = tuple(k for k in exporters.ARTIFACT_KINDS if k != "global")
JUDGED = ("global", "per-client")
# Named option sets (`--budget`): "cpu" is every method's defaults, what 2 CPU cores finish in
# minutes; "paper" is the paper's own setting, where it differs (a GPU job for some methods);
# "code" is what the authors' public code runs: the paper's setting with the code's known
# divergences from the text laid over it (a method with none runs its paper budget).
BUDGETS = ("cpu", "paper", "code")
BUDGETS_HELP = (
    "cpu: what 2 cores finish in minutes (the defaults); paper: each paper's own "
    "setting; code: each method as its authors' public code runs it (the paper's "
    "setting where no divergence is known)"
)


def check_budget(budget: str) -> None:
    if budget not in BUDGETS:
        raise ConfigError(
            f"--budget must be one of {', '.join(BUDGETS)}, got {budget!r}", hint=BUDGETS_HELP
        )


@dataclass(frozen=True)
class FusionResult:
    model: nn.Module  # input -> logits, exportable
    spec: ModelSpec | None  # None when the global model is not one zoo architecture (ensemble)
    info: dict[str, Any] = field(default_factory=dict)  # method-specific report entries
    # The exported graph's input when it is not the task's image (FedGH's header takes a
    # representation): per-sample shape and name. None = the task's input_shape, "input".
    input_shape: tuple[int, ...] | None = None
    input_name: str | None = None
    # The inputs the global model was trained on (a decoder's or generator's samples, the public
    # set), when the method has them: the pipeline distils per-device-class students on them
    # (`server fuse --for`). None: the pipeline inverts the global model instead.
    samples: torch.Tensor | None = None
    # What the global model stands for when a method left some of its uploads out (FedAvg
    # averaging one architecture of two): "5 of 10: vgg9 only". None: everything it consumes.
    scope: str | None = None


@dataclass(frozen=True)
class Reference:
    """A published accuracy to print beside ours, for one setting."""

    dataset: str
    clients: int
    partition: str  # as edgefl spells it: dirichlet:0.5
    accuracy: float  # top-1 %
    source: str  # paper and table


@dataclass(frozen=True)
class Method:
    """A fusion method's contract. Everything outside its file reads these fields; if a new
    method needs an edit elsewhere, a field is missing here."""

    name: str
    description: str
    paper: str
    consumes: tuple[str, ...]  # artifact kinds: classifier, decoder, predictions, prototypes
    # Its uploads must be rebuilt torch modules (weights to average, gradients to take); an
    # upload only onnxruntime can run is left out of it, with the reason.
    needs_modules: bool
    config_cls: type[FusionConfig]
    fuse: Callable[[FusionContext, Any], FusionResult]
    # How it is judged: "global" = its one global model on the test split; "per-client" = each
    # client applies the global output to its own model (`personalize`) and is tested locally.
    judged: str = "global"
    # Per-client: what its output is, the name of the device's applier (`APPLIERS` in
    # client/weightless.py; a contract test checks every method names one).
    personalize: str | None = None
    references: tuple[Reference, ...] = ()
    # Extra outputs beside the global model (a picture): (result, global model path) -> report
    # entries naming the files written.
    outputs: Callable[[FusionResult, Path], dict[str, Any]] | None = None
    # Option overrides per named budget other than "cpu" (the defaults), e.g. {"paper": {...}}.
    # "code" holds only where the authors' public code departs from the paper's text: it is
    # laid over "paper" (`budget_options`), so a method whose code follows its paper has none.
    budgets: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Where the authors' public code differs from the paper's text, in words, each saying
    # whether `--budget code` follows it (printed by `server methods NAME`).
    divergences: tuple[str, ...] = ()
    # A method whose config has the option max_teachers caps its classifier uploads there (its
    # cost grows with each); this says what grows, in the refusal `server fuse` gives before it
    # ingests a folder declaring more (`over_cap`) as in the one after (`FusionContext.require`).
    teacher_cost: str = ""
    # About how many samples its training passes through a network, from its config: methods
    # fused side by side start largest first, so that a long one does not start last. None:
    # epochs x rounds x synthetic, where its config has them.
    work: Callable[[Any], float] | None = None
    # False: fusing trains no network (an average or a wrapper of the uploads: seconds). Methods
    # fused side by side share the cores among those that train, so a long one beside an
    # average keeps them all (pFedZKD beside the ensemble ran on one of two cores, 1.9x longer).
    trains: bool = True

    def __post_init__(self) -> None:
        if set(self.budgets) - set(BUDGETS[1:]):
            raise ValueError(f"{self.name}: budgets must be among {BUDGETS[1:]}")
        if not self.consumes or set(self.consumes) - set(UPLOAD_KINDS):
            raise ValueError(f"{self.name}: consumes must be a subset of {UPLOAD_KINDS}")
        if self.judged not in JUDGED:
            raise ValueError(f"{self.name}: judged must be one of {JUDGED}")
        if (self.judged == "per-client") != (self.personalize is not None):
            raise ValueError(f"{self.name}: a per-client method says how it personalizes")

    @property
    def options(self) -> list[dict[str, Any]]:
        return describe_options(self.config_cls)

    @property
    def public_data(self) -> bool:
        """Reads the shared unlabeled public set: its config derives from PublicSetConfig,
        whose options a simulation fills with the slice it carved for its clients."""
        return issubclass(self.config_cls, PublicSetConfig)

    def option_names(self) -> set[str]:
        return {f.name for f in fields(self.config_cls)}

    def make_config(self, overrides: dict[str, Any]) -> FusionConfig:
        names = self.option_names()
        bad = set(overrides) - names
        if bad:
            raise UnknownOptionError(self.name, bad, names)
        cfg = replace(self.config_cls(), **overrides)
        refuse_on_every_input(cfg)
        return cfg

    def effective_config(
        self, overrides: dict[str, Any], input_shape, dataset: str | None = None
    ) -> FusionConfig:
        """The config this method runs with on inputs of `input_shape` from `dataset`:
        `overrides` over its defaults, each option that defaults by data set for this input
        and dataset (`options.effective`)."""
        return effective(self.make_config(overrides), input_shape, dataset)

    def teacher_cap(self, cfg: FusionConfig) -> int:
        """The most classifier uploads `cfg` lets this method take (its option max_teachers),
        0 for no cap."""
        return upload_cap(cfg) if "classifier" in self.consumes else 0

    def over_cap(
        self, cfg: FusionConfig, classifiers: int, flag: str = "--opt"
    ) -> FusionError | None:
        """The refusal of `classifiers` classifier uploads when they are more than its cap
        (`flag`: the command's option flag the fix names)."""
        cap = self.teacher_cap(cfg)
        if not cap or classifiers <= cap:
            return None
        cost = (self.teacher_cost or GROWS) + generator_estimate(cfg, classifiers)
        return too_many(self.name, "classifier", classifiers, cap, cost, flag, scale_options(cfg))

    def budget_options(self, budget: str) -> dict[str, Any]:
        """The option overrides of a named budget ({} where the defaults already are it);
        "code" is "paper" with the code's own overrides over it."""
        check_budget(budget)
        if budget == "code":
            return self.budgets.get("paper", {}) | self.budgets.get("code", {})
        return dict(self.budgets.get(budget, {}))

    def reference(
        self, dataset: str, partition: str, clients: int, source: str | None = None
    ) -> Reference | None:
        """The first reference for this setting (from `source` only, when given: two papers
        may report the same method in the same setting with different numbers)."""
        for ref in self.references:
            same = (ref.dataset, ref.partition, ref.clients) == (
                dataset,
                _canon(partition),
                clients,
            )
            if same and source in (None, ref.source):
                return ref
        return None


def _canon(partition: str) -> str:
    """dirichlet:0.50 and dirichlet:.5 are the paper's dirichlet:0.5."""
    scheme, _, arg = partition.partition(":")
    try:
        return f"{scheme}:{float(arg):g}" if arg else scheme
    except ValueError:
        return partition


def pfedzkd_table2(
    accuracies: tuple[float, float, float], dataset: str = "mnist"
) -> tuple[Reference, ...]:
    """A row of the pFedZKD paper's Table 2 (10 clients, top-1 %) on `dataset` (mnist, fmnist):
    Dir(0.1), Dir(0.3), Dir(0.5). Later in a method's references than FedMHO's table, which
    simulate prints."""
    return tuple(
        Reference(dataset, 10, f"dirichlet:{alpha:g}", acc, PFEDZKD_TABLE2)
        for alpha, acc in zip((0.1, 0.3, 0.5), accuracies, strict=True)
    )


PFEDZKD_TABLE2 = "pFedZKD paper, Table 2"


def fedmho_table3(
    accuracies: tuple[float, float, float], dataset: str = "mnist"
) -> tuple[Reference, ...]:
    """A row of the FedMHO paper's Table 3 (10 clients, top-1 %) on `dataset` (mnist, fmnist):
    Dir(0.5), Dir(0.3), Dir(0.1). Most one-shot baselines here are compared in that table."""
    return tuple(
        Reference(dataset, 10, f"dirichlet:{alpha:g}", acc, "FedMHO paper, Table 3")
        for alpha, acc in zip((0.5, 0.3, 0.1), accuracies, strict=True)
    )


def fedhydra_table1(
    accuracies: tuple[float, float, float, float], dataset: str = "mnist"
) -> tuple[Reference, ...]:
    """A row of the FedHydra paper's Table 1 (5 clients, top-1 %) on `dataset` (mnist, fmnist):
    alpha 0.5, 0.3, 0.1, 0.01."""
    return tuple(
        Reference(dataset, 5, f"dirichlet:{alpha:g}", acc, "FedHydra paper, Table 1")
        for alpha, acc in zip((0.5, 0.3, 0.1, 0.01), accuracies, strict=True)
    )


def client_label_counts(uploads, num_classes: int) -> np.ndarray:
    """(K, C) float: each upload's declared label counts. An upload that withholds them
    (`--label-counts absent`, issue 57) is read as holding every class alike, as many samples
    as the declaring uploads hold on average (one per class if none declares): nothing it says
    favours a class, and it weighs as much as a typical client."""
    rows = [u.label_counts for u in uploads]
    declared = [r for r in rows if len(r) == num_classes]
    size = float(np.mean([r.sum() for r in declared])) if declared else float(num_classes)
    even = np.full(num_classes, size / num_classes)
    return np.stack([r if len(r) == num_classes else even for r in rows]).astype(np.float64)


def federation_label_counts(uploads, num_classes: int) -> np.ndarray:
    """Per-class sample counts summed over the uploads (those that withhold them: as
    `client_label_counts` reads them), rounded."""
    if not len(uploads):
        return np.zeros(num_classes, dtype=np.int64)
    return np.rint(client_label_counts(uploads, num_classes).sum(0)).astype(np.int64)


class FusionContext:
    """Everything a method may use: the accepted uploads by kind, the task, the device, a seeded
    generator, a stage timer and a report dict for method-specific entries. `label_counts` is
    the federation's: summed over `federation`, every accepted upload whether the method uses it
    or not (default: `uploads`)."""

    def __init__(
        self,
        uploads: list[Upload],
        *,
        device: torch.device,
        seed: int,
        log=None,
        federation: list[Upload] | None = None,
        progress=None,
        method: str = "",
    ):
        self.uploads = uploads
        self.method = method  # its registry name ("" where a caller gave none)
        first = uploads[0].meta
        self.input_shape = tuple(first["input_shape"])
        self.num_classes = int(first["num_classes"])
        self.label_counts = federation_label_counts(federation or uploads, self.num_classes)
        self.class_names = list(first.get("class_names") or range(self.num_classes))
        self.device = device
        self.seed = seed
        self.stages: dict[str, float] = {}
        self.log = log or (lambda msg: None)
        # progress(task, done, total, note=""): epochs, generator steps (edgefl.progress).
        self.progress = progress or no_progress
        # Uploads the method went without, and those it used only in part, each with the reason
        # (`set_aside`): the report names them beside the pipeline's own set-aside uploads.
        self.aside: list[tuple[Upload, str]] = []
        self.partly: list[tuple[Upload, str]] = []

    @property
    def classifiers(self) -> list[Upload]:
        return [u for u in self.uploads if u.kind == "classifier"]

    @property
    def decoders(self) -> list[Upload]:
        return [u for u in self.uploads if u.kind == "decoder"]

    def set_aside(self, left: list[tuple[Upload, str]], used_for: str | None = None) -> None:
        """Record uploads the method leaves out, each with the reason (logged and reported by
        name); `used_for`: they still serve the method in that role (teachers), only not in
        the part the reason names."""
        for u, why in left:
            (self.aside if used_for is None else self.partly).append(
                (u, why if used_for is None else f"{why}; still used as {used_for}")
            )
            self.log(
                f"set aside {u.name}: {why}" + (f" (still used as {used_for})" if used_for else "")
            )

    def stage(self, name: str) -> contextlib.AbstractContextManager[None]:
        return exporters.timed(self.stages, name)

    @property
    def who(self) -> str:
        """The method as messages name it."""
        return self.method or "this method"

    def require(
        self, kind: str, at_least: int = 1, at_most: int = 0, cost: str = "", scale=()
    ) -> list[Upload]:
        """The uploads of `kind`; refused when fewer than `at_least`, or more than `at_most`
        (0: no cap) for a method whose `cost` grows with each (its option max_teachers)."""
        found = [u for u in self.uploads if u.kind == kind]
        if len(found) < at_least:
            raise FusionError(
                f"{self.who} needs at least {at_least} {kind} upload(s), got {len(found)}",
                hint="`edgefl server methods` lists which artifact kinds each method consumes",
            )
        if at_most and len(found) > at_most:
            raise too_many(self.method, kind, len(found), at_most, cost or GROWS, scale=scale)
        return found

    def student(self, text: str, images: str = "cnn") -> tuple[ModelSpec, nn.Module]:
        """A fresh zoo classifier for the task, seeded (`--student NAME[:key=value,...]`).
        "auto" is the method's model for images (`images`) or, on windows of sensor data, the
        1-D CNN: one default that is right for either kind of input."""
        if text == "auto":
            text = images if input_kind(self.input_shape) == "image" else "cnn1d"
        spec = parse_model_arg(text, self.input_shape, self.num_classes)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            model = build_model(spec)
        if not isinstance(getattr(model, "head", None), nn.Linear):
            raise ConfigError(
                f"--student {text!r} is not a classifier",
                hint="name a classifier of the zoo, e.g. --student cnn (`edgefl models` lists them)",
            )
        return spec, model.to(self.device)
