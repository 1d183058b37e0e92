"""What the generator-based data-free methods (DENSE, FedHydra) share: DENSE's generator, the
BatchNorm-statistics loss over teachers, frozen teacher copies and KL at a temperature.

Generator (DENSE, Zhang et al. NeurIPS 2022; shared/notes/methods.md): z (nz) -> Linear ->
(2*ngf, s/4, s/4) -> BN -> Up x2 -> Conv 2ngf -> BN -> LReLU -> Up x2 -> Conv ngf -> BN -> LReLU
-> Conv(c) -> Sigmoid. ngf = 64 gives DENSE's 128/64 channels; images are in [0, 1] like every
edgefl dataset.

Both methods read one config (`GeneratorConfig`): the same names for the same knobs and loss
weights (FedHydra's lambda_1 / lambda_2 are `bn_weight` / `adv_weight`, DENSE's names).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from edgefl.errors import ConfigError
from edgefl.fusion.averaging import average_classifiers, one_architecture
from edgefl.fusion.caps import (
    MAX_TEACHERS,
    MAX_TEACHERS_HELP,
    generator_estimate,
    scale_options,
    upload_cap,
)
from edgefl.fusion.config import FusionConfig
from edgefl.fusion.options import option
from edgefl.fusion.student import AUGMENT, STUDENT_JITTER_HELP
from edgefl.fusion.teachers import evaluation_form
from edgefl.models.zoo import spec_label

INIT_HELP = (
    "fresh student (the papers'), or average: the parameter average of the largest group of "
    "same-architecture classifier uploads (FedDF's start; the student takes their architecture)"
)
INIT_CHOICES = ("fresh", "average")


@dataclass(frozen=True)
class GeneratorConfig(FusionConfig):
    """What DENSE and FedHydra share. The defaults are the `cpu` budget: what two CPU cores
    finish in about a minute on MNIST (bench/results/datafree.md), a 32/16-channel generator
    taking 5 steps per epoch on batches of 64 for 30 epochs (DENSE: 10 epochs of 30 steps).
    `PAPER_GENERATOR` is the `paper` budget: DENSE's setup and FedHydra's Sec. 4.1.5, which
    agree (200 epochs, T_G = 30 generator steps, synthesis batch 256, 128/64 channels); both
    budgets keep generator Adam 1e-3, student SGD 0.01 momentum 0.9, loss weights 1, nz 256."""

    student: str = option(
        "auto",
        "zoo architecture of the global model (the student (auto: cnn on images, "
        "cnn1d on sensor windows)",
    )
    # The papers' students start fresh. FedDF (and FedFTG, Zhang et al. 2022, for data-free
    # fine-tuning) start from the uploads' parameter average, which needs one architecture and
    # one initialisation on every client (edgefl's federations hand out one init seed).
    init: str = option("fresh", INIT_HELP, choices=INIT_CHOICES)
    epochs: int = option(30, "epochs: generator steps, then distillation (paper: 200)", low=1)
    batch_size: int = option(
        64, "samples synthesised per step, and the distillation batch (paper: 256)", low=1
    )
    gen_steps: int = option(5, "generator steps per epoch (T_G; paper: 30)", low=1)
    gen_lr: float = option(1e-3, "generator Adam learning rate", low=0, low_open=True)
    lr: float = option(0.01, "student SGD learning rate", low=0, low_open=True)
    momentum: float = option(0.9, "student SGD momentum", low=0, high=1, high_open=True)
    # The student's distillation: every generator's adversarial KL is at T = 1 (DENSE's,
    # Co-Boosting's, FedHydra's Eq. 16); softened there, FedHydra's generator made one class on
    # HAPT at T = 20.
    temperature: float = option(1.0, "distillation temperature T", low=0, low_open=True)
    ce_weight: float = option(1.0, "generator loss: weight of CE(teachers(x), y)", low=0)
    bn_weight: float = option(1.0, "generator loss: weight of the BatchNorm-statistics term", low=0)
    adv_weight: float = option(1.0, "generator loss: weight of the adversarial -KL term", low=0)
    nz: int = option(256, "generator noise dimension", low=1)
    ngf: int = option(16, "generator width (channels 2*ngf, ngf; paper: 64)", low=1)
    # The teachers label a turned window as the original (student.STUDENT_JITTER_HELP's note).
    # None by default: a sample made against the teachers is labelled as it is. The teachers
    # are invariant to the clients' jitter near real data, not at the samples a generator or an
    # inversion pushes towards their decision boundaries, so a jittered synthetic window is a
    # window nobody labelled (HAPT, 18 users, seeds 0-2: FedHydra 70.52 +- 4.56 with the
    # rotations, 74.11 +- 2.40 without; DENSE on seed 0 74.70 -> 73.29 and pFedZKD 74.29 ->
    # 73.73 with them; bench/results/datafree_hapt.md). Decoders' samples model real data:
    # FedMHO and FedCVAE-ENS keep the clients' jitter.
    augment: str = option("none", STUDENT_JITTER_HELP, choices=("clients", *AUGMENT))
    max_teachers: int = option(MAX_TEACHERS, MAX_TEACHERS_HELP, low=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.init == "average" and self.student != "auto":  # it would be passed over
            raise ConfigError(
                f"student={self.student} names a fresh student, and init is average (given, "
                "or this method's default on this dataset): the student starts from the "
                "uploads' average, in their architecture",
                hint="add --opt init=fresh to train that student fresh, or drop the student",
            )


PAPER_GENERATOR = {"epochs": 200, "batch_size": 256, "gen_steps": 30, "ngf": 64}


class GroupedLinear(nn.Module):
    """`groups` independent nn.Linear layers applied to the same input: (b, n) -> (b, g, out)."""

    def __init__(self, groups: int, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(groups, n_out, n_in))
        self.bias = nn.Parameter(torch.empty(groups, n_out))
        for w, b in zip(self.weight, self.bias, strict=True):  # nn.Linear's initialisation
            nn.init.kaiming_uniform_(w, a=math.sqrt(5))
            nn.init.uniform_(b, -1 / math.sqrt(n_in), 1 / math.sqrt(n_in))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bn,gon->bgo", z, self.weight) + self.bias


class Generator(nn.Module):
    """DENSE's generator. With groups = G > 1 it is G independent generators run side by side
    (grouped convolutions, per-channel BatchNorm): one pass replaces G small ones, which is what
    makes FedHydra's per-(client, class) stratification affordable. forward(z) gives images
    (b, c, h, w), or (G, b, c, h, w) when grouped."""

    def __init__(self, nz: int, ngf: int, image_shape: tuple[int, int, int], groups: int = 1):
        super().__init__()
        c, h, w = image_shape
        g = groups
        self.nz, self.ngf, self.groups = nz, ngf, groups
        self.image_shape = (c, h, w)
        # Two x2 upsamplings: start at ceil(s/4) and crop, so sizes not divisible by 4 work too.
        self.init_hw = (math.ceil(h / 4), math.ceil(w / 4))
        self.fc = GroupedLinear(g, nz, 2 * ngf * self.init_hw[0] * self.init_hw[1])
        self.body = nn.Sequential(
            nn.BatchNorm2d(g * 2 * ngf),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(g * 2 * ngf, g * 2 * ngf, 3, padding=1, bias=False, groups=g),
            nn.BatchNorm2d(g * 2 * ngf),
            nn.LeakyReLU(0.2),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(g * 2 * ngf, g * ngf, 3, padding=1, bias=False, groups=g),
            nn.BatchNorm2d(g * ngf),
            nn.LeakyReLU(0.2),
            nn.Conv2d(g * ngf, g * c, 3, padding=1, groups=g),
            nn.Sigmoid(),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        b, g = len(z), self.groups
        x = self.body(self.fc(z).reshape(b, g * 2 * self.ngf, *self.init_hw))
        c, h, w = self.image_shape
        x = x[..., :h, :w]
        return x if g == 1 else x.reshape(b, g, c, h, w).transpose(0, 1)

    def replicate(self, groups: int) -> Generator:
        """A grouped generator whose every group starts as a copy of this (ungrouped) one: all
        leading dimensions of its tensors are group-major, so repeating them stacks copies."""
        out = Generator(self.nz, self.ngf, self.image_shape, groups)
        state = {
            k: v.repeat(groups, *[1] * (v.dim() - 1)) if v.dim() else v
            for k, v in self.state_dict().items()
        }
        out.load_state_dict(state)
        return out.to(self.fc.weight.device).train()


def make_generator(nz: int, ngf: int, image_shape, seed: int, device) -> Generator:
    """A generator whose initial weights depend only on `seed` (not on the global RNG)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        gen = Generator(nz, ngf, tuple(image_shape))
    return gen.to(device).train()


