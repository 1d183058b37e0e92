"""pFedZKD's server: Multi-ZSKD, multi-teacher zero-shot distillation (Yang et al., Appl. Sci.
2026, Sec. 3.3, Algorithms 3-4; shared/papers/pfedzkd.txt). Teachers may differ in architecture.

1. Per teacher k: class similarity C^k = cosine similarity of the rows of its last linear layer,
   clamped below at `similarity_floor` (Dirichlet concentrations must be positive; the paper only
   says "clipped to be positive").
2. Per teacher, class c and beta in `betas`: soft targets y ~ Dir(beta * C^k_c); pseudo-images x
   start from standard-normal noise and Adam minimises CE(y, softmax(T_k(x) / tau)). edgefl's
   images live in [0, 1], so x = sigmoid(v) with v ~ N(0, I) is what is optimised. Sensor
   windows start 10x nearer the centre with 10x smaller steps (`init_std`, `inversion_lr`:
   defaults by input): from the paper's start they came out as noise the teachers ignore, and
   the student learnt that noise means "still" (bench/results/datafree_hapt.md).
   With `bn` (ours, on for images) DeepInversion's BatchNorm-statistics prior joins the loss:
   a Fashion teacher's pseudo-images were far from its data (bench/results/pfedzkd_bn.md).
   With `joint` (ours, off) that many of them are inverted against all teachers at once.
3. All teachers' pseudo-images are pooled and labelled by the mean over ALL teachers of
   softmax(T(x) / tau) (`labels=probabilities`, ours: by their probability average, softened as
   one teacher's output). With `balance` (ours, 0.5 on images) each label is divided by its
   class's mean label over the pseudo-set to that power: the consensus names a few classes for
   most pseudo-images, and the student would learn that skew as a prior.
   With `mix` (ours, on): as many mixes of random pairs of them join, labelled the same way
   (the paper's student sees the teachers at the N_syn points alone).
4. A fresh `--student` is trained on them with KL(label || softmax(S(x) / tau)), scaled by tau^2
   (Hinton et al. 2015) so its gradients do not shrink with the temperature.

`synthetic` is the total N_syn, split evenly over teachers x classes x betas (the paper's 4,000 on
MNIST; its Algorithm 3 can also be read as N_syn per teacher: pass K x 4,000 for that).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from edgefl.artifacts import Upload
from edgefl.errors import ConfigError, FusionError
from edgefl.fusion import generator
from edgefl.fusion.base import FusionContext, FusionResult, Method, pfedzkd_table2
from edgefl.fusion.caps import (
    MAX_TEACHERS,
    MAX_TEACHERS_HELP,
    check_committee,
    scale_options,
    upload_cap,
)
from edgefl.fusion.config import FusionConfig
from edgefl.fusion.inversion import INVERSION_CHUNK, invert, smooth_from_option
from edgefl.fusion.options import MAX_SYNTHETIC, option
from edgefl.fusion.samples import largest_remainder
from edgefl.fusion.student import pair_mixes, shuffled_epochs
from edgefl.fusion.teachers import TEACHER_GROUP, evaluation_form


@dataclass(frozen=True)
class PFedZKDConfig(FusionConfig):
    """Paper (Sec. 4.1.2) where it gives a value: N_syn, tau, betas, normal init. It gives none for
    the inversion or distillation schedule; ours are marked."""

    # The student meets the teachers' function at these points only. Twice the paper's count:
    # +1.24 +- 0.52 over Fashion Table 2's nine cpu cells (the table re-run, bench/results/
    # fashion_pfedzkd_balance.md), +1.59 +- 0.39 over MNIST's nine (the same file), for
    # 1.7-2x the inversion; windows keep 4,000 (HAPT, 18 users, seeds 0-2: 8,000 +0.20 at twice
    # the time; bench/results/datafree_hapt_pfedzkd_1203.md). The paper budget keeps 4,000.
    synthetic: int | None = option(
        None,
        "pseudo-images in all (paper: 4,000 on MNIST)",
        by_input={"image": 8_000, "signal": 4_000},
        low=1,
        high=MAX_SYNTHETIC,
    )
    tau: float = option(4.0, "distillation temperature (paper: 4)", low=0, low_open=True)
    betas: tuple[float, ...] = option(
        (0.1, 1.0),
        "Dirichlet concentrations of the soft targets (paper's beta set)",
        low=0,
        low_open=True,
    )
    inversion_steps: int = option(
        200, "Adam steps per inversion batch (ours; ZSKD used 1,500)", low=1
    )
    # Real HAPT windows vary by 0.004 (still) to 0.05 (walking) around the centre of [0, 1], with
    # steps of 0.001-0.02 between samples; inverted from N(0, I) with Adam 0.1 they varied by
    # 0.13-0.28 with white-noise steps, the still classes' as much as the walking ones', and a
    # student taught on them took every walking window for a still one (walking recall 5%). A
    # start 10x nearer the centre and 10x smaller steps leave only what the teacher asks for.
    inversion_lr: float | None = option(
        None,
        "inversion Adam learning rate (ours)",
        by_input={"image": 0.1, "signal": 0.01},
        low=0,
        low_open=True,
    )
    # Sec. 4.1.2's N(0, I) start on images; windows start near their range's centre.
    init_std: float | None = option(
        None,
        "std of the inversion's start v",
        by_input={"image": 1.0, "signal": 0.1},
        low=0,
    )
    # Inverted from the teacher's loss alone, windows come out as white noise (neighbouring samples
    # 0.06-0.1 apart; real ones 0.001-0.02) and the student learns features no real window has
    # (bench/results/datafree_hapt.md). Real sampled signals are smooth in time: a prior says so.
    # Digits are strokes: the same prior on images blurs them (MNIST Dir(0.5) seed 0, weight 1: 84.12 -> 56.92).
    # Windows: HAPT, 18 users, seeds 0-2: 70.3 +- 5.5 -> 74.1 +- 0.5 with weight 1
    # (bench/results/datafree_hapt_smooth.md); images keep the paper's inversion (0).
    smooth: float | None = option(
        None,
        "weight of the smoothness prior on pseudo-images (squared steps between "
        "neighbouring values)",
        by_input={"image": 0.0, "signal": 1.0},
        low=0,
    )
    smooth_from: float | None = smooth_from_option()
    # Inverted from the teacher's loss alone, a Fashion image is whatever the teacher reads as its
    # class, and the student taught on them falls 6-8 points under the same teachers' ensemble;
    # on 4,000 real training images (unlabelled, the same distillation) it reaches 82.02, over
    # it (bench/results/pfedzkd_bn.md). A searched teacher's BatchNorm layers hold what its
    # data gave there; pulling each chunk's statistics to them is DeepInversion's prior.
    bn: float | None = option(
        None,
        "weight of the BatchNorm-statistics prior in the inversion (ours, DeepInversion's: "
        "each BatchNorm layer's input statistics pulled to the teacher's running ones; a "
        "teacher without BatchNorm adds nothing)",
        by_input={"image": 10.0, "signal": 0.0},
        low=0,
    )
    # On real test images the mean of the teachers' softmax(T(x) / 4) is within 3 points of
    # their probability average (over it on four of eight Fashion Table 2 cells) and 9-22 over
    # their logit average (e.g. Dir(0.5) seed 3: 84.56 / 84.13 / 75.70): the paper's labels
    # are not the weak combination (bench/results/fashion_pfedzkd_dir05_shirts_1205.md, five
    # cells; fashion_pfedzkd_levers.md, three). Labelling pseudo-images by the probability
    # average lost 2.3-10.2 on the three cells run (fashion_pfedzkd_student.md).
    # A teacher's own pseudo-images show the consensus what that teacher reads as a class, and
    # the student trained on them loses real shirts the teachers' consensus recognises (Fashion
    # Dir(0.5) seeds 3-5: 10 / 4 / 15 % against 50 / 27 / 57 %; bench/results/
    # fashion_pfedzkd_dir05_shirts_1205.md). Some images inverted against all teachers at once
    # are ones the consensus itself reads as each class: 1,000 gained +0.97 on those cells (a
    # scratch form) and +0.28 on seeds 0-2 (this option; shirts still lost), for about twice
    # the inversion time (fashion_pfedzkd_joint_1205.md): not adopted, the paper's 0 stays.
    joint: int = option(
        0,
        "of the `synthetic` pseudo-images, how many are inverted against all teachers at once "
        "(their mean softmax(T(x) / tau) fitted to soft targets drawn from their mean class "
        "similarity; a random committee's per batch where `committee` is set) instead of one "
        "teacher each (ours; 0: the paper's per-teacher inversion)",
        low=0,
        high=MAX_SYNTHETIC,
    )
    labels: str = option(
        "softened",
        "softened: the mean of the teachers' softmax(T(x) / tau) (the paper's); probabilities: "
        "their mean softmax(T(x)), softened as one teacher's (softmax(log p / tau))",
        choices=("softened", "probabilities"),
    )
    # The teachers' consensus names a few classes for most pseudo-images, whatever class each
    # was inverted for (Fashion Dir(0.1) seed 0: pullover 8,421 of 16,000, coat 7), and the
    # student learns that skew as a prior. Dividing each label by its class's mass over the
    # pseudo-set (Saerens et al. 2002's label-shift correction), to the power `balance`,
    # evens that prior (1: fully; 1 lost 1.1 on the one cell run, 0.25 gained less than 0.5).
    # At 8,000 pseudo-images, 0.5 against 0: Fashion Table 2's nine cpu cells +2.86 +- 0.86
    # (8 better), MNIST's nine +2.44 +- 0.61 (bench/results/fashion_pfedzkd_balance.md);
    # windows keep the paper's labels (HAPT, 18 users, seeds 0-2: 0.5 costs 2.74, 3 of 3
    # worse; bench/results/datafree_hapt_pfedzkd_1203.md).
    balance: float | None = option(
        None,
        "labels divided by (their class's mean label over the pseudo-set) ^ balance, "
        "renormalised (ours; 0: the paper's labels, 1: a uniform class prior)",
        by_input={"image": 0.5, "signal": 0.0},
        low=0,
        high=1,
    )
    similarity_floor: float = option(
        1e-3, "class similarities are clamped to [floor, 1] (ours)", low=0, low_open=True, high=1
    )
    student: str = option(
        "auto",
        "zoo architecture of the global model (auto: cnn on images, cnn1d on sensor windows)",
    )
    # The student meets the teachers' function at the N_syn pseudo-samples only (30 epochs over
    # the same 4,000). Mixes of two of them, labelled by the teachers as the rest are, ask the
    # teachers between those points (HAPT, 18 users, the uploads of 2026-11-27, seeds 0-2:
    # bench/results/datafree_hapt_pfedzkd_mix.md).
    mix: bool = option(
        True,
        "add N_syn mixes lam * x_i + (1 - lam) * x_j of random pairs of pseudo-samples (lam "
        "uniform), labelled by the teachers' consensus, and distil in batches twice as large "
        "(the same steps); false: the paper's pseudo-samples alone",
    )
    epochs: int = option(30, "distillation epochs (ours)", low=1)
    lr: float = option(
        1e-3, "student Adam learning rate (the paper's client rate)", low=0, low_open=True
    )
    batch_size: int = option(64, "batch size (the paper's)", low=1)
    max_teachers: int = option(MAX_TEACHERS, MAX_TEACHERS_HELP, low=0)
    # Every teacher is still inverted (its pseudo-images are what it adds); a committee labels
    # each batch of them, an unbiased estimate of the consensus at the cost of `committee`
    # teachers (2,000 teachers labelling 8,000 images took 490 s of a 900 s run).
    committee: int = option(
        0,
        "teachers whose consensus labels each batch of pseudo-images, drawn at random anew "
        "for each batch (0: every teacher): the labelling's time no longer grows with the "
        "uploads, and max_teachers then caps the committee",
        low=0,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_committee(self)
        if self.synthetic is not None and self.joint > self.synthetic:
            raise ConfigError(
                f"--joint {self.joint} is more than --synthetic {self.synthetic}: the joint "
                "pseudo-images are part of the synthetic ones",
                hint=f"e.g. --joint {self.synthetic // 8}, or raise --synthetic",
            )


class Teachers:
    """The teachers' evaluation forms, each built when a pass asks for it: a committee's pass
    never holds all of them (a parked upload's module is read from disk at each access)."""

    def __init__(self, uploads: list[Upload]):
        self.uploads = uploads

    def __len__(self) -> int:
        return len(self.uploads)

    def __getitem__(self, k: int) -> nn.Module:
        return evaluation_form(self.uploads[k].module)


def class_similarity(head: nn.Linear, floor: float) -> torch.Tensor:
    """C[i, j] = cos(w_i, w_j) over the rows of the classifier's last layer, clamped to [floor, 1]."""
    w = F.normalize(head.weight.detach().float(), dim=1)
    return (w @ w.T).clamp(min=floor, max=1.0)


def soft_targets(sim: torch.Tensor, c: int, beta: float, n: int, rng: np.random.Generator):
    """n draws from Dir(beta * C_c). A draw that underflowed (all zeros) falls back to one-hot c."""
    alpha = beta * sim[c].double().cpu().numpy()
    y = rng.dirichlet(alpha, size=n)
    bad = ~np.isfinite(y).all(1) | (y.sum(1) <= 0)
    y[bad] = np.eye(len(alpha))[c]
    return torch.from_numpy(y / y.sum(1, keepdims=True)).float()


def targets_of(sim: torch.Tensor, counts: np.ndarray, cfg, rng: np.random.Generator):
    """Soft targets for (classes x betas) `counts` of pseudo-images, class by class."""
    return torch.cat(
        [
            soft_targets(sim, c, b, int(counts[c, j]), rng)
            for c in range(len(counts))
            for j, b in enumerate(cfg.betas)
        ]
    )


def soften(p: torch.Tensor, tau: float) -> torch.Tensor:
    """softmax(log p / tau): probabilities p softened as if they were one model's at tau 1."""
    return F.softmax(p.clamp_min(1e-12).log() / tau, dim=1)


@torch.no_grad()
def labels_of(teachers, parts, cfg, device, committee=None):
    """The pooled images' soft labels by `cfg.labels`: the mean of the teachers' softened
    outputs, or their probability average softened as one teacher's."""
    if cfg.labels == "softened":
        labels = consensus_of(teachers, parts, cfg.tau, device, committee=committee)
    else:
        labels = [
            soften(p, cfg.tau)
            for p in consensus_of(teachers, parts, 1.0, device, committee=committee)
        ]
    return rebalance(labels, cfg.balance)


def rebalance(labels: list[torch.Tensor], power: float) -> list[torch.Tensor]:
    """Each label divided by its class's mean label over all parts, to `power`, renormalised."""
    if not power:
        return labels
    mass = torch.cat(labels).mean(0).clamp_min(1e-12)
    return [F.normalize(y * mass.pow(-power), p=1, dim=1) for y in labels]


@torch.no_grad()
def consensus_of(teachers, parts, tau: float, device, batch: int = 512, committee=None):
    """For each tensor of `parts`, the mean over all teachers of softmax(T(x) / tau): the
    pooled images' soft labels. Every teacher's evaluation form is built once for all parts,
    TEACHER_GROUP at a time (holding all 2,000 took about 3 GiB). With `committee` (size,
    rng), each batch's labels are a random committee's, drawn for each batch in order."""
    if committee:
        return [_committee_consensus(teachers, x, tau, device, batch, committee) for x in parts]
    sums = [None] * len(parts)
    for start in range(0, len(teachers), TEACHER_GROUP):
        group = [teachers[k] for k in range(start, min(start + TEACHER_GROUP, len(teachers)))]
        for i, x in enumerate(parts):
            part = torch.cat([_prob_sum(group, xb, tau, device) for xb in x.split(batch)])
            sums[i] = part if sums[i] is None else sums[i] + part
    # sum / K is bit for bit the stacked probabilities' mean(0), its form before the grouping
    return [s / len(teachers) for s in sums]


def _prob_sum(teachers, xb: torch.Tensor, tau: float, device) -> torch.Tensor:
    xb = xb.to(device)
    probs = [F.softmax(t.to(device).eval()(xb).float() / tau, dim=1) for t in teachers]
    return torch.stack(probs).sum(0).cpu()


def _committee_consensus(teachers, x, tau: float, device, batch: int, committee):
    out = []
    for xb in x.split(batch):
        some = generator.committee(teachers, *committee)
        out.append(_prob_sum(some, xb, tau, device) / len(some))
    return torch.cat(out)


def consensus(teachers, x: torch.Tensor, tau: float, device, batch: int = 512, committee=None):
    """`consensus_of` one tensor."""
    return consensus_of(teachers, [x], tau, device, batch, committee)[0]


def distill(student, x, labels, *, tau, epochs, lr, batch_size, seed, device, progress=None):
    """KL(labels || softmax(S(x) / tau)) * tau^2 with Adam; returns the loss per epoch."""
    gen = torch.Generator().manual_seed(seed)
    student.to(device).train()
    opt = torch.optim.Adam(student.parameters(), lr=lr)

    def loss_of(idx):
        logp = F.log_softmax(student(x[idx].to(device)) / tau, dim=1)
        return F.kl_div(logp, labels[idx].to(device), reduction="batchmean") * tau**2

    history = shuffled_epochs(
        opt,
        len(x),
        loss_of,
        epochs=epochs,
        batch_size=batch_size,
        gen=gen,
        progress=progress,
        task="distill epoch",
        note="KL",
    )
    student.eval()
    return history


def mixes_of(x: torch.Tensor, seed: int) -> torch.Tensor:
    """As many mixes lam * x_i + (1 - lam) * x_j of the pseudo-samples (lam ~ U(0, 1), j a
    random pseudo-sample), labelled later by the teachers as the rest are."""
    return pair_mixes(x, torch.Generator().manual_seed(seed + 1))  # not the distillation's stream


def allocation(teachers: int, n_cls: int, cfg: PFedZKDConfig, log) -> np.ndarray:
    """(teachers x classes x betas) pseudo-image counts: `synthetic` split evenly over the
    cells. With fewer images than cells the remainders' ties went to the first teachers in
    upload order (at 2,000 teachers the first 200 alone): the teachers are then a seeded draw."""
    total = cfg.synthetic - cfg.joint  # the rest are inverted against all teachers at once
    counts = largest_remainder(total, np.ones(teachers * n_cls * len(cfg.betas)))
    counts = counts.reshape(teachers, n_cls, len(cfg.betas))
    if total and counts[-1].sum() == 0:
        counts = counts[np.random.default_rng(cfg.seed + 3).permutation(teachers)]
        log(
            f"pfedzkd inverts {int((counts.sum((1, 2)) > 0).sum()):,} of {teachers:,} teachers, "
            f"drawn at random: {total:,} pseudo-images over {n_cls} classes x "
            f"{len(cfg.betas)} betas each (raise --synthetic to invert more)"
        )
    return counts


def synthesize(teachers: list[Upload], ctx: FusionContext, cfg: PFedZKDConfig):
    """Algorithm 3: every teacher's pseudo-images, its soft targets and per-teacher statistics."""
    n_cls = ctx.num_classes
    counts = allocation(len(teachers), n_cls, cfg, ctx.log)
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    xs, ys, stats = [], [], []
    ctx.progress("inversion teacher", 0, len(teachers))
    for k, t in enumerate(teachers):
        if not counts[k].any():  # not drawn (`allocation`): its module is not even read
            stats.append({"client_id": t.client_id, "images": 0, "target_agreement": None})
            continue
        module = t.module  # once: a parked upload's is read from disk at each access
        head = getattr(module, "head", None)
        if not isinstance(head, nn.Linear) or head.out_features != n_cls:
            raise FusionError(
                f"pfedzkd reads each teacher's last linear layer; {t.name} has none with "
                f"{n_cls} outputs",
                hint="upload edgefl zoo classifiers (their `head` is that layer)",
            )
        targets = targets_of(class_similarity(head, cfg.similarity_floor), counts[k], cfg, rng)
        x = _invert(module, targets, ctx, cfg, gen)
        with torch.no_grad():
            pred = module(x.to(ctx.device)).argmax(1).cpu()
        agree = float((pred == targets.argmax(1)).float().mean()) if len(x) else 0.0
        stats.append({"client_id": t.client_id, "images": len(x), "target_agreement": agree})
        ctx.progress(
            "inversion teacher",
            k + 1,
            len(teachers),
            f"{len(x)} pseudo-images, teacher argmax = target's on {100 * agree:.1f}%",
        )
        xs.append(x)
        ys.append(targets)
    if cfg.joint:
        x, targets = synthesize_joint(teachers, ctx, cfg, rng, gen)
        xs.append(x)
        ys.append(targets)
    return torch.cat(xs), torch.cat(ys), stats


def _invert(teachers, targets: torch.Tensor, ctx: FusionContext, cfg: PFedZKDConfig, gen):
    """`invert` with the config's inversion settings."""
    return invert(
        teachers,
        targets,
        ctx.input_shape,
        steps=cfg.inversion_steps,
        lr=cfg.inversion_lr,
        tau=cfg.tau,
        gen=gen,
        device=ctx.device,
        init_std=cfg.init_std,
        smooth=cfg.smooth,
        smooth_from=cfg.smooth_from,
        bn=cfg.bn,
    )


def synthesize_joint(teachers: list[Upload], ctx: FusionContext, cfg: PFedZKDConfig, rng, gen):
    """`joint` pseudo-images inverted against the teachers' consensus (a committee's per chunk
    where one is set), for soft targets drawn from their mean class similarity, split evenly
    over classes x betas."""
    # the modules themselves, not their evaluation forms: gradients and BatchNorm statistics
    # flow through them; a committee's are read for its chunk only (a parked upload's module
    # is read from disk at each access)
    held = None if cfg.committee else [t.module for t in teachers]
    heads = [m.head for m in held] if held else [t.module.head for t in teachers]
    sim = torch.stack([class_similarity(h, cfg.similarity_floor) for h in heads]).mean(0)
    n_cls = ctx.num_classes
    counts = largest_remainder(cfg.joint, np.ones(n_cls * len(cfg.betas))).reshape(n_cls, -1)
    targets = targets_of(sim, counts, cfg, rng)
    draw = torch.Generator().manual_seed(cfg.seed + 4)
    xs = []
    for chunk in targets.split(INVERSION_CHUNK):
        some = held or [t.module for t in generator.committee(teachers, cfg.committee, draw)]
        xs.append(_invert(some, chunk, ctx, cfg, gen))
        ctx.progress("joint inversion", len(xs), -(-len(targets) // INVERSION_CHUNK))
    return torch.cat(xs), targets


# What grows with each classifier teacher (max_teachers caps them).
TEACHER_COST = "it inverts every teacher and labels each pseudo-image by all of them"


def fuse(ctx: FusionContext, cfg: PFedZKDConfig) -> FusionResult:
    teachers = ctx.require(
        "classifier", at_most=upload_cap(cfg), cost=TEACHER_COST, scale=scale_options(cfg)
    )
    torch.manual_seed(cfg.seed)
    with ctx.stage("invert"):
        x, _, stats = synthesize(teachers, ctx, cfg)
    # each teacher labels every pseudo-image: in its evaluation form (the same logits, faster)
    committee = (
        (cfg.committee, torch.Generator().manual_seed(cfg.seed + 2)) if cfg.committee else None
    )
    with ctx.stage("label"):
        parts = [x, mixes_of(x, cfg.seed)] if cfg.mix else [x]
        labels = labels_of(Teachers(teachers), parts, cfg, ctx.device, committee=committee)
        x, labels = torch.cat(parts), torch.cat(labels)
    spec, student = ctx.student(cfg.student)
    with ctx.stage("distill"):
        history = distill(
            student,
            x,
            labels,
            tau=cfg.tau,
            epochs=cfg.epochs,
            lr=cfg.lr,
            batch_size=cfg.batch_size * (2 if cfg.mix else 1),
            seed=cfg.seed,
            device=ctx.device,
            progress=ctx.progress,
        )
    info = {
        "teachers": stats,
        "mixes": len(x) // 2 if cfg.mix else 0,
        "synthetic_per_class": torch.bincount(labels.argmax(1), minlength=ctx.num_classes).tolist(),
        "loss_history": history,
    }
    return FusionResult(student, spec, info)


METHOD = Method(
    name="pfedzkd",
    description="Multi-ZSKD: invert each classifier from noise, distil all teachers' consensus",
    paper="Yang et al., pFedZKD, Appl. Sci. 2026",
    consumes=("classifier",),
    needs_modules=True,  # pseudo-images are optimised through each teacher
    teacher_cost=TEACHER_COST,
    config_cls=PFedZKDConfig,
    fuse=fuse,
    references=pfedzkd_table2((87.58, 94.54, 95.82))
    + pfedzkd_table2((70.52, 77.05, 83.98), "fmnist"),
    # the paper's pseudo-samples alone, as many as its Sec. 4.1
    budgets={"paper": {"mix": False, "bn": 0.0, "synthetic": 4_000, "balance": 0.0}},
)
