"""Co-Boosting (Dai et al., "Enhancing One-Shot Federated Learning Through Data and Ensemble
Co-Boosting", ICLR 2024, arXiv 2402.15070; a DENSE extension in shared/notes/methods.md).

Data-free one-shot fusion of classifiers of any architectures, in which the synthetic data and
the ensemble improve each other. The ensemble is a weighted sum of the teachers' logits,
A_w(x) = sum_k w_k f_k(x), w starting at 1/K (`combine=probabilities`: the log of
sum_k w_k softmax(f_k(x)), each teacher's vote bounded). Per epoch t:
1. hard samples: the generator takes `gen_steps` steps on one (z, y) batch with
   L_H - adv * KL(A_w(x) || S(x)), where L_H = mean of -(1 - p_y)^gamma log p_y, p = softmax(A_w(x))
   (cross-entropy that weighs most the samples the ensemble finds hard: focal weighting), and
   the KL term pushes the samples to where the server model S still disagrees with the
   ensemble. The batches join the pool with each teacher's logits and their target y.
2. ensemble enhancement: the weights take a sign-gradient step of size mu * decay^t that lowers
   CE(A_w(x), y) over the whole pool, and are projected back onto the constraint
   (`weight_constraint`: each w_k in [0, 1], or the simplex).
   Teachers never change, so A_w on a pooled sample is a weighted sum of stored logits: this
   step costs no teacher pass.
3. distillation on the whole pool: each batch is first diversified on the fly (output-
   diversified sampling: one step of size eps along sign grad_x r . softmax(A_w(x)/T), r drawn
   uniformly in [-1, 1]^C per sample; the perturbed samples stay hard for the current ensemble
   and differ every epoch), then S learns KL(A_w(x')/T || S(x')/T) with the current weights.

What edgefl adds or leaves out, each an option: by default every generator step's batch joins
the pool (DENSE's `pool_every_step`, measured there: more samples for no teacher pass; the
paper pools each epoch's final batch, the `paper` budget); the pool keeps at most `pool_size`
samples (a uniform sample of all made, generator.ReplayPool), which bounds memory and each
epoch's distillation; the generator is trained on, not re-initialised, each epoch (the
authors' code re-initialises it: `--budget code`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch.nn import functional as F

from edgefl.fusion.averaging import COMBINES, combine_outputs
from edgefl.fusion.base import (
    FusionContext,
    FusionResult,
    Method,
    Reference,
    fedhydra_table1,
    fedmho_table3,
)
from edgefl.fusion.caps import COMMITTEE_HELP, check_committee
from edgefl.fusion.generator import (
    PAPER_GENERATOR,
    BNStatLoss,
    GeneratorConfig,
    ReplayPool,
    draw_committee,
    first_student,
    kl_at,
    make_generator,
    sample_noise,
    seeded_teachers,
    set_trainable,
    teacher_forward,
)
from edgefl.fusion.options import option
from edgefl.fusion.student import descend, pool_batches, student_jitter
from edgefl.models.augment import jitter

CONSTRAINTS = ("box", "simplex")


@dataclass(frozen=True)
class CoBoostingConfig(GeneratorConfig):
    """The shared generator defaults, with DENSE's cpu schedule (10 epochs of T_G = 30 steps on
    one noise batch: fewer steps leave a batch unfinished) and Co-Boosting's own knobs. Values
    marked (code) are the authors' public code's (rong-dai/Co-Boosting, datafree_kd.py), which
    the paper's experiments ran: T = 4, gamma = 1, mu = 0.01 decaying by 0.99 an epoch,
    eps = 8/255, no BatchNorm-statistics term."""

    epochs: int = option(
        10, "epochs: generator steps, weights, then distillation (paper: 200)", low=1
    )
    gen_steps: int = option(30, "generator steps per epoch (T_G; paper: 30)", low=1)
    batch_size: int = option(
        64,
        "samples synthesised per step, and the distillation batch (paper: 128, the authors' code)",
        low=1,
    )
    ce_weight: float = option(1.0, "generator loss: weight of L_H, the hard-sample CE", low=0)
    temperature: float = option(
        4.0,
        "distillation temperature T, also of the diversifying step's softmax (code: 4)",
        low=0,
        low_open=True,
    )
    bn_weight: float = option(
        0.0,
        "generator loss: weight of the BatchNorm-statistics term (Co-Boosting has none: 0)",
        low=0,
    )
    # Co-Boosting's own diversification of the pooled samples is `ods_eps` (`augment`, the
    # shared jitter, stays off by default as for every generator method).
    hard_gamma: float = option(
        1.0, "L_H: focal exponent gamma on (1 - p_y) (0: plain CE; code: 1)", low=0
    )
    # 10 cpu epochs of the code's mu = 0.01 move a weight by at most 0.1 in all: 0.05 lets
    # the ensemble enhancement act within the cpu budget (the paper budget keeps 0.01).
    weight_lr: float = option(
        0.05, "ensemble weights: sign-gradient step mu (0: plain average; code: 0.01)", low=0
    )
    # Each weight starts at 1/m: a step of mu = 0.05 is 25% of it for the papers' 5 teachers
    # (their federations hold 5-10 clients) and 100x it for 2,000, where one sign step set a
    # random half of the weights to 0 and the rest to 0.05 (17.76 % on the 10,000-upload
    # federation's 2,000 teachers, each alone 26.78 % on average).
    weight_ref: int = option(
        10,
        "ensemble weights: weight_lr is the step for up to this many teachers; with m more it "
        "is weight_lr * weight_ref / m, the same fraction of a weight's start 1/m (0: weight_lr "
        "at any m, the code's)",
        low=0,
    )
    weight_steps: int = option(
        1, "ensemble weights: sign-gradient steps per epoch, each on the whole pool's CE", low=0
    )
    weight_decay: float = option(
        0.99, "ensemble weights: mu shrinks by this factor each epoch", low=0, low_open=True, high=1
    )
    # With one fixed step a weight near its best steps over it and back every epoch: on
    # Fashion (Table 3, Dir(0.1)) teachers went 0.05 -> 0.0005 -> 0.05, silenced every other
    # epoch, and the student's test accuracy alternated with them (seed 2: 54-56 % after odd
    # epochs, 47-49 % after even ones, and 40 epochs end on an even one).
    weight_adapt: bool = option(
        True,
        "ensemble weights: each weight's step halves when its gradient changes sign and grows "
        "x1.2 (up to mu) while it keeps it (Rprop's rule); false: every step mu (the paper)",
    )
    weight_floor: float = option(
        0.0,
        "ensemble weights: none below this fraction of the even weight 1/K after a step, so no "
        "teacher is silenced for good (0: the paper)",
        low=0,
        high=1,
    )
    weight_constraint: str = option(
        "box",
        "ensemble weights after each step: box (each w_k in [0, 1], the authors' code) or "
        "simplex (w_k >= 0 summing to 1: only the mixture moves, never the logits' scale)",
        choices=CONSTRAINTS,
    )
    ods_eps: float = option(
        8 / 255,
        "diversifying step size on the [0, 1] input scale before "
        "distillation (0: off; code: 8/255)",
        low=0,
    )
    pool_every_step: bool = option(
        True, "pool every generator step's batch (false: each epoch's final batch, the paper)"
    )
    pool_size: int = option(
        50_000, "most synthetic samples kept (a uniform sample of all made)", low=1
    )
    # One pass over the whole pool each epoch, each batch diversified (a teacher forward and
    # backward, then a forward), cost 5x DENSE on MNIST (352 s of 433 s distilling, Dir(0.5)
    # seed 0, loaded 2 cores): the cpu budget takes 60 steps an epoch (twice the new samples).
    kd_steps: int = option(60, "student steps per epoch; 0 = one pass over the pool (paper)", low=0)
    reset_generator: bool = option(
        False, "re-initialise the generator each epoch (the authors' code does)"
    )
    # With a committee the pool keeps each sample's committee and its logits (not every
    # teacher's: 2,000 teachers x 50,000 samples would be 4 GB), and the weights of a sample's
    # ensemble are its committee's.
    committee: int = option(0, COMMITTEE_HELP, low=0)
    combine: str = option(
        "logits",
        "the teachers' ensemble A_w: logits (a weighted mean of logits, the paper's) or "
        "probabilities (a weighted mean of their softmax outputs)",
        choices=COMBINES,
    )
    # At 2,000 teachers with a committee of 64, the diversifying step (a committee's forward
    # and backward per distillation batch) took 488 of 805 s and its targets, each batch's
    # fresh committee, gave 27.92 %; from the pool's stored logits: 319 s, 40.75 %. A weight
    # is then judged on the pooled samples whose committee held its teacher, ~64/2,000 of
    # them, too few for a sign step: with the weights' steps 40.75 and 37.22 % (seeds 0, 1),
    # without them (the plain average) 45.02 % on the mean of three seeds, against 45.43 %
    # with every one of 500 teachers and no steps (44.15 % with them, seed 0)
    # (bench/results/datafree_committee_10k_coboosting_seeds.md).
    AT_SCALE: ClassVar[tuple[str, ...]] = ("ods_eps=0", "weight_lr=0")
    # With those, a committee of 64 stayed 0.4 points under every teacher of 500 (mean of three
    # seeds); 128 (its generator steps checkpointed) gave 3-5 points over, seed by seed, in 364 s
    # and 2.5 GiB (bench/results/datafree_committee_10k_coboosting_committee128.md).
    COMMITTEE_AT_SCALE: ClassVar[int] = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        check_committee(self)


def weighted_ensemble(logits: torch.Tensor, w: torch.Tensor, how: str = "logits") -> torch.Tensor:
    """A_w: (m, b, c) teacher logits and (m,) weights -> (b, c), divided by the weights' sum
    as the authors' code does (its WEnsemble): the weights choose the mixture, never the
    logits' scale. Without it, sign steps in the box shrank every weight together (Fashion
    Dir(0.5), wider clients: their sum 1.0 -> 0.31, the targets' logits x0.31 at T=4, and the
    student 27 points under the ensemble it distilled). `how`: `combine_outputs`'."""
    if how == "logits":
        return torch.einsum("mbc,m->bc", logits, w) / w.sum().clamp_min(1e-12)
    return combine_outputs(logits, how, w[:, None, None])