def frozen_teachers(uploads, device) -> list[nn.Module]:
    """Private copies of the rebuilt classifiers in their evaluation form (`teachers`): eval
    mode, no parameter gradients, so fusing never touches the uploads' modules and backward only
    reaches the generator."""
    out = []
    for u in uploads:
        m = evaluation_form(copy.deepcopy(u.module), inplace=True).to(device).eval()
        m.requires_grad_(False)
        out.append(m)
    return out


def seeded_teachers(ctx, cfg, cost: str) -> tuple[list, list[nn.Module]]:
    """How each generator method starts: its classifier uploads (at most `cfg.max_teachers`,
    else refused with `cost`, what grows with each), torch's global seed set to `cfg.seed`, and
    the uploads' frozen private copies."""
    found = sum(u.kind == "classifier" for u in ctx.uploads)  # the refusal's time, as over_cap's
    cost += generator_estimate(cfg, found)
    scale = scale_options(cfg)
    uploads = ctx.require("classifier", at_most=upload_cap(cfg), cost=cost, scale=scale)
    torch.manual_seed(cfg.seed)
    return uploads, frozen_teachers(uploads, ctx.device)


def first_student(ctx, cfg, uploads, method: str):
    """(spec, module, start) of the student as `cfg.init` starts it: fresh as `cfg.student`
    names it, or the average of the largest same-architecture group of `uploads` (the rest stay
    teachers: the average is where the student starts, not whom it learns from); `start` is
    what the report says of it (`student_start`)."""
    if cfg.init != "average":
        spec, student = ctx.student(cfg.student)
        return spec, student, {"init": "fresh", "architecture": spec_label(spec)}
    kept, _ = one_architecture(uploads, f"{method} --opt init=average")
    spec, student = average_classifiers(kept, f"{method} --opt init=average")
    start = {
        "init": "average",
        "architecture": spec_label(spec),
        "averaged": [u.client_id for u in kept],
    }
    return spec, student.to(ctx.device), start


