"""FedHydra (shared/papers/fedhydra.txt): data-free one-shot fusion that weighs each client's
predictions by how well it knows each class.

1. Model stratification (MS, Alg. 2): for every client k and class j, a fresh generator is trained
   T_G steps to make client k alone classify its output as j; from the CE losses L_kj of those
   steps, u_kj = (max L_kj - min L_kj) / min L_kj (Eq. 2). U is (classes x clients); U_r
   normalises each class's row over clients (Eq. 4-5), U_c each client's column over classes
   (Eq. 6-7).
2. Stratified aggregation (SA, Alg. 3): for a batch with target labels y, client k's prediction
   is weighted per class by U_c[:, k] (Eq. 8) and the clients are mixed per sample by
   U_r[y_i, :] (Eq. 9-11).
3. HASA (Alg. 1), per epoch: the generator takes T_G steps on one (z, y) batch with
   CE(P, y) + l1 * BN loss + l2 * (-KL(P || student)) (Eq. 16); then the student distills on all of
   those T_G intermediate batches ("leverages all generated intermediates", Sec. 2) with
   KL(P || student) + beta * CE(student, argmax P) (Eq. 19).

Where the paper, taken literally, breaks (measured in bench/results/datafree_diagnosis.md;
tests/fusion/test_datafree.py has a test for each):
- Eq. 8-11 weigh raw logits. A classifier's logits are defined only up to an additive constant
  per sample (softmax(z) = softmax(z + a)), and multiplying class j's logit by a weight w_j turns
  that constant into a class-dependent shift a * w_j: the aggregate's argmax then depends on an
  arbitrary offset (the bias of each teacher's last layer), and weights that sum to 1 over c
  classes also shrink the logits ~c-fold. The weights are applied here to what a client actually
  states, its class probabilities: P = log of the normalised mixture
  sum_k U_r[y_i, k] * (softmax(P_k) * U_c[:, k]).
- Eq. 2's u = max/min - 1 diverges as min L -> 0, which happens for every class a client knows,
  at a speed set by the generator's steps and learning rate rather than by the client's
  knowledge: between classes one client knows equally well u spans 400x on MNIST, and Eqs. 4
  and 6 normalise linearly, so the weights follow those accidents. The guidance is measured on
  the log scale, log(max / min) = log(1 + u) (the e-folds the loss fell): the same ordering as
  Eq. 2, on a scale where equal knowledge gives comparable weights (`guidance_scale ratio` is
  the literal Eq. 2).
- Distilled on one epoch's batches only, the student forgets the earlier ones and collapses
  (81% -> 58% over 60 epochs on MNIST; the paper's Sec. 4.2.1 reports such collapse). Each
  student step also rehearses as many earlier intermediates, a uniform sample of all generated
  so far (Sec. 2: FedHydra "leverages all generated intermediates"), and the student with the
  best agreement on held-out synthetic images is kept.
- On sensor windows (bench/results/datafree_hapt.md): Eq. 6 passes a class factor every client
  shares into U_c, a class prior no client stated, so U_c is built from each class's guidance
  relative to the clients' mean (`stratification_weights`); a batch is distilled only once the
  aggregate takes most of it for its targets (`finish`); synthetic windows are not jittered
  (`augment`: the teachers never labelled a turned sample at their decision boundaries).
- Alg. 2 measures how easily a generator turns each client to each class. Under label skew
  that is who holds the class; where every client holds every class alike (HAPT users) it is
  something else, reliably (split-half 0.63-0.96), and weighting by it cost 2.5 points on the
  mean and 8.5 on one seed (bench/results/datafree_hapt_fedhydra.md). Alg. 2 runs when the
  teachers' declared label counts differ (`min_label_skew`); otherwise every client is
  weighted alike; the paper budget always stratifies. `mix` also distils mixes of each batch
  labelled like the batch (24 epochs with them cost ~2x 30 without; the paper budget has none).
- Eq. 19 distils P, which depends on the label y the generator aimed at, through V(y) (Eq. 10);
  the student never sees y. Under strong skew V(y) is one or two holders of y, who cannot tell
  y from the classes they lack, so an image between y and another class is taught as y because
  it was drawn for y. The generator still follows SA (it aims at y through y's holders); the
  student distils each class's probability from the clients that know it (U_c, every row alike:
  `distill_target`), a target of the image alone (bench/results/fashion_fedhydra_targets.md).
  Since the late-student average and the smoothness prior, that holds at moderate skew only:
  where the declared label counts' Cramer's V reaches `target_skew` (Dir(0.1)) Eq. 19's target
  led by 7-17 points, and `by-skew` distils it there
  (bench/results/fedhydra_distill_target_gate_1205.md).
- On images the student's accuracy swings 5-15 points from one epoch to the next, and the
  held-out synthetic images (a few dozen the teachers agree on) pick a late epoch little better
  than chance: the global model is the average of the student's weights over the run's second
  half (`average_from`), unless the late students agree with most of the held-out images
  (`pick_agreement`: on sensor windows they do, and the pick works there; see
  bench/results/fedhydra_average.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, NamedTuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from edgefl.errors import FusionError
from edgefl.fusion.base import FusionContext, FusionResult, Method, fedhydra_table1
from edgefl.fusion.caps import COMMITTEE_HELP, check_committee
from edgefl.fusion.generator import (
    INIT_CHOICES,
    INIT_HELP,
    PAPER_GENERATOR,
    BNStatLoss,
    GeneratorConfig,
    ReplayPool,
    SyntheticValidation,
    WeightAverage,
    draw_committee,
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
from edgefl.fusion.student import descend, pair_mixes, student_jitter
from edgefl.models.augment import jitter

# A client's CE can underflow to exactly 0 when it is extremely confident (float32 softmax);
# Eq. 2 would then divide by zero. Losses are recorded in float64 (0 only for logit gaps > ~700)
# and min L_kj is floored here: u_kj stays finite and very large, i.e. "this client guides class j
# very strongly", which is what a vanishing loss means.
MIN_LOSS_FLOOR = 1e-12


@dataclass(frozen=True)
class FedHydraConfig(GeneratorConfig):
    """The shared generator defaults (the `cpu` budget) plus FedHydra's own; its `paper` budget
    is Sec. 4.1.5 (T_G = 30, T_g = 200 epochs; lambda_1 = bn_weight = lambda_2 = adv_weight = 1
    in both). The paper gives no value for beta, the batch size, momentum or temperature: beta =
    1, b = 256 (DENSE's) in the paper budget, momentum 0.9 (DENSE's student SGD), T = 1 (the
    paper's KL has none). On 2 cores the stratification is shorter and narrower (10 steps of 16
    images) and the student takes 4 passes over each epoch's few batches."""

    strat_steps: int = option(
        10, "stratification steps per (client, class); 0 = gen_steps (paper)", low=0
    )
    strat_batch: int = option(16, "stratification batch size; 0 = batch_size (paper)", low=0)
    beta: float = option(1.0, "weight of CE on the aggregate's hard labels (Eq. 19)", low=0)
    # More passes reuse costly synthetic batches when few generator steps are affordable (CPU).
    distill_passes: int = option(
        4, "student passes over each epoch's T_G intermediate batches (paper: 1)", low=1
    )
    # False keeps only U_r's weighting of clients per target class (an ablation).
    class_weights: bool = option(True, "Eq. 8's per-class weighting of each client by U_c")
    # False: Eq. 6 on U itself, where a class every client inverts easily outweighs the rest.
    relative_classes: bool = option(
        True, "U_c from each class's guidance relative to the clients' mean (false: Eq. 6 on U)"
    )
    guidance_scale: str = option(
        "log",
        "log: u measured as log(max L / min L); ratio: Eq. 2 literally, (max - min) / min",
        choices=("log", "ratio"),
    )
    # Sec. 2: FedHydra "leverages all generated intermediates to mitigate overfitting risks".
    # Distilling on one epoch's batches alone, the student forgets the earlier ones and collapses
    # (the paper's Sec. 4.2.1 notes such collapse); each step also rehearses as many earlier
    # images, a uniform sample of all generated so far.
    replay: int = option(
        20_000, "earlier synthetic images kept for rehearsal (0: this epoch's only)", low=0
    )
    val_size: int = option(
        512, "held-out synthetic images that pick the best student (0: keep the last)", low=0
    )
    patience: int = option(
        0, "stop after this many epochs without a better held-out agreement (0: never)", low=0
    )
    # A batch the aggregate does not yet take for its targets is unfinished, and its labels
    # teach the student little: on MNIST 5 steps finish a batch, on HAPT windows they did not
    # (a whole class at 0% recall on seeds 1 and 2). The generator keeps stepping on the batch.
    finish: float = option(
        0.9,
        "after gen_steps, keep stepping until this share of the batch is labelled its "
        "target by the aggregate (0: never)",
        low=0,
        high=1,
    )
    max_gen_steps: int = option(30, "most generator steps on one batch (finish's cap)", low=1)
    # Alg. 2 measures how easily a generator turns each client to each class. Under label skew
    # that follows who holds the class (MNIST Dirichlet: `label_skew` of the clients' declared
    # label counts 0.55-0.88); where every client holds every class alike (HAPT users: 0.00,
    # raw V 0.03-0.04, a chi-square test of homogeneity p 0.61-0.98) it follows something else
    # and costs 2.5 points (bench/results/datafree_hapt_fedhydra.md). Such clients are trusted
    # alike.
    min_label_skew: float = option(
        0.1,
        "stratify (Alg. 2) only when the teachers' declared label counts differ across clients "
        "by at least this Cramer's V (0.1: a small association); below it every client is "
        "weighted alike for every class (0: always stratify, the paper's; an upload without "
        "label counts: always)",
        low=0,
        high=1,
    )
    # The student meets the aggregate only at the generator's samples; mixes of two of them,
    # labelled by the aggregate as the rest are, ask it between those points. At 30 epochs:
    # HAPT 71.08 -> 75.75 (with min_label_skew), MNIST Dir(0.5 / 0.1) 91.76 -> 93.45 / 72.53 ->
    # 78.37, at 2.8x the time on windows (each step's batch doubles and its mixes go through
    # every teacher; an epoch there holds 30 batches). 24 epochs with mixes: HAPT 76.13, MNIST
    # 90.96 / 78.95 (one seed of Dir(0.5) 2.8 under no mixes), ~2.1x the time of 30 without
    # (bench/results/datafree_fedhydra_gate_mix.md); fewer passes or mixes lost more.
    mix: bool = option(
        True,
        "each student step also distils as many mixes lam * x_i + (1 - lam) * x_j of its "
        "batch (lam uniform), labelled by the student's target for x_i's label (false: about half "
        "the time)",
    )
    # Made to satisfy BN-free teachers alone (the `cnn`s), the generator's Fashion images grow
    # rougher every epoch (the mean per-image sum of squared steps between neighbouring pixels
    # 12 -> 176 over 24 epochs, real images 49): detail no real garment has, and which classes
    # the student then fails changes with the fusion seed. A prior of 1/49 per unit of it: +3.75
    # +- 1.48 (SE, 10 fusions of three Table 1 cells). Digits are strokes, sharp by nature:
    # MNIST -0.7 (4 fusions), the 8x8 digits' tiny federation 80.6 -> 70.3
    # (bench/results/fedhydra_smooth.md). So by dataset, where it was measured.
    smooth: float | None = option(
        None,
        GENERATOR_SMOOTH_HELP,
        otherwise=0.0,
        by_dataset={"fmnist": 0.02},
        low=0,
    )
    # Charged from the first step, the prior held one Dir(0.1) cell's images at roughness 6-8
    # (real garments 49) and its student never left one class (10.00 %; 52.57 without the
    # prior): it must take only what is rougher than real images. Fashion-MNIST's training
    # images average 49.24 (a statistic of the dataset, like a paper's per-dataset setting).
    smooth_from: float | None = smooth_from_option()
    # Why not Eq. 19's everywhere: the module docstring. Fresh FedHydra Table 1 cells by the
    # Cramer's V of their declared counts (bench/results/fedhydra_distill_target_gate_1205.md):
    # at 0.58-0.82 the image target led by 1.1-2.8 points, at 0.83 Eq. 19's by 1.1, at
    # 0.84-0.97 by 7-17 (Fashion and MNIST Dir(0.1), 1-3 fusion seeds a cell). The threshold
    # sits between 0.816 and 0.841, where the sign changed: chosen on those cells.
    distill_target: str = option(
        "by-skew",
        "what the student distils: stratified (Eq. 19: SA for the generator's label, the "
        "paper's), class-weighted (each class's probability from the clients that know it, "
        "U_c, every client's row alike: a target the image alone determines; the generator "
        "still follows SA), or by-skew (stratified where the declared label counts differ by "
        "at least target_skew, else class-weighted)",
        choices=("by-skew", "stratified", "class-weighted"),
    )
    target_skew: float = option(
        0.83,
        "by-skew's threshold: the Cramer's V of the declared label counts from which the "
        "student distils Eq. 19's stratified target (an upload without label counts: "
        "class-weighted)",
        low=0,
        high=1,
    )
    # Why: generator.WeightAverage. Where the late students agree with 0.49-0.80 of the
    # held-out synthetic images' labels (Fashion, MNIST, HAPT users), that signal picks a late
    # epoch little better than chance and the average won every run, by 0.3-7.9 points; where
    # they agree with 0.85-0.96 (HAPT users and split by label, the MNIST bench's failing cell)
    # the pick won every fresh run, by 0.1-9.5 (bench/results/fedhydra_average.md). So the run's
    # own agreement decides (`pick_agreement`, inside that gap). The paper budget: the pick.
    average_from: float = option(
        0.5,
        "keep the average of the student's weights over the epochs from this share of the run "
        "on (stochastic weight averaging); 1: keep the student of the best held-out agreement",
        low=0,
        high=1,
    )
    pick_agreement: float = option(
        0.84,
        "keep the best held-out student instead of the average when the averaged epochs' "
        "students agree with more than this share of the held-out images (their mean): there "
        "the held-out images can tell the epochs apart (1: always the average)",
        low=0,
        high=1,
    )
    # Started from the uploads' average (FedDF's start) on five Fashion Table 1 cells: +3.1 /
    # -0.1 / +0.7 / +4.4 / +5.8 at Dir(0.5) s0, Dir(0.3) s0 / s2, Dir(0.1) s1 / s0
    # (bench/results/fedhydra_init_average_1205.md); the Table 1 row 74.37 / 72.54 / 59.51 ->
    # 77.21 / 73.93 / 61.95. MNIST (+2.3 on three cells) was not rerun row-wide; on HAPT's
    # phones it collapses (-8.1 over 3 seeds, one -18.7). So by dataset.
    init: str | None = option(
        None, INIT_HELP, otherwise="fresh", by_dataset={"fmnist": "average"}, choices=INIT_CHOICES
    )
    epochs: int = option(24, "epochs: generator steps, then distillation (paper: 200)", low=1)
    heatmap: str | None = option(
        None,
        "also write the stratification heat map PNG here (missing folders are created)",
    )
    committee: int = option(0, COMMITTEE_HELP, low=0)
    # Alg. 2 trains a generator per client and class: ~2 s a `cnn` teacher on one core, an
    # hour at 2,000 teachers whatever the committee. Under label skew its U follows who holds
    # each class, which every edgefl upload declares.
    stratification: str = option(
        "generators",
        "where U (how well each client knows each class) comes from: generators (Alg. 2, a "
        "generator per client and class) or counts (the uploads' declared label counts: "
        "nothing trained per teacher, for thousands of them)",
        choices=("generators", "counts"),
    )
    AT_SCALE: ClassVar[tuple[str, ...]] = ("stratification=counts",)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_committee(self)