def pooled_ensemble(logits: torch.Tensor, w: torch.Tensor, members=None, how="logits"):
    """A_w on pooled samples: `logits` (n, m, c) of every teacher, or with `members` (n, k),
    each sample's committee, (n, k, c) of its committee's, weighted by their own weights."""
    if members is None:
        return weighted_ensemble(logits.transpose(0, 1), w, how)
    wk = w[members]
    if how == "logits":
        return torch.einsum("nkc,nk->nc", logits, wk) / wk.sum(1, keepdim=True).clamp_min(1e-12)
    return combine_outputs(logits, how, wk[..., None], dim=1)


def hard_ce(logits: torch.Tensor, y: torch.Tensor, gamma: float) -> torch.Tensor:
    """L_H: mean over the batch of -(1 - p_y)^gamma log p_y, p = softmax(logits)."""
    logp = F.log_softmax(logits, 1).gather(1, y[:, None]).squeeze(1)
    return (-((1 - logp.exp()) ** gamma) * logp).mean()


def project(w: torch.Tensor, constraint: str) -> torch.Tensor:
    """The nearest point of the constraint set (Euclidean): the box [0, 1]^m, or the simplex
    {w >= 0, sum w = 1} (sort-and-threshold, Held et al. 1974 / Duchi et al. 2008)."""
    if constraint == "box":
        return w.clamp(0.0, 1.0)
    u = torch.sort(w, descending=True).values
    css = u.cumsum(0) - 1
    k = torch.arange(1, len(w) + 1, dtype=w.dtype, device=w.device)
    rho = int(torch.nonzero(u - css / k > 0).max())
    return (w - css[rho] / (rho + 1)).clamp_min(0.0)


