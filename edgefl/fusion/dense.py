"""DENSE (Zhang et al., NeurIPS 2022; baseline in shared/papers/fedhydra.txt and fedmho.txt).

Data-free one-shot fusion of classifiers of any architectures. Per epoch:
1. train the server generator `gen_steps` steps on one fixed (z, y) batch with
   ce * CE(ensemble(x), y) + bn * BN-statistics loss (teachers that have BatchNorm)
   + adv * (-KL(ensemble || student)), the last only on samples where student and ensemble
   agree (DENSE's indicator: push the generator towards the student's decision boundary);
2. add the batches and their ensemble logits to the synthetic pool (teachers never change, so
   their logits are computed once). DENSE pools the last step's batch only; by default every
   step's batch joins the pool with the logits its generator step already computed: T_G times
   the synthetic data for no extra teacher pass (65 -> 75% on MNIST Dir(0.5) at the same
   generator budget, in less time: bench/results/datafree_diagnosis.md);
3. distill the student on the pool with KL at temperature T (T = 20 in DENSE).
The ensemble is the plain mean of the teachers' logits (DENSE's), or with `combine=probabilities`
the log of the mean of their softmax outputs (a teacher's vote bounded whatever its logits' scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from edgefl.fusion.averaging import COMBINES, combine_outputs
from edgefl.fusion.base import (
    FusionContext,
    FusionResult,
    Method,
    fedhydra_table1,
    fedmho_table3,
    pfedzkd_table2,
)
from edgefl.fusion.caps import COMMITTEE_HELP, check_committee
from edgefl.fusion.generator import (
    PAPER_GENERATOR,
    BNStatLoss,
    GeneratorConfig,
    committee,
    first_student,
    kl_at,
    make_generator,
    sample_noise,
    seeded_teachers,
    set_trainable,
    teacher_forward,
)
from edgefl.fusion.inversion import (
    GENERATOR_SMOOTH_HELP,
    excess_roughness,
    smooth_from_option,
)
from edgefl.fusion.options import option
from edgefl.fusion.student import descend, pool_batches, student_jitter
from edgefl.models.augment import jitter


@dataclass(frozen=True)
class DenseConfig(GeneratorConfig):
    """The shared generator defaults, plus DENSE's T = 20 for distillation and its agreement
    mask on the adversarial term. On 2 cores DENSE keeps its paper's T_G = 30 steps per noise
    batch and takes fewer epochs: with 5 steps a batch's images stay unfinished and the student
    learns from them (MNIST Dir(0.1): 44% with 30 x 5, 51% with 10 x 30, at about the same
    cost; bench/results/datafree_diagnosis.md)."""

    epochs: int = option(10, "epochs: generator steps, then distillation (paper: 200)", low=1)
    gen_steps: int = option(30, "generator steps per epoch (T_G; paper: 30)", low=1)

    temperature: float = option(
        20.0, "distillation temperature T (DENSE: 20)", low=0, low_open=True
    )
    kd_steps: int = option(0, "student steps per epoch; 0 = one pass over the pool", low=0)
    pool_every_step: bool = option(
        True, "pool every generator step's batch (false: only the last, as DENSE's code)"
    )
    adv_mask: bool = option(
        True, "adversarial term only where student and ensemble agree (DENSE's indicator)"
    )
    committee: int = option(0, COMMITTEE_HELP, low=0)
    combine: str = option(
        "logits",
        "the teachers' ensemble: logits (their mean logit, DENSE's) or probabilities (the mean "
        "of their softmax outputs)",
        choices=COMBINES,
    )
    # FedHydra's Fashion prior (0.02 past real garments' roughness; +2.6 there) leaves DENSE level:
    # +0.02 +- 0.33 over seven Table 1 cells (bench/results/fashion_dense_smooth.md). Off.
    smooth: float = option(
        0.0,
        GENERATOR_SMOOTH_HELP,
        low=0,
    )
    smooth_from: float | None = smooth_from_option()

    def __post_init__(self) -> None:
        super().__post_init__()
        check_committee(self)


# What grows with each classifier teacher (max_teachers caps them).
TEACHER_COST = "every generator step forwards every teacher"


def fuse(ctx: FusionContext, cfg: DenseConfig) -> FusionResult:
    uploads, teachers = seeded_teachers(ctx, cfg, TEACHER_COST)
    dev = ctx.device
    rng = torch.Generator().manual_seed(cfg.seed)
    bn = BNStatLoss(teachers)
    spec, student, start = first_student(ctx, cfg, uploads, "dense")
    gen = make_generator(cfg.nz, cfg.ngf, ctx.input_shape, cfg.seed, dev)
    opt_g = torch.optim.Adam(gen.parameters(), lr=cfg.gen_lr)
    opt_s = torch.optim.SGD(student.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    pool_x: list[torch.Tensor] = []
    pool_t: list[torch.Tensor] = []
    hist: dict[str, list[float]] = {k: [] for k in ("generator", "ce", "bn", "adv", "distill")}

    ctx.progress("epoch", 0, cfg.epochs)
    for epoch in range(cfg.epochs):
        z, y = sample_noise(rng, cfg.batch_size, cfg.nz, ctx.num_classes, dev)
        set_trainable(student, False)
        with ctx.stage("generator"):
            pooled, losses = _generator_epoch(
                gen, opt_g, z, y, teachers, bn, student, cfg, dev, rng
            )
        pool_x += [x for x, _ in pooled]
        pool_t += [t for _, t in pooled]
        for k, v in zip(("generator", "ce", "bn", "adv"), losses, strict=True):
            hist[k].append(float(v.detach()))

        set_trainable(student, True)
        with ctx.stage("distill"):
            hist["distill"].append(_distill(student, opt_s, pool_x, pool_t, rng, cfg))
        ctx.progress(
            "epoch",
            epoch + 1,
            cfg.epochs,
            f"generator {hist['generator'][-1]:.4f} (bn {hist['bn'][-1]:.4f}), "
            f"distill {hist['distill'][-1]:.4f}",
        )
    bn.remove()
    student.eval()
    info = {
        "teachers": [u.client_id for u in uploads],
        "bn_teachers": [uploads[k].client_id for k in bn.with_bn],
        "synthetic_pool": sum(len(p) for p in pool_x),
        "loss_history": hist,
        "student_start": start,
    }
    return FusionResult(student, spec, info)


def _generator_epoch(gen, opt_g, z, y, teachers, bn, student, cfg: DenseConfig, dev, rng):
    """T_G generator steps on one noise batch -> ((images, ensemble logits) to pool, the last
    step's losses: total, CE, BN, adversarial). With a committee, each step's ensemble is a
    random `cfg.committee` of the teachers'."""
    pooled = []
    for _ in range(cfg.gen_steps):
        x = gen(z)
        members = committee(teachers, cfg.committee, rng)
        ens = combine_outputs(teacher_forward(members, x, bn), cfg.combine)
        l_ce = F.cross_entropy(ens, y)
        l_bn = bn.value(dev)
        s = student(x)
        kl = kl_at(ens, s, reduction="none")
        agree = (s.argmax(1) == ens.argmax(1)).float() if cfg.adv_mask else 1.0
        l_adv = -(kl * agree).mean()
        loss = cfg.ce_weight * l_ce + cfg.bn_weight * l_bn + cfg.adv_weight * l_adv
        if cfg.smooth:
            loss = loss + cfg.smooth * excess_roughness(x, cfg.smooth_from).mean()
        if cfg.pool_every_step:  # x and ens come before this step's update: a pair
            pooled.append((x.detach(), ens.detach()))
        descend(opt_g, loss, "the DENSE generator", rate="gen_lr")
    if not cfg.pool_every_step:
        with torch.no_grad():
            x = gen(z)
            members = committee(teachers, cfg.committee, rng)
            pooled.append((x, combine_outputs(teacher_forward(members, x), cfg.combine)))
    return pooled, (loss, l_ce, l_bn, l_adv)


def _distill(student, opt, pool_x, pool_t, rng: torch.Generator, cfg: DenseConfig) -> float:
    x, t = torch.cat(pool_x), torch.cat(pool_t)
    batches = pool_batches(len(x), cfg.batch_size, cfg.kd_steps, rng)
    total = 0.0
    for idx in batches:
        idx = idx.to(x.device)
        loss = kl_at(
            t[idx],
            student(jitter(x[idx], student_jitter(cfg.augment, x.shape[1:]), rng)),
            cfg.temperature,
        )
        total += descend(opt, loss)
    return total / len(batches)


METHOD = Method(
    name="dense",
    description="data-free: a generator trained against the classifier ensemble "
    "(CE + BN statistics + adversarial), the ensemble distilled at T=20 on its samples",
    paper="Zhang et al., DENSE, NeurIPS 2022",
    consumes=("classifier",),
    needs_modules=True,  # the generator backpropagates through the teachers
    teacher_cost=TEACHER_COST,
    config_cls=DenseConfig,
    fuse=fuse,
    references=fedmho_table3((90.51, 86.12, 73.76))
    + fedmho_table3((72.29, 68.14, 56.12), "fmnist")
    + pfedzkd_table2((75.92, 85.54, 92.54))
    + pfedzkd_table2((58.00, 69.13, 74.02), "fmnist")
    + fedhydra_table1((77.86, 76.78, 36.73, 11.17))
    + fedhydra_table1((74.20, 72.79, 43.26, 41.65), "fmnist"),
    budgets={"paper": PAPER_GENERATOR | {"pool_every_step": False}},
)