# --- model stratification -------------------------------------------------------------------


def guidance(losses: np.ndarray, scale: str = "log") -> float:
    """Eq. 2, u = (max - min) / min over one generator run's losses, or log(1 + u) = log(max /
    min) on the log scale (non-finite losses dropped; none left -> 0, no guidance measured)."""
    ok = losses[np.isfinite(losses)]
    if len(ok) == 0:
        return 0.0
    u = float((ok.max() - ok.min()) / max(ok.min(), MIN_LOSS_FLOOR))
    return float(np.log1p(u)) if scale == "log" else u


def stratify(
    teachers: list[nn.Module],
    num_classes: int,
    *,
    image_shape,
    steps: int,
    batch_size: int,
    lr: float,
    nz: int,
    ngf: int,
    seed: int,
    device,
    scale: str = "log",
    progress=None,
) -> tuple[np.ndarray, np.ndarray]:
    """(U, losses): U is (classes x clients) guidance capability, losses (clients x classes x
    steps). Every (k, j) run starts from the same generator weights and the same noise, so U
    differs between pairs only through the clients themselves. The c generators of one client
    run side by side as one grouped generator: the groups share no parameters and Adam is
    elementwise, so summing their losses trains each exactly as if it ran alone."""
    single = make_generator(nz, ngf, image_shape, seed, device)
    rng = torch.Generator().manual_seed(seed)
    z, _ = sample_noise(rng, batch_size, nz, num_classes, device)
    y = torch.arange(num_classes, device=device).repeat_interleave(batch_size)
    losses = np.zeros((len(teachers), num_classes, steps))
    for k, teacher in enumerate(teachers):
        gen = single.replicate(num_classes)  # generator j is trained towards class j
        opt = torch.optim.Adam(gen.parameters(), lr=lr)
        for t in range(steps):
            x = gen(z).flatten(0, 1)  # (c * b, ...): class-major, like y
            ce = F.cross_entropy(teacher(x).double(), y, reduction="none")
            per_class = ce.view(num_classes, batch_size).mean(1)
            # Not `descend`: a (client, class) generator that diverges only loses that pair's
            # guidance (`guidance` drops non-finite losses), not the whole fusion.
            opt.zero_grad(set_to_none=True)
            per_class.sum().backward()
            opt.step()
            losses[k, :, t] = per_class.detach().cpu().numpy()
        if progress:
            progress("stratification client", k + 1, len(teachers))
    u = np.array(
        [[guidance(losses[k, j], scale) for k in range(len(teachers))] for j in range(num_classes)]
    )
    return u, losses