def sample_noise(rng: torch.Generator, n: int, nz: int, num_classes: int, device):
    """z ~ N(0, I) and uniform target labels, drawn on the CPU from a seeded generator so a run
    is the same on every device."""
    z = torch.randn(n, nz, generator=rng)
    y = torch.randint(0, num_classes, (n,), generator=rng)
    return z.to(device), y.to(device)


class BNStatLoss:
    """DeepInversion/DENSE BatchNorm-statistics loss. Hooks every BatchNorm layer of the teachers
    that have one; after a forward pass, `value()` is, averaged over those teachers, the sum over
    their BN layers of ||batch mean - running mean||_2 + ||batch var - running var||_2 of the
    layer's input. Teachers without BatchNorm simply contribute nothing (they have no statistics
    to match), which is how heterogeneous federations mix BN and non-BN clients."""

    def __init__(self, teachers: list[nn.Module]):
        self.terms: dict[int, list[torch.Tensor]] = {}
        self.recording = False  # set by teacher_forward around its own pass
        self.handles = []
        self.with_bn: list[int] = []
        for k, t in enumerate(teachers):
            layers = [
                m
                for m in t.modules()
                if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None
            ]
            if layers:
                self.with_bn.append(k)
            for m in layers:
                self.handles.append(m.register_forward_hook(self._hook(k)))

    def _hook(self, k: int):
        def hook(module, inputs, output):
            x = inputs[0]
            dims = [d for d in range(x.dim()) if d != 1]
            mean = x.mean(dims)
            var = x.var(dims, unbiased=False)
            term = torch.norm(mean - module.running_mean, 2) + torch.norm(
                var - module.running_var, 2
            )
            # computed on every call (a checkpointed recomputation must save what the first
            # pass saved), kept only during teacher_forward's own pass
            if self.recording:
                self.terms.setdefault(k, []).append(term)

        return hook

    def reset(self) -> None:
        self.terms = {}

    def value(self, device) -> torch.Tensor:
        if not self.terms:
            return torch.zeros((), device=device)
        return torch.stack([torch.stack(v).sum() for v in self.terms.values()]).mean()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


# Teachers whose activations a differentiable pass keeps at once. Each teacher's activations
# stay until the backward: one DENSE generator step at batch 64 held ~3.8 MiB a `cnn`/`scnn`
# teacher (7.9 GiB at 2,000; bench/results/generator_memory.md). Past this many, each group's
# are dropped after its forward and recomputed in the backward (torch's checkpointing): the
# same gradients for one more forward of the teachers.
CHECKPOINT_GROUP = 64