def weight_step(cfg: CoBoostingConfig, teachers: int) -> float:
    """The sign step mu for `teachers` ensemble weights (`weight_ref`)."""
    if cfg.weight_ref and teachers > cfg.weight_ref:
        return cfg.weight_lr * cfg.weight_ref / teachers
    return cfg.weight_lr


class SignSteps:
    """The weights' sign-step sizes across epochs. Fixed (`adapt` false): mu * decay^t for every
    weight, the paper's. Adapted: each weight's own size, halved when its gradient's sign flips
    and grown by 1.2 while it holds, never above mu * decay^t (Rprop's rule, Riedmiller & Braun
    1993): a weight that keeps stepping over its best comes to rest there. Not torch.optim.Rprop:
    it skips the step after a flip and caps every size at one fixed maximum, where this cap
    decays with mu each epoch and the projection follows each step."""

    def __init__(self, adapt: bool):
        self.adapt = adapt
        self.size: torch.Tensor | None = None
        self.last: torch.Tensor | None = None

    def __call__(self, sign: torch.Tensor, cap: float) -> torch.Tensor:
        if not self.adapt:
            return cap * sign
        if self.size is None:
            self.size = torch.full_like(sign, cap)
        else:
            flipped = sign * self.last < 0
            self.size = torch.where(flipped, self.size * 0.5, (self.size * 1.2).clamp_max(cap))
        self.last = sign
        return self.size * sign


