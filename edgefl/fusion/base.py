"""What every fusion method shares: its registry entry (the contract the pipeline, `simulate`
and the CLI read instead of method names), its config base (edgefl.fusion.config, imported
here), the context it runs in, and the pieces several methods reuse (parameter averaging,
sampling decoders, the class-mean filter, training a student on synthetic data with optional
distillation).

A method is one file with a frozen config dataclass (its defaults, each field declared
with `option(...)`; the paper's values where 2 cores can afford them, else a named `paper`
budget, and a `code` budget where the authors' public code runs otherwise than the paper
says) and a `fuse(ctx, cfg)` function, plus one line in `edgefl/fusion/__init__.py`;
the pipeline around it (ingest, rebuild, export, report) lives in edgefl.server.fuse.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

import exporters
from edgefl.artifacts import Upload
from edgefl.errors import ConfigError, FusionError
from edgefl.fusion.config import FusionConfig, PublicSetConfig
from edgefl.fusion.options import describe_options, effective, flag
from edgefl.models.augment import CHOICES as AUGMENT_CHOICES
from edgefl.models.augment import affine_jitter, jitter  # noqa: F401 (affine_jitter: re-exported)
from edgefl.models.parse import parse_model_arg
from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import build_model, input_kind, spec_label
from edgefl.progress import no_progress

# What a client may upload and a method consume: every artifact kind but the server's own.
UPLOAD_KINDS = tuple(k for k in exporters.ARTIFACT_KINDS if k != "global")
JUDGED = ("global", "per-client")
INVERSION_CHUNK = 256  # images optimised together; each image's loss is its own (sum, not mean)
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
        bad = sorted(set(overrides) - names)
        if bad:
            raise ConfigError(
                f"method {self.name!r} has no option(s) {', '.join('--' + flag(b) for b in bad)}",
                hint=f"its options: {', '.join('--' + flag(n) for n in sorted(names))} "
                f"(`edgefl server methods {self.name}` explains each)",
            )
        return replace(self.config_cls(), **overrides)

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
        cap = getattr(cfg, "max_teachers", 0) if "classifier" in self.consumes else 0
        return cap if isinstance(cap, int) and cap > 0 else 0

    def over_cap(
        self, cfg: FusionConfig, classifiers: int, flag: str = "--opt"
    ) -> FusionError | None:
        """The refusal of `classifiers` classifier uploads when they are more than its cap
        (`flag`: the command's option flag the fix names)."""
        cap = self.teacher_cap(cfg)
        if not cap or classifiers <= cap:
            return None
        cost = self.teacher_cost or GROWS
        return too_many(self.name, "classifier", classifiers, cap, cost, flag)

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
        self, kind: str, at_least: int = 1, at_most: int = 0, cost: str = ""
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
            raise too_many(self.method, kind, len(found), at_most, cost or GROWS)
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
            raise ConfigError(f"--student {text!r} is not a classifier")
        return spec, model.to(self.device)


# --- teachers -------------------------------------------------------------------------------


def invert(
    teacher: nn.Module,
    targets: torch.Tensor,
    input_shape,
    *,
    steps: int,
    lr: float,
    tau: float,
    gen: torch.Generator,
    device: torch.device,
    init_std: float = 1.0,
    smooth: float = 0.0,
) -> torch.Tensor:
    """Pseudo-images x with softmax(teacher(x) / tau) ~ targets: Adam on v, x = sigmoid(v),
    v ~ N(0, init_std^2 I). Only v gets gradients: the teacher's parameters are never touched.
    `smooth` weighs a prior that real inputs satisfy and the teacher's loss does not ask for:
    the squared differences of neighbouring samples along every spatial axis (`roughness`).

    Adam moves every coordinate of v by about `lr` per step whatever its gradient, so what the
    teacher ignores drifts as far as what it reads, and the start's noise stays: x carries
    noise of the size of init_std and lr * steps. Pixels saturate at 0 or 1 anyway; a sensor
    window's information is a small deviation around its range's centre, which that noise
    drowns (`inversion_defaults`)."""
    teacher = teacher.to(device).eval()
    out = []
    for chunk in targets.split(INVERSION_CHUNK):
        y = chunk.to(device)
        v = init_std * torch.randn(len(y), *input_shape, generator=gen)
        v = v.to(device).requires_grad_(True)
        opt = torch.optim.Adam([v], lr=lr)
        for _ in range(steps):
            x = torch.sigmoid(v)
            logp = F.log_softmax(teacher(x) / tau, dim=1)
            loss = -(y * logp).sum()  # soft-target cross-entropy, summed: images are independent
            if smooth:
                loss = loss + smooth * roughness(x).sum()
            (v.grad,) = torch.autograd.grad(loss, [v])
            opt.step()
        out.append(torch.sigmoid(v).detach().cpu())
    return torch.cat(out) if out else torch.zeros(0, *input_shape)


def roughness(x: torch.Tensor) -> torch.Tensor:
    """Per sample, the sum of squared differences between neighbouring values along every spatial
    axis (dims 2 and up; an axis of size 1, like a window's (C, 1, L) middle one, adds nothing):
    a window's steps in time, an image's in both directions."""
    total = torch.zeros(len(x), dtype=x.dtype, device=x.device)
    for dim in range(2, x.dim()):
        if x.shape[dim] > 1:
            total = total + x.diff(dim=dim).pow(2).flatten(1).sum(1)
    return total


def one_architecture(
    classifiers: list[Upload], method: str
) -> tuple[list[Upload], list[tuple[Upload, str]]]:
    """(the classifiers a parameter average can take, (upload, why not) for the others).

    Parameters average only within one architecture, so the largest group of classifiers of
    one architecture is averaged (ties: the group holding the most training samples, then the
    one whose first upload comes first); every other classifier is set aside with its reason,
    as is one that cannot be rebuilt (int8, another tool's). Only when none is left to average
    is the method refused, every classifier named with its reason."""
    left: list[tuple[Upload, str]] = []
    groups: dict[str, list[Upload]] = {}
    for u in classifiers:
        if not u.rebuilt or u.spec is None:
            why = u.forward_only or "its metadata names no edgefl architecture"
            left.append(
                (u, f"{method} averages parameters, which needs a rebuilt edgefl classifier: {why}")
            )
        else:
            groups.setdefault(u.spec.to_json(), []).append(u)
    if not groups:
        raise FusionError(
            f"{method} averages parameters, which needs rebuildable edgefl classifiers; none "
            f"of the {len(classifiers)} is one:"
            + "".join(f"\n  {u.name}: {why}" for u, why in left),
            hint="add classifiers trained by `edgefl client train` (not --int8), or choose a "
            "method that only needs forward passes (fedmho-md, feddf)",
        )
    # max keeps the first of equals: groups are in the order of their first upload.
    kept = max(groups.values(), key=lambda g: (len(g), sum(int(u.label_counts.sum()) for u in g)))
    label = spec_label(kept[0].spec)
    for group in groups.values():
        if group is kept:
            continue
        other = spec_label(group[0].spec)
        arch = f"architecture {other}" if other != label else f"another {label} configuration"
        why = (
            f"{arch} differs from the {len(kept)} {label} classifier(s) {method} averages "
            f"(the largest group of one architecture; parameters of different "
            f"architectures cannot be averaged)"
        )
        left += [(u, why) for u in group]
    order = {id(u): i for i, u in enumerate(classifiers)}
    return kept, sorted(left, key=lambda item: order[id(item[0])])


def average_scope(kept: list[Upload], classifiers: list[Upload]) -> str | None:
    """What an average stands for when it is not every classifier: "5 of 10: vgg9 only"."""
    if len(kept) == len(classifiers):
        return None
    return f"{len(kept)} of {len(classifiers)}: {spec_label(kept[0].spec)} only"


def average_classifiers(classifiers: list[Upload], method: str) -> tuple[ModelSpec, nn.Module]:
    """One-shot FedAvg: the plain parameter average of same-architecture classifiers (pick
    them with `one_architecture`; given others, it refuses)."""
    kept, left = one_architecture(classifiers, method)
    if left:
        raise FusionError(
            f"{method} averages one architecture; set these aside first:"
            + "".join(f"\n  {u.name}: {why}" for u, why in left),
            hint="use a distillation method (ensemble, fedmho-md) for mixed architectures",
        )
    spec = kept[0].spec
    # A running sum, one upload's weights at a time: parked uploads are never all in memory.
    # In float64, so the order of the additions does not show in the float32 average.
    total: dict[str, torch.Tensor] = {}
    for u in kept:
        _add_weights(total, u.module)
    model = build_model(spec)
    dtypes = {k: v.dtype for k, v in model.state_dict().items()}
    model.load_state_dict({k: (v / len(kept)).to(dtypes[k]) for k, v in total.items()})
    return spec, model


def _add_weights(total: dict[str, torch.Tensor], module: nn.Module) -> None:
    # Its own frame: no loop variable keeps a tensor (and the file it maps) past the call.
    for k, v in module.state_dict().items():
        total[k] = total[k] + v.double() if k in total else v.double()


# --- synthetic data from decoders -----------------------------------------------------------


def largest_remainder(total: int, weights: np.ndarray) -> np.ndarray:
    """Integers proportional to `weights` that sum to `total` exactly."""
    weights = np.asarray(weights, dtype=np.float64)
    if weights.sum() <= 0:
        weights = np.ones_like(weights)
    raw = total * weights / weights.sum()
    out = np.floor(raw).astype(np.int64)
    order = np.argsort(-(raw - out), kind="stable")
    out[order[: total - out.sum()]] += 1
    return out


def allocate(decoders, class_weights, total: int, power: float = 1.0) -> np.ndarray:
    """(decoders x classes) sample counts: `total` split over the classes by `class_weights`,
    each class's share split among the decoders by their label counts ** `power` (evenly where
    no decoder holds the class)."""
    class_weights = np.asarray(class_weights, dtype=np.float64)
    counts = client_label_counts(decoders, len(class_weights))  # K x C
    per_class = largest_remainder(total, class_weights)
    alloc = np.zeros_like(counts, dtype=np.int64)
    for c in range(len(class_weights)):
        alloc[:, c] = largest_remainder(int(per_class[c]), counts[:, c] ** power)
    return alloc


def generate(decoders, alloc: np.ndarray, seed: int, device, pixels: str = "mean"):
    """The synthetic set `alloc` (from `allocate`) asks for: images and labels, decoder by decoder."""
    gen = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for u, row in zip(decoders, alloc, strict=True):
        labels = np.repeat(np.arange(len(row)), row)
        xs.append(decode(u, labels, gen, device, pixels=pixels))
        ys.append(torch.from_numpy(labels).long())
    return torch.cat(xs), torch.cat(ys)


def class_totals(ctx: FusionContext, decoders, labels: str) -> np.ndarray:
    """How many samples each class gets (in proportion). A class no decoder holds gets none: a
    decoder conditioned on a label it never saw draws its own classes, labelled wrongly."""
    held = federation_label_counts(decoders, ctx.num_classes).astype(np.float64)
    if labels == "decoders":
        return held
    return ctx.label_counts.astype(np.float64) * (held > 0)


LABELS = ("federation", "decoders")
LABELS_HELP = (
    "class totals of the synthetic set: federation (every upload's label counts) or "
    "decoders (only the CVAE clients', FedCVAE's rule)"
)

PIXELS = ("auto", "bernoulli", "mean")
PIXELS_HELP = (
    "synthetic pixels: bernoulli draws from the decoder's outputs (a sample of the "
    "CVAE's Bernoulli likelihood), the outputs themselves (mean), or auto: bernoulli "
    "on images, mean on sensor windows (an acceleration is no coin flip)"
)


def decode(
    upload: Upload,
    labels: np.ndarray,
    gen: torch.Generator,
    device,
    batch: int = 1024,
    pixels: str = "mean",
):
    """Images from one decoder for the given labels, z ~ N(0, I). The CVAEs are trained with a
    per-pixel BCE, i.e. a Bernoulli likelihood whose parameters the decoder outputs: "bernoulli"
    draws each pixel from it (a sample of the model), "mean" returns the outputs themselves,
    blurred averages that no real digit looks like."""
    c = upload.meta["num_classes"]
    out = []
    module = upload.module  # once: a parked upload's is read from disk at each access
    for i in range(0, len(labels), batch):
        lab = torch.from_numpy(labels[i : i + batch]).long()
        z = torch.randn(len(lab), upload.latent_dim, generator=gen)
        onehot = F.one_hot(lab, c).float()
        with torch.no_grad():
            if module is not None:
                img = module.to(device)(z.to(device), onehot.to(device)).float().cpu()
            else:
                img = torch.from_numpy(upload.artifact.run(z.numpy(), onehot.numpy()))
        if _draws(pixels, upload.meta["input_shape"]):
            img = torch.bernoulli(img.clamp(0, 1), generator=gen)
        out.append(img)
    return torch.cat(out) if out else torch.zeros(0, *upload.meta["input_shape"])


def _draws(pixels: str, input_shape) -> bool:
    """Whether decoded outputs are drawn as Bernoulli samples. A pixel's Bernoulli draw is a
    plausible ink dot; a draw of a window's scaled acceleration is one of two full-scale
    extremes (FedCVAE-ENS on HAPT, 10 users, seed 0: 48.1% drawn, 53.6% with the outputs;
    `auto` picks by the input's kind)."""
    if pixels == "auto":
        return input_kind(tuple(input_shape)) == "image"
    return pixels == "bernoulli"


def class_mean_filter(x: torch.Tensor, y: torch.Tensor, keep_ratio: float, num_classes: int):
    """FedMHO's unsupervised filter ("K-means with one cluster" per class): keep the
    ceil(keep_ratio * n_c) samples of each class nearest to the class mean of flattened pixels."""
    keep = []
    for c in range(num_classes):
        idx = torch.nonzero(y == c).flatten()
        if len(idx) == 0:
            continue
        flat = x[idx].flatten(1)
        dist = (flat - flat.mean(0, keepdim=True)).norm(dim=1)
        k = math.ceil(keep_ratio * len(idx))
        keep.append(idx[torch.argsort(dist, stable=True)[:k]])
    keep_idx = torch.cat(keep).sort().values if keep else torch.zeros(0, dtype=torch.long)
    return x[keep_idx], y[keep_idx]


def per_class_counts(y: torch.Tensor, num_classes: int) -> list[int]:
    return torch.bincount(y, minlength=num_classes).tolist()


# --- training a student ---------------------------------------------------------------------


def kd_loss(student_logits, teacher_logits, reduction: str) -> torch.Tensor:
    """KL(softmax(teacher) || softmax(student)). reduction "mean" averages over batch AND classes
    (FedMHO's code: the KD term is scaled by 1/C); "batchmean" is the textbook KL per sample."""
    kl = F.kl_div(
        F.log_softmax(student_logits, 1), F.softmax(teacher_logits, 1), reduction="batchmean"
    )
    return kl / student_logits.shape[1] if reduction == "mean" else kl


def _per_sample_loss(logits, y, teacher, lam, kd_reduction: str, device) -> torch.Tensor:
    lam = lam.to(device)
    ce = F.cross_entropy(logits, y.to(device), reduction="none")
    kl = F.kl_div(F.log_softmax(logits, 1), F.softmax(teacher.to(device), 1), reduction="none")
    kl = kl.sum(1) / (logits.shape[1] if kd_reduction == "mean" else 1)
    return (lam * ce + (1 - lam) * kl).mean()


AUGMENT = AUGMENT_CHOICES
AUGMENT_HELP = (
    "training-time jitter of synthetic samples: affine (images: a random small "
    "rotation, scale and shift per sample and step), rotate (sensor windows: a random "
    "small 3-D rotation and gain), auto (affine on images, rotate on windows) or none"
)

# "clients": the jitter the clients' classifiers trained under by default (edgefl.client.run).
# A student of decoders' samples trains under it: their teachers and labels are invariant to it
# near real data, and on windows the test users' own orientations need it (FedMHO on issue 32's
# command: 73.35 -> 84.54, bench/results/fedmho_windows.md). Images: the clients train with no
# jitter, and an affine one cost FedHydra 18 points on MNIST Dir(0.1). The generator methods
# default to none (generator.GeneratorConfig says why).
STUDENT_JITTER_HELP = (
    "clients (the clients' own default: rotate on sensor windows, none on images), or "
    + AUGMENT_HELP
)


# Data-free methods distil every classifier at every step: on 2 CPUs FedHydra took 143 s for 20
# teachers and over 15 minutes for 200, DENSE 57 s and 350 s (bench/results/scale.md). Past
# this many, a run would take hours on such a server; each such method refuses it up front.
MAX_TEACHERS = 500
MAX_TEACHERS_HELP = (
    "refuse more classifier uploads than this (0: no cap); their cost grows with each"
)


GROWS = "its cost grows with each teacher"  # a capped method that says no more (teacher_cost)


def over_caps(configured, classifiers: int, flag: str = "--opt") -> dict[str, FusionError]:
    """Each (method, config) of `configured` that `classifiers` classifier uploads put over its
    max_teachers, by name, with its refusal (`flag`: the command's option flag the fix names)."""
    refused = {}
    for method, cfg in configured:
        error = method.over_cap(cfg, classifiers, flag)
        if error is not None:
            refused[method.name] = error
    return refused


def too_many(
    method: str, kind: str, count: int, at_most: int, cost: str, flag: str = "--opt"
) -> FusionError:
    """The refusal of `count` uploads of `kind`, more than the method's max_teachers `at_most`
    (`cost`: what grows with each): the same words before the ingest (from what the files
    declare) as after it (what was accepted)."""
    scoped = f"{method}:" if method else ""
    return FusionError(
        f"{method or 'this method'} refuses {count:,} {kind} uploads, more than its "
        f"max_teachers ({at_most:,}): {cost}",
        hint=f"{flag} {scoped}max_teachers={count} runs it anyway (a GPU helps); "
        "fedmho-md, fedcvae-ens and ensemble fuse 10,000 uploads in minutes "
        "(docs/performance.md)",
    )


def student_jitter(augment: str, input_shape) -> str:
    """`augment` for `edgefl.models.augment.jitter`: "clients" is the jitter a client's
    classifier trains under by default (edgefl.client.run: rotate on sensor windows, else none)."""
    if augment != "clients":
        return augment
    return "none" if input_kind(tuple(input_shape)) == "image" else "rotate"


def pair_mixes(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """As many mixes lam * x_i + (1 - lam) * x_j as x has rows: lam ~ U(0, 1) per row, j a random
    permutation of the rows (drawn from `gen` in that order). A distilled student meets the
    teachers only at the samples it is shown; mixes ask the teachers between them."""
    lam = torch.rand(len(x), generator=gen).view(-1, *[1] * (x.dim() - 1)).to(x.device)
    return lam * x + (1 - lam) * x[torch.randperm(len(x), generator=gen).to(x.device)]


def descend(
    opt: torch.optim.Optimizer, loss: torch.Tensor, what: str = "the student", rate: str = "lr"
) -> float:
    """One step of `opt` on `loss`, the step every fused model's training loop takes; returns the
    loss. A non-finite loss stops the fusion before the step: past it every weight, and so every
    later output, is NaN, and the export would carry a model that cannot classify. `rate` is
    the option whose lowering the message suggests (a generator's is gen_lr)."""
    value = float(loss.detach())
    if not math.isfinite(value):
        raise FusionError(
            f"{what}'s training loss became {value}: its weights would be NaN from this step on",
            hint=f"lower the method's learning rate (--opt {rate}=...), or check the uploads it "
            "learns from",
        )
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return value


def shuffled_epochs(
    opt: torch.optim.Optimizer,
    n: int,
    loss_of,
    *,
    epochs: int,
    batch_size: int,
    gen: torch.Generator,
    progress=None,
    task: str = "epoch",
    note: str = "loss",
    what: str = "the student",
    after_step=None,
) -> list[float]:
    """The loop every fused model that learns from a fixed set trains in: `epochs` passes over
    its n samples, each in a fresh order drawn from `gen`, one `descend` per batch on
    `loss_of(indices)` (then `after_step()`, e.g. a rate schedule). Returns each epoch's mean
    loss per sample; reports each epoch to `progress` (if any) as `task`, its loss named `note`."""
    progress = progress or no_progress
    history = []
    progress(task, 0, epochs)
    for epoch in range(epochs):
        total = 0.0
        for idx in torch.randperm(n, generator=gen).split(batch_size):
            total += descend(opt, loss_of(idx), what) * len(idx)
            if after_step is not None:
                after_step()
        history.append(total / n)
        progress(task, epoch + 1, epochs, f"{note} {history[-1]:.4f}")
    return history


def pool_batches(n: int, batch_size: int, steps: int, rng: torch.Generator) -> list[torch.Tensor]:
    """The batches a pool of n synthetic samples is distilled in: one shuffled pass, or with
    `steps` (> 0) exactly that many batches, from fresh permutations as the pool allows
    (DENSE's and Co-Boosting's kd_steps)."""
    batches = list(torch.randperm(n, generator=rng).split(batch_size))
    if steps:
        while len(batches) < steps:
            batches += list(torch.randperm(n, generator=rng).split(batch_size))
        batches = batches[:steps]
    return batches


def train_student(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor | None,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    device: torch.device,
    teacher: torch.Tensor | None = None,
    lam: float | torch.Tensor = 1.0,
    kd_reduction: str = "mean",
    optimizer: str = "adam",
    augment: str = "none",
    progress=None,
) -> list[float]:
    """Train on (x, y) with loss lam * CE(y) + (1 - lam) * KL(teacher || student); `lam` is one
    number or one per sample (each sample's two terms weighted, then averaged over the batch).
    `teacher` holds precomputed teacher logits for x (they never change: computed once)."""
    if len(x) == 0:
        raise FusionError("no training samples left to train the global model on")
    if kd_reduction not in ("mean", "batchmean"):
        raise ConfigError(f"--kd-reduction must be mean or batchmean, got {kd_reduction!r}")
    gen = torch.Generator().manual_seed(seed)
    model.to(device).train()
    params = model.parameters()
    opt = (
        torch.optim.Adam(params, lr=lr)
        if optimizer == "adam"
        else torch.optim.SGD(params, lr=lr, momentum=0.9)
    )

    def loss_of(idx):
        logits = model(jitter(x[idx], augment, gen).to(device))
        if isinstance(lam, torch.Tensor):
            return _per_sample_loss(logits, y[idx], teacher[idx], lam[idx], kd_reduction, device)
        loss = torch.zeros((), device=device)
        if lam > 0 and y is not None:
            loss = loss + lam * F.cross_entropy(logits, y[idx].to(device))
        if lam < 1 and teacher is not None:
            loss = loss + (1 - lam) * kd_loss(logits, teacher[idx].to(device), kd_reduction)
        return loss

    history = shuffled_epochs(
        opt,
        len(x),
        loss_of,
        epochs=epochs,
        batch_size=batch_size,
        gen=gen,
        progress=progress,
    )
    model.eval()
    return history


class EnsembleModule(nn.Module):
    """Mean of the members' logits: one exportable module."""

    def __init__(self, members: list[nn.Module]):
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(x) for m in self.members]).mean(0)