def teacher_forward(teachers: list[nn.Module], x: torch.Tensor, bn: BNStatLoss | None = None):
    """(m, b, c) logits of every teacher on x; with `bn`, also records this pass's BN terms.
    Only this pass records: a group recomputed in the backward (or a teacher called elsewhere)
    computes its terms but does not keep them, or each would hold its whole graph."""
    if bn is not None:
        bn.reset()
        bn.recording = True
    try:
        grouped = len(teachers) > CHECKPOINT_GROUP and torch.is_grad_enabled() and x.requires_grad
        if not grouped:
            return _stacked_logits(teachers, x)
        size = CHECKPOINT_GROUP
        groups = [teachers[i : i + size] for i in range(0, len(teachers), size)]
        return torch.cat([checkpoint(_stacked_logits, g, x, use_reentrant=False) for g in groups])
    finally:
        if bn is not None:
            bn.recording = False


def draw_committee(n: int, size: int, rng: torch.Generator) -> list[int] | None:
    """The indices of `size` of `n` teachers, drawn without replacement for one step, in
    order; None (every teacher, and nothing drawn from `rng`) when `size` is 0 or not fewer."""
    if not size or size >= n:
        return None
    return torch.randperm(n, generator=rng)[:size].sort().values.tolist()


def committee(teachers: list[nn.Module], size: int, rng: torch.Generator) -> list[nn.Module]:
    """`size` of `teachers` for one step (`draw_committee`). The ensemble a step matches and
    pools is a fresh committee's: the federation's on average, at the cost of `size` teachers
    a step."""
    picked = draw_committee(len(teachers), size, rng)
    return teachers if picked is None else [teachers[k] for k in picked]