def enhance_weights(
    w,
    logits,
    y,
    *,
    step: float,
    steps: int,
    constraint: str,
    members=None,
    sizes=None,
    floor=0.0,
    combine="logits",
):
    """`steps` projected sign-gradient steps w <- P(w - step * sign(grad_w CE(A_w(x), y))) on the
    whole pool; `logits` are its stored teacher logits (`pooled_ensemble`). With `sizes` (a
    SignSteps) each weight's step is its own, `step` their cap. Returns w and the CE before."""
    ce = None
    sizes = sizes or SignSteps(adapt=False)
    for _ in range(steps):
        w = w.detach().requires_grad_(True)
        loss = F.cross_entropy(pooled_ensemble(logits, w, members, combine), y)
        (grad,) = torch.autograd.grad(loss, [w])
        w = project(w.detach() - sizes(grad.sign(), step), constraint)
        if floor:
            w = w.clamp_min(floor / len(w))
        ce = float(loss.detach()) if ce is None else ce
    return w, ce


def diversify(teachers, x, w, eps: float, temperature: float, rng, combine="logits"):
    """Output-diversified sampling: x + eps * sign(grad_x r . softmax(A_w(x) / T)), r ~ U[-1, 1]
    per sample and class, kept in [0, 1]. Only x gets a gradient (the teachers are frozen)."""
    x = x.detach().requires_grad_(True)
    p = F.softmax(weighted_ensemble(teacher_forward(teachers, x), w, combine) / temperature, 1)
    r = (torch.rand(p.shape, generator=rng) * 2 - 1).to(p.device)
    (grad,) = torch.autograd.grad((r * p).sum(), [x])
    return (x.detach() + eps * grad.sign()).clamp(0.0, 1.0)


# What grows with each classifier teacher (max_teachers caps them).
TEACHER_COST = "every generator step forwards every teacher"