def label_skew(counts: np.ndarray) -> float:
    """Cramer's V of a (clients x classes) table of label counts, bias-corrected (Bergsma 2013)
    so that a few hundred samples a client drawn from one distribution read near 0: 0 when every
    client holds the classes in the federation's proportions, 1 when each class lives on one
    client. Classes and clients with no samples are left out; fewer than two of either -> 0."""
    n = np.asarray(counts, dtype=np.float64)
    n = n[n.sum(1) > 0][:, n.sum(0) > 0]
    r, k = n.shape
    total = n.sum()
    if min(r, k) < 2 or total < 2:
        return 0.0
    expected = n.sum(1, keepdims=True) * n.sum(0, keepdims=True) / total
    phi2 = float(((n - expected) ** 2 / expected).sum()) / total
    # Sampling noise alone gives phi2 about (r - 1)(k - 1) / (total - 1).
    phi2 = max(0.0, phi2 - (r - 1) * (k - 1) / (total - 1))
    r_c, k_c = r - (r - 1) ** 2 / (total - 1), k - (k - 1) ** 2 / (total - 1)
    return float(np.sqrt(phi2 / max(min(r_c, k_c) - 1, 1e-12)))


def declared_skew(uploads, num_classes: int) -> float | None:
    """`label_skew` of the uploads' declared label counts, or None when one does not declare
    them (then nothing says the clients hold the classes alike)."""
    counts = [u.label_counts for u in uploads]
    if any(len(c) != num_classes for c in counts):
        return None
    return label_skew(np.stack(counts))