def _stacked_logits(teachers: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    return torch.stack([t(x) for t in teachers])


def kl_at(teacher_logits, student_logits, temperature: float = 1.0, reduction="batchmean"):
    """KL(softmax(t/T) || softmax(s/T)) * T^2 (Hinton's scaling keeps gradients comparable
    across temperatures). reduction "none" gives one value per sample."""
    t = F.log_softmax(teacher_logits / temperature, 1)
    s = F.log_softmax(student_logits / temperature, 1)
    kl = F.kl_div(s, t, log_target=True, reduction="none").sum(1) * temperature**2
    return kl if reduction == "none" else kl.mean()


def set_trainable(model: nn.Module, on: bool) -> None:
    """The student is a fixed discriminator while the generator trains: no grads, eval BN."""
    model.requires_grad_(on)
    model.train(on)


class SyntheticValidation:
    """A data-free stopping and selection signal. Each epoch adds a few held-out synthetic images
    (fresh noise through the current generator, never trained on) with the teachers' hard labels;
    after each epoch's distillation the student is scored by its agreement with them, on the
    whole held-out set so far, against the best earlier student on the same set. The best
    student is kept (one copy), and `stale` counts epochs since it last changed.

    Why: a student distilled only on the latest generator's samples forgets the earlier ones
    (FedHydra's paper: "all the models collapse due to overfitting in model distillation"); on
    MNIST its test accuracy peaked at 81% and fell to 58% by the end of a run."""

    def __init__(self, size: int, epochs: int):
        self.per_epoch = max(1, math.ceil(size / max(1, epochs)))
        self.x: list[torch.Tensor] = []
        self.y: list[torch.Tensor] = []
        self.best: nn.Module | None = None  # a frozen copy of the best student so far
        self.best_epoch = 0
        self.stale = 0

    def add(self, x: torch.Tensor, labels: torch.Tensor) -> None:
        self.x.append(x.detach())
        self.y.append(labels.detach())

    @torch.no_grad()
    def _agreement(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
        hits = sum(
            int((model(xb).argmax(1) == yb).sum())
            for xb, yb in zip(x.split(512), y.split(512), strict=True)
        )
        return hits / max(1, len(y))

    def update(self, student: nn.Module, epoch: int) -> float:
        """Score the student after `epoch` (1-based); keep it if it beats the best so far."""
        x, y = torch.cat(self.x), torch.cat(self.y)
        was = student.training
        student.eval()
        score = self._agreement(student, x, y)
        best = -1.0 if self.best is None else self._agreement(self.best, x, y)
        if score >= best:
            self.best = copy.deepcopy(student).requires_grad_(False)
            self.best_epoch, self.stale = epoch, 0
        else:
            self.stale += 1
        student.train(was)
        return score

    def restore_best(self, student: nn.Module) -> None:
        if self.best is not None:
            student.load_state_dict(self.best.state_dict())


class WeightAverage:
    """A uniform average of the student's weights at the end of every epoch from `start` (1-based)
    on: stochastic weight averaging (Izmailov et al., 2018) over the game's epochs.

    Why: each epoch's generator pulls the student towards its latest samples, so the data-free
    student's accuracy swings between epochs (Fashion-MNIST, FedHydra: 62-75 % from one epoch to
    the next), and a few dozen held-out synthetic images cannot tell which epoch was best. The
    average of the late students lies between those swings (bench/results/fedhydra_average.md)."""

    def __init__(self, start: int):
        self.start = max(1, start)
        self.n = 0
        self.avg: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def update(self, student: nn.Module, epoch: int) -> None:
        if epoch < self.start:
            return
        self.n += 1
        for k, v in student.state_dict().items():
            if not v.is_floating_point() or k not in self.avg:  # counters: the latest
                self.avg[k] = v.detach().clone()
            else:
                self.avg[k] += (v.detach() - self.avg[k]) / self.n

    @torch.no_grad()
    def restore(self, student: nn.Module, images: torch.Tensor | None = None) -> None:
        """Load the average into `student`; with BatchNorm, its statistics are measured again on
        `images` (an average of weights has no running statistics of its own; `update_bn` leaves
        a student without BatchNorm as it is)."""
        if not self.n:
            return
        student.load_state_dict(self.avg)
        if images is not None and len(images):
            torch.optim.swa_utils.update_bn(images.split(256), student)


class ReplayPool:
    """Up to `capacity` earlier synthetic images with their targets, a uniform sample of all seen
    so far (reservoir sampling), so a student can rehearse what earlier generators made. The
    targets are one tensor (`t`) or a tuple of tensors aligned with the images (Co-Boosting
    keeps each teacher's logits and the generator's target label); `sample` and `contents`
    return them in the shape they were added in."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.x: torch.Tensor | None = None
        self._t: tuple[torch.Tensor, ...] = ()
        self._single = True
        self.size = 0
        self.seen = 0

    @property
    def t(self):
        return self._t[0] if self._single and self._t else (self._t or None)

    def _out(self, ts: tuple[torch.Tensor, ...]):
        return ts[0] if self._single else ts

    def add(self, x: torch.Tensor, t, rng: torch.Generator) -> None:
        """Algorithm R over a batch: the first `capacity` images fill the pool; image number i
        (1-based, over the whole run) then replaces a uniform slot with probability capacity / i."""
        if self.capacity <= 0 or len(x) == 0:
            return
        ts = t if isinstance(t, tuple) else (t,)
        if self.x is None:
            self._single = not isinstance(t, tuple)
            self.x = x.new_empty((self.capacity, *x.shape[1:]))
            self._t = tuple(v.new_empty((self.capacity, *v.shape[1:])) for v in ts)
        fill = min(len(x), self.capacity - self.size)
        self.x[self.size : self.size + fill] = x[:fill]
        for dst, src in zip(self._t, ts, strict=True):
            dst[self.size : self.size + fill] = src[:fill]
        self.size += fill
        rest = len(x) - fill
        if rest:
            numbers = torch.arange(self.seen + fill + 1, self.seen + len(x) + 1)
            slots = (torch.rand(rest, generator=rng) * numbers).long()
            chosen: dict[int, int] = {}  # slot -> the last image drawn for it wins, as in order
            for i in torch.nonzero(slots < self.capacity).flatten().tolist():
                chosen[int(slots[i])] = fill + i
            if chosen:
                dst = torch.tensor(list(chosen), device=self.x.device)
                src = torch.tensor(list(chosen.values()), device=x.device)
                self.x[dst] = x[src]
                for pool_t, new_t in zip(self._t, ts, strict=True):
                    pool_t[dst] = new_t[src]
        self.seen += len(x)

    def sample(self, n: int, rng: torch.Generator):
        idx = torch.randint(0, self.size, (n,), generator=rng).to(self.x.device)
        return self.x[idx], self._out(tuple(v[idx] for v in self._t))

    def contents(self):
        """Everything the pool holds now: (images, targets), views, not copies."""
        return self.x[: self.size], self._out(tuple(v[: self.size] for v in self._t))