def fuse(ctx: FusionContext, cfg: CoBoostingConfig) -> FusionResult:
    uploads, teachers = seeded_teachers(ctx, cfg, TEACHER_COST)
    dev = ctx.device
    rng = torch.Generator().manual_seed(cfg.seed)
    bn = BNStatLoss(teachers) if cfg.bn_weight else None
    spec, student, start = first_student(ctx, cfg, uploads, "coboosting")
    opt_s = torch.optim.SGD(student.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    w = torch.full((len(teachers),), 1.0 / len(teachers), device=dev)
    pool = ReplayPool(cfg.pool_size)
    sizes = SignSteps(cfg.weight_adapt)
    augment = student_jitter(cfg.augment, ctx.input_shape)
    hist: dict[str, list] = {
        k: [] for k in ("generator", "hard_ce", "adv", "weights_ce", "distill", "weights")
    }
    gen = opt_g = None

    ctx.progress("epoch", 0, cfg.epochs)
    for epoch in range(cfg.epochs):
        if gen is None or cfg.reset_generator:
            gen = make_generator(cfg.nz, cfg.ngf, ctx.input_shape, cfg.seed + epoch, dev)
            opt_g = torch.optim.Adam(gen.parameters(), lr=cfg.gen_lr)
        z, y = sample_noise(rng, cfg.batch_size, cfg.nz, ctx.num_classes, dev)
        set_trainable(student, False)
        with ctx.stage("generator"):  # 1. hard samples for the current ensemble and student
            losses = _generator_epoch(gen, opt_g, z, y, teachers, bn, w, student, pool, rng, cfg)
        for k, v in zip(("generator", "hard_ce", "adv"), losses, strict=True):
            hist[k].append(float(v.detach()))

        with ctx.stage("weights"):  # 2. the ensemble re-weighted on the hard samples
            _, pool_logits, pool_y, members = _pooled(pool)
            step = weight_step(cfg, len(teachers)) * cfg.weight_decay**epoch
            w, ce = enhance_weights(
                w,
                pool_logits,
                pool_y,
                step=step,
                steps=cfg.weight_steps,
                constraint=cfg.weight_constraint,
                members=members,
                sizes=sizes,
                floor=cfg.weight_floor,
                combine=cfg.combine,
            )
            hist["weights_ce"].append(ce)
            hist["weights"].append([round(float(v), 6) for v in w])

        set_trainable(student, True)
        with ctx.stage("distill"):  # 3. the student on the whole pool, diversified
            hist["distill"].append(_distill(student, opt_s, teachers, pool, w, rng, augment, cfg))
        ctx.progress(
            "epoch",
            epoch + 1,
            cfg.epochs,
            f"generator {hist['generator'][-1]:.4f}, weights {_said(hist['weights'][-1])}, "
            f"distill {hist['distill'][-1]:.4f}",
        )
    if bn is not None:
        bn.remove()
    return FusionResult(student.eval(), spec, _info(uploads, hist, pool) | {"student_start": start})


def _said(weights: list[float]) -> str:
    """The weights for a progress line: all of a few, the range of many."""
    if len(weights) <= 10:
        return str(weights)
    return f"{min(weights):.4f}-{max(weights):.4f} over {len(weights):,} teachers"


def _pooled(pool: ReplayPool):
    """(images, logits, target labels, each sample's committee or None) the pool holds."""
    x, (logits, y, *members) = pool.contents()
    return x, logits, y, (members[0] if members else None)


def _info(uploads, hist, pool: ReplayPool) -> dict:
    ids = [u.client_id for u in uploads]
    return {
        "teachers": ids,
        "ensemble_weights": dict(zip(ids, hist["weights"][-1], strict=True)),
        "synthetic_pool": pool.size,
        "synthetic_made": pool.seen,
        "loss_history": hist,
    }


def _generator_epoch(gen, opt_g, z, y, teachers, bn, w, student, pool, rng, cfg):
    """T_G generator steps on one noise batch, each step's images (or the last's) joining the
    pool with their teachers' logits; returns the last step's losses (total, hard CE, adv)."""
    dev = z.device
    for step in range(cfg.gen_steps):
        x = gen(z)
        members = draw_committee(len(teachers), cfg.committee, rng)
        if members is None:
            logits = teacher_forward(teachers, x, bn)
            ens = weighted_ensemble(logits, w, cfg.combine)
            kept = (logits.detach().transpose(0, 1), y)
        else:
            logits = teacher_forward([teachers[k] for k in members], x, bn)
            ens = weighted_ensemble(logits, w[members], cfg.combine)
            chosen = torch.tensor(members, device=dev).expand(len(x), -1)
            kept = (logits.detach().transpose(0, 1), y, chosen)
        l_h = hard_ce(ens, y, cfg.hard_gamma)
        l_adv = -kl_at(ens, student(x))
        loss = cfg.ce_weight * l_h + cfg.adv_weight * l_adv
        if bn is not None:
            loss = loss + cfg.bn_weight * bn.value(dev)
        if cfg.pool_every_step or step == cfg.gen_steps - 1:
            # x and its logits come before this step's update: a pair
            pool.add(x.detach(), kept, rng)
        descend(opt_g, loss, "the Co-Boosting generator", rate="gen_lr")
    return loss, l_h, l_adv


def _distill(student, opt, teachers, pool, w, rng, augment: str, cfg: CoBoostingConfig) -> float:
    x_all, logits_all, _, members = _pooled(pool)
    batches = pool_batches(len(x_all), cfg.batch_size, cfg.kd_steps, rng)
    total = 0.0
    for idx in batches:
        idx = idx.to(x_all.device)
        x = x_all[idx]
        if cfg.ods_eps:  # a fresh committee for each batch (every teacher without one)
            drawn = draw_committee(len(teachers), cfg.committee, rng)
            some = teachers if drawn is None else [teachers[k] for k in drawn]
            wk = w if drawn is None else w[drawn]
            x = diversify(some, x, wk, cfg.ods_eps, cfg.temperature, rng, cfg.combine)
            with torch.no_grad():
                target = weighted_ensemble(teacher_forward(some, x), wk, cfg.combine)
        else:  # the stored logits: no teacher pass
            chosen = None if members is None else members[idx]
            target = pooled_ensemble(logits_all[idx], w, chosen, cfg.combine)
        loss = kl_at(target, student(jitter(x, augment, rng)), cfg.temperature)
        total += descend(opt, loss)
    return total / max(1, len(batches))


def _fedhydra_tables() -> tuple[Reference, ...]:
    """FedHydra's Table 1 (MNIST, 5 clients, Dirichlet) and Table 2 (two classes a client)."""
    table1 = fedhydra_table1((86.76, 83.47, 44.76, 29.11)) + fedhydra_table1(
        (75.89, 72.91, 47.20, 42.38), "fmnist"
    )
    return (
        *table1,
        Reference("mnist", 5, "classes:2", 26.05, "FedHydra paper, Table 2"),
        Reference("fmnist", 5, "classes:2", 18.22, "FedHydra paper, Table 2"),
    )


METHOD = Method(
    name="coboosting",
    description="data-free: hard samples from a generator against the weighted ensemble and "
    "the student, ensemble weights re-learned on them each epoch, the student distilled on "
    "the whole diversified pool",
    paper="Dai et al., Co-Boosting, ICLR 2024 (arXiv 2402.15070)",
    consumes=("classifier",),
    needs_modules=True,  # the generator and the diversifying step backpropagate through them
    teacher_cost=TEACHER_COST,
    config_cls=CoBoostingConfig,
    fuse=fuse,
    references=fedmho_table3((91.42, 89.27, 81.30))
    + fedmho_table3((72.98, 69.50, 61.73), "fmnist")
    + _fedhydra_tables(),
    # The experiments' settings as the authors' code runs them (co_boosting.sh): 200 epochs of
    # T_G = 30 steps on batches of 128, DENSE's 64-channel generator, the final batch pooled.
    budgets={
        "paper": PAPER_GENERATOR
        | {
            "batch_size": 128,
            "pool_every_step": False,
            "weight_lr": 0.01,
            "kd_steps": 0,
            "weight_adapt": False,
        },
        "code": {"reset_generator": True, "weight_ref": 0},
    },
    divergences=(
        "Past weight_ref (10) teachers the weights' sign step shrinks as weight_ref / m, the "
        "same fraction of each weight's start 1/m; the code's step is mu at any m (--budget "
        "code). Every recorded run had at most 10 teachers.",
        "The code takes one weight step per pool batch (the pool grows by one batch an epoch, "
        "so epoch t takes t steps); edgefl takes `weight_steps` steps on the whole pool's CE, "
        "which does not change with how many batches are pooled.",
        "The authors' code (rong-dai/Co-Boosting, datafree/synthesis/coboost.py) re-initialises "
        "the generator every epoch and optimises the noise z along with it; --budget code "
        "re-initialises the generator (z stays fixed).",
        "The code pools the lowest-loss batch of an epoch's T_G steps; edgefl pools the final "
        "one (paper budget) or every step's (cpu).",
        "The code's ensemble-weight step clamps each weight to [0, 1] and to within 1 of its "
        "value before the epoch (never binding in [0, 1]); edgefl's box constraint is [0, 1].",
    ),
)