def declared_guidance(uploads, num_classes: int) -> np.ndarray:
    """U (classes x clients) from the uploads' declared label counts: how many samples of each
    class each client learnt from (`stratification counts`)."""
    missing = [u.client_id for u in uploads if len(u.label_counts) != num_classes]
    if missing:
        raise FusionError(
            f"fedhydra's stratification=counts reads each teacher's declared label counts; "
            f"{len(missing)} declare none (e.g. {missing[0]})",
            hint="use --opt fedhydra:stratification=generators (Alg. 2), or uploads trained "
            "with --label-counts exact or noised",
        )
    return np.stack([u.label_counts for u in uploads]).clip(min=0).T.astype(np.float64)


def stratification_weights(u: np.ndarray, relative: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(U_r, U_c) from U (classes x clients). U_r: each class's row sums to 1 over clients;
    U_c: each client's column sums to 1 over classes. A row or column that is all zero (nobody
    guides that class / a client guides nothing measurable) falls back to uniform weights
    instead of dividing by zero.

    `relative`: U_c is built from U with each class's row divided by its mean over clients.
    How far a generator's loss falls depends on the class as much as on the client (on HAPT
    every phone's u for "lying", which gravity alone gives away, is 2-3x its u for "standing").
    Eq. 8 multiplies every client's probability of class j by its U_c[j, k], so a factor all
    clients share is a prior on class j that no client stated: the aggregate, and the student,
    then rarely say "standing" (18% recall, against the ensemble's 92%). Divided out, U_c keeps
    what Eq. 6 means, which classes a client knows better than the others do. U_r is unchanged
    (a row's scale cancels in its own normalisation)."""
    u = np.asarray(u, dtype=np.float64)
    c, m = u.shape
    rows = u.sum(1, keepdims=True)
    u_r = np.where(rows > 0, u / np.where(rows > 0, rows, 1), 1.0 / m)
    v = np.where(rows > 0, u / np.where(rows > 0, rows / m, 1), 0.0) if relative else u
    cols = v.sum(0, keepdims=True)
    u_c = np.where(cols > 0, v / np.where(cols > 0, cols, 1), 1.0 / c)
    return u_r, u_c


def stratified_aggregate(
    logits: torch.Tensor, y: torch.Tensor, u_r: torch.Tensor, u_c: torch.Tensor
) -> torch.Tensor:
    """SA (Eq. 8-11) over probabilities. logits (m, b, c) of the m clients; y (b,) target
    labels; u_r, u_c (c, m). Returns log-probabilities P (b, c): the log of the normalised
    mixture sum_k u_r[y_i, k] * (softmax(logits[k, i]) * u_c[:, k]). Unlike weighting raw
    logits, this does not change when a client adds a constant to its logits."""
    probs = logits.softmax(-1) * u_c.t().unsqueeze(1)  # (m, 1, c): client k's per-class weights
    v = u_r[y]  # (b, m): each sample's weights over clients, by its target class
    mix = torch.einsum("bm,mbc->bc", v, probs)
    tiny = torch.finfo(mix.dtype).tiny  # a sample nobody guides: uniform, not NaN
    return mix.clamp_min(tiny).log() - mix.sum(1, keepdim=True).clamp_min(tiny).log()


# --- HASA -----------------------------------------------------------------------------------


def _stratify(ctx: FusionContext, cfg: FedHydraConfig, teachers) -> np.ndarray:
    u, _ = stratify(
        teachers,
        ctx.num_classes,
        image_shape=ctx.input_shape,
        steps=cfg.strat_steps or cfg.gen_steps,
        batch_size=cfg.strat_batch or cfg.batch_size,
        lr=cfg.gen_lr,
        nz=cfg.nz,
        ngf=cfg.ngf,
        seed=cfg.seed,
        device=ctx.device,
        scale=cfg.guidance_scale,
        progress=ctx.progress,
    )
    return u


class Hasa:
    """HASA's game (Alg. 1): the generator, the student, their optimisers and one random stream
    (`rng`: noise, rehearsal draws and jitter, in that order every epoch)."""

    def __init__(
        self,
        ctx: FusionContext,
        cfg: FedHydraConfig,
        teachers,
        u_r,
        u_c,
        skew: float | None = None,
        uploads=(),
    ):
        dev = ctx.device
        self.ctx, self.cfg, self.teachers = ctx, cfg, teachers
        self.u_r = torch.tensor(u_r, dtype=torch.float32, device=dev)
        self.u_c = torch.tensor(u_c, dtype=torch.float32, device=dev)
        self.bn = BNStatLoss(teachers)
        self.spec, self.student, self.start = first_student(ctx, cfg, list(uploads), "fedhydra")
        # Alg. 1 line 11: a new generator for HASA (seed + 1: not the stratification's init).
        self.gen = make_generator(cfg.nz, cfg.ngf, ctx.input_shape, cfg.seed + 1, dev)
        self.opt_g = torch.optim.Adam(self.gen.parameters(), lr=cfg.gen_lr)
        self.opt_s = torch.optim.SGD(self.student.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        self.rng = torch.Generator().manual_seed(cfg.seed + 1)
        self.val_rng = torch.Generator().manual_seed(cfg.seed + 2)  # keeps `rng`'s stream
        self.replay = ReplayPool(cfg.replay)
        self.augment = student_jitter(cfg.augment, ctx.input_shape)
        self.hist: dict[str, list[float]] = {
            k: [] for k in ("generator", "ce", "bn", "adv", "global")
        }
        self.by_target = stratified_target(cfg, skew)  # `skew`: the declared label counts'

    def logits(self, x, bn=None, members=None) -> torch.Tensor:
        """(m, b, c): every teacher's logits on x, or `members`' (indices)."""
        teachers = self.teachers if members is None else [self.teachers[k] for k in members]
        return teacher_forward(teachers, x, bn)

    def weigh(self, logits, y, members=None, by_target: bool = True) -> torch.Tensor:
        """Eq. 8-11 on the teachers' logits (`members`' rows of U_r are normalised among them by
        the mixture's own normalisation); by_target False: every client's row weight alike,
        U_c's per-class weights only, a mixture the images alone determine."""
        cols = slice(None) if members is None else members
        u_r = self.u_r if by_target else torch.ones_like(self.u_r)
        return stratified_aggregate(logits, y, u_r[:, cols], self.u_c[:, cols])

    def target(self, x, y, members=None):
        """What the student distils on x drawn for labels y (`distill_target`)."""
        return self.weigh(self.logits(x, None, members), y, members, self.by_target)

    def members(self) -> list[int] | None:
        """A fresh committee's indices for one pass (None: every teacher, nothing drawn)."""
        return draw_committee(len(self.teachers), self.cfg.committee, self.rng)

    def generate(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """T_G generator steps on one noise batch (more until `finish` of it is labelled its
        target), with Eq. 16's loss; every step's (images, aggregate) is returned."""
        cfg, dev, student = self.cfg, self.ctx.device, self.student
        z, y = sample_noise(self.rng, cfg.batch_size, cfg.nz, self.ctx.num_classes, dev)
        set_trainable(student, False)
        intermediates = []
        step, agree = 0, 0.0
        while step < cfg.gen_steps or (step < cfg.max_gen_steps and agree < cfg.finish):
            step += 1
            x = self.gen(z)
            members = self.members()
            logits = self.logits(x, self.bn, members)
            p = self.weigh(logits, y, members)
            l_ce = F.cross_entropy(p, y)
            l_bn = self.bn.value(dev)
            l_adv = -kl_at(p, student(x))  # Eq. 16: no temperature (it is Eq. 19's)
            loss = cfg.ce_weight * l_ce + cfg.bn_weight * l_bn + cfg.adv_weight * l_adv
            if cfg.smooth:
                loss = loss + cfg.smooth * excess_roughness(x, cfg.smooth_from).mean()
            target = p if self.by_target else self.weigh(logits.detach(), y, members, False)
            intermediates.append((x.detach(), target.detach()))
            agree = float((p.argmax(1) == y).float().mean())
            descend(self.opt_g, loss, "the FedHydra generator", rate="gen_lr")
        for k, v in zip(("generator", "ce", "bn", "adv"), (loss, l_ce, l_bn, l_adv), strict=True):
            self.hist[k].append(float(v.detach()))
        return intermediates

    @torch.no_grad()
    def hold_out(self, val: SyntheticValidation) -> None:
        """Fresh images from the current generator that the teachers take for their target."""
        cfg = self.cfg
        zv, yv = sample_noise(
            self.val_rng, val.per_epoch, cfg.nz, self.ctx.num_classes, self.ctx.device
        )
        xv = self.gen(zv)
        hard = self.target(xv, yv, self.members()).argmax(1)
        keep = hard == yv
        val.add(xv[keep], hard[keep])

    def distill(self, intermediates) -> None:
        """Eq. 19 on each intermediate batch (`distill_passes` times), each step with as many
        rehearsed earlier images (and with `mix` as many mixes of the two); then the batches
        join the rehearsal pool."""
        cfg, student, rng = self.cfg, self.student, self.rng
        set_trainable(student, True)
        total = 0.0
        for x, p in intermediates * cfg.distill_passes:
            if self.replay.size:  # always 0 with --replay 0
                rx, rp = self.replay.sample(len(x), rng)
                x, p = torch.cat([x, rx]), torch.cat([p, rp])
            if cfg.mix:
                xm = pair_mixes(x, rng)
                with torch.no_grad():
                    pm = self.target(xm, p.argmax(1), self.members())
                x, p = torch.cat([x, xm]), torch.cat([p, pm])
            s = student(jitter(x, self.augment, rng))
            loss = kl_at(p, s, cfg.temperature) + cfg.beta * F.cross_entropy(s, p.argmax(1))
            total += descend(self.opt_s, loss)
        self.hist["global"].append(total / (len(intermediates) * cfg.distill_passes))
        for x, p in intermediates:  # after the steps: they rehearse earlier epochs only
            self.replay.add(x, p, rng)


# What grows with each classifier teacher (max_teachers caps them).
TEACHER_COST = (
    "it trains a generator per teacher and class, and every generator step forwards every teacher"
)


def work(cfg: FedHydraConfig) -> float:
    """Student samples at most: every generator step's batch, each pass with as many rehearsed
    (and mixed) ones."""
    per_step = cfg.batch_size * (1 + bool(cfg.replay) + cfg.mix)
    return cfg.epochs * max(cfg.gen_steps, cfg.max_gen_steps) * cfg.distill_passes * per_step


class Strata(NamedTuple):
    """Alg. 2's outcome: U (None where not stratified), U_r and U_c as computed, the per-class
    weights HASA uses (U_c, or ones without `class_weights`) and the declared label skew."""

    u: np.ndarray | None
    u_r: np.ndarray
    u_c: np.ndarray
    hasa_u_c: np.ndarray
    skew: float | None


def stratification(ctx: FusionContext, cfg: FedHydraConfig, uploads, teachers) -> Strata:
    """Alg. 2's guidance (or the declared counts'), or every client alike where the declared
    label counts barely differ (`min_label_skew`)."""
    skew = declared_skew(uploads, ctx.num_classes)
    if skew is not None and skew < cfg.min_label_skew:
        ctx.log(
            f"the teachers' label counts barely differ (Cramer's V {skew:.3f} < min_label_skew "
            f"{cfg.min_label_skew:g}): every client weighted alike, no stratification"
        )
        u = None
        u_r, u_c = stratification_weights(np.ones((ctx.num_classes, len(teachers))))
    else:
        if cfg.stratification == "counts":
            u = declared_guidance(uploads, ctx.num_classes)
        else:
            with ctx.stage("stratify"):
                u = _stratify(ctx, cfg, teachers)
        u_r, u_c = stratification_weights(u, cfg.relative_classes)
    hasa_u_c = u_c if cfg.class_weights else np.ones_like(u_c)
    return Strata(u, u_r, u_c, hasa_u_c, skew)


def stratified_target(cfg: FedHydraConfig, skew: float | None) -> bool:
    """Whether the student distils Eq. 19's target (`distill_target`; by-skew reads the
    declared label counts' Cramer's V, `skew`, None where an upload declares none)."""
    if cfg.distill_target == "by-skew":
        return skew is not None and skew >= cfg.target_skew
    return cfg.distill_target == "stratified"


def fuse(ctx: FusionContext, cfg: FedHydraConfig) -> FusionResult:
    uploads, teachers = seeded_teachers(ctx, cfg, TEACHER_COST)
    strata = stratification(ctx, cfg, uploads, teachers)
    game = Hasa(ctx, cfg, teachers, strata.u_r, strata.hasa_u_c, strata.skew, uploads)
    ctx.log(
        f"the student distils the {'stratified' if game.by_target else 'class-weighted'} target"
    )
    val = SyntheticValidation(cfg.val_size, cfg.epochs)
    average = WeightAverage(math.ceil(cfg.average_from * cfg.epochs))
    agreements: list[float] = []
    ctx.progress("epoch", 0, cfg.epochs)
    for epoch in range(cfg.epochs):
        with ctx.stage("generator"):
            intermediates = game.generate()
        if cfg.val_size:
            game.hold_out(val)
        with ctx.stage("distill"):
            game.distill(intermediates)
        if cfg.average_from < 1:
            average.update(game.student, epoch + 1)
        agree = ""
        if cfg.val_size:
            agreements.append(val.update(game.student, epoch + 1))
            agree = f", held-out agreement {agreements[-1]:.3f}"
        hist = game.hist
        ctx.progress(
            "epoch",
            epoch + 1,
            cfg.epochs,
            f"generator {hist['generator'][-1]:.4f} (bn {hist['bn'][-1]:.4f}), "
            f"global {hist['global'][-1]:.4f}{agree}",
        )
        if cfg.val_size and cfg.patience and val.stale >= cfg.patience:
            ctx.log(f"stopping: no better held-out agreement for {cfg.patience} epochs")
            break
    kept = keep_student(
        game, val, average, late_agreement(agreements, average.start), cfg.pick_agreement
    )
    game.bn.remove()
    game.student.eval()

    info = _info(ctx, cfg, uploads, game, strata)
    info["student"] = kept
    info["student_start"] = game.start
    return FusionResult(game.student, game.spec, info)


def late_agreement(agreements: list[float], start: int) -> float | None:
    """The mean held-out agreement of the students after epoch `start` (1-based) and later:
    the epochs an average would take. None without a held-out set."""
    late = agreements[start - 1 :]
    return round(sum(late) / len(late), 4) if late else None


def keep_student(
    game: Hasa,
    val: SyntheticValidation,
    average: WeightAverage,
    agreement: float | None,
    pick_at: float,
) -> dict:
    """Load the student the fusion returns into game.student: the weight average when one was
    taken (BatchNorm statistics measured again on the rehearsal pool), unless the averaged
    epochs' students agreed with more than `pick_at` of the held-out images (`agreement`), when
    the held-out images tell the epochs apart and the best of them is kept; else the last. The
    dict says which, and why."""
    told_apart = agreement is not None and agreement > pick_at and val.best is not None
    if average.n and not told_apart:
        pool = game.replay.contents()[0] if game.replay.size else None
        average.restore(game.student, pool)
        kept = {"kept": "weight average", "from_epoch": average.start, "epochs": average.n}
    elif val.best is not None:
        val.restore_best(game.student)
        kept = {"kept": "best held-out agreement", "epoch": val.best_epoch}
    else:
        kept = {"kept": "last"}
    return kept | ({"late_agreement": agreement} if agreement is not None else {})


def _info(ctx, cfg: FedHydraConfig, uploads, game: Hasa, strata: Strata) -> dict:
    ids = [u.client_id for u in uploads]
    names = [str(c) for c in ctx.class_names]
    heatmap = None
    if cfg.heatmap:
        with ctx.stage("heatmap"):
            heatmap = str(plot_stratification(strata.u_r, ids, names, cfg.heatmap))
    info = {
        "teachers": ids,
        "bn_teachers": [ids[k] for k in game.bn.with_bn],
        "stratification": {
            "client_ids": ids,
            "class_names": names,
            "layout": "rows = classes, columns = clients",
            "U": None if strata.u is None else strata.u.tolist(),  # None: min_label_skew
            "U_r": strata.u_r.tolist(),
            "U_c": strata.u_c.tolist(),
            "min_loss_floor": MIN_LOSS_FLOOR,
            "guidance_scale": cfg.guidance_scale,
            "label_skew": strata.skew,
        },
        "distill_target": "stratified" if game.by_target else "class-weighted",
        "stratification_heatmap": heatmap,
        "loss_history": game.hist,
    }
    return info


READABLE = 30  # clients a heat map labels one by one


def plot_stratification(weights, client_ids, class_names, path) -> Path:
    """Heat map of a (classes x clients) weight matrix (U_r by default: which client each class
    trusts), written atomically (temporary file + rename) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from edgefl.plots import save_figure

    w = np.asarray(weights, dtype=np.float64)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A labelled column and a number per client up to READABLE clients; past them one strip
    # (2,000 labelled columns drew a 180,000-pixel-wide figure: 53 s and 4.7 GiB).
    few = w.shape[1] <= READABLE
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * min(w.shape[1], READABLE), 1.0 + 0.45 * w.shape[0]))
    im = ax.imshow(w, cmap="viridis", vmin=0, vmax=max(1e-12, float(w.max())), aspect="auto")
    if few:
        ax.set_xticks(range(w.shape[1]), [str(c) for c in client_ids], rotation=45, ha="right")
    ax.set_yticks(range(w.shape[0]), [str(c) for c in class_names])
    ax.set_xlabel("client" if few else f"client ({w.shape[1]:,}, in upload order)")
    ax.set_ylabel("class")
    ax.set_title("FedHydra stratification weights")
    for j in range(w.shape[0] if few else 0):
        for k in range(w.shape[1]):
            dark = w[j, k] < 0.5 * w.max()
            ax.text(
                k,
                j,
                f"{w[j, k]:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                color="white" if dark else "black",
            )
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    try:
        return save_figure(fig, path)
    finally:
        plt.close(fig)


def write_outputs(result: FusionResult, global_model: Path) -> dict:
    """Beside the global model: the client x class weights U_r as a picture."""
    strat = result.info["stratification"]
    heat = Path(global_model).with_suffix(".stratification.png")
    plot_stratification(strat["U_r"], strat["client_ids"], strat["class_names"], heat)
    named = {"stratification_png": str(heat)}
    if result.info.get("stratification_heatmap"):  # --opt heatmap=PATH, drawn while fusing
        named["stratification_heatmap"] = result.info["stratification_heatmap"]
    return named


METHOD = Method(
    name="fedhydra",
    description="data-free: per-client/per-class stratification weights, generator trained on "
    "the stratified logit aggregate, distilled with KL + CE on its hard labels",
    paper="Bai et al., FedHydra: a unified solution to diverse heterogeneities in OSFL",
    consumes=("classifier",),
    needs_modules=True,  # generators backpropagate through the teachers
    teacher_cost=TEACHER_COST,
    work=work,
    config_cls=FedHydraConfig,
    fuse=fuse,
    # Table 1, MNIST and FashionMNIST, m = 5 clients (the paper's default).
    references=fedhydra_table1((88.75, 85.16, 59.97, 38.83))
    + fedhydra_table1((77.20, 76.39, 50.48, 46.02), "fmnist"),
    outputs=write_outputs,
    # The paper's: stratification as long and as wide as HASA's generator runs, one student pass.
    budgets={
        "paper": PAPER_GENERATOR
        | {
            "strat_steps": 0,
            "strat_batch": 0,
            "distill_passes": 1,
            "min_label_skew": 0.0,
            "mix": False,
            "distill_target": "stratified",
            "average_from": 1.0,
            "smooth": 0.0,
            "init": "fresh",
        }
    },
)
