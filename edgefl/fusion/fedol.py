"""FedOL: one-shot learning of a larger server model from client predictions on a public set
(Ye et al., "Towards a Larger Model via One-Shot Federated Learning on Heterogeneous Client
Models"; shared/papers/fedol.txt, Sec. IV and Algorithm 1). No weights are uploaded.

For T rounds (paper: 10), alternate
 a) pseudo-labels (Algorithm 1, `fedol_pseudo_labels`): source models M = the clients, plus the
    server model of the previous round from round 2 on ("in the first iteration, only client
    models serve as source models"); rho starts at 0.1 and grows by 0.05 per round;
 b) server training on the whole public set with eq. (7):
    L = E_x[ sum_k lambda_k(x) KL(p_k(x) || p_s(x)) ] + tau E_x[ CE(y_hat, p_s(x)) ],
    lambda_k(x) = softmax_k(-H(p_k(x))) (eq. 14), tau = 0.2. y_hat = 0 where no model is reliable,
    so those samples add nothing to the CE term (the expectation still runs over all of D_u).
The distillation sources are the K clients only: eq. (6) sums over k = 1..K and eq. (14)
normalises over the K clients; the server model is a voter, never its own teacher.
The server model keeps training across rounds (block-coordinate descent on one w_s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

import exporters
from edgefl.data.public import public_fingerprint
from edgefl.errors import FusionError
from edgefl.fusion.base import FusionContext, FusionResult, Method
from edgefl.fusion.config import PublicSetConfig
from edgefl.fusion.options import option
from edgefl.fusion.public_set import public_samples
from edgefl.fusion.student import shuffled_epochs
from edgefl.models.zoo import spec_label


@dataclass(frozen=True)
class FedOLConfig(PublicSetConfig):
    """Paper (Sec. V): T = 10 rounds, tau = 0.2, rho 0.1 + 0.05 per round, batch 64, lr 1e-3,
    "50 epochs" per model training. Ours: 5 epochs per round (50 x 10 rounds is hours on a
    CPU; `--budget paper` or --epochs 50 for the paper's), Adam (the paper names no optimizer), and a student
    larger than typical clients: scnn width 32 (conv 32-64, 50k parameters on MNIST vs 8.5k for
    the FedMHO CNN clients train) -- the paper's point is a server model larger than the clients'."""

    student: str = option(
        "auto",
        "zoo architecture of the server model (auto: scnn:width=32 "
        "on images, cnn1d on sensor windows)",
    )
    rounds: int = option(10, "pseudo-label / training rounds T (paper: 10)", low=1)
    epochs: int = option(5, "training epochs per round (paper: 50)", low=1)
    lr: float = option(1e-3, "Adam learning rate", low=0, low_open=True)
    batch_size: int = option(64, "batch size", low=1)
    tau: float = option(0.2, "weight of the pseudo-label CE term (paper: 0.2)", low=0)
    rho: float = option(
        0.1, "share of most confident samples per model, round 1", low=0, low_open=True, high=1
    )
    rho_step: float = option(0.05, "rho's growth per round (paper: 0.05)", low=0)


def entropy(probs: np.ndarray) -> np.ndarray:
    """Shannon entropy over the last axis (0 log 0 = 0)."""
    p = probs.astype(np.float64)
    logp = np.log(p, out=np.zeros_like(p), where=p > 0)
    return -(p * logp).sum(-1)


def fedol_pseudo_labels(probs: np.ndarray, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1. probs: (M models, N samples, C classes) probability vectors.

    Returns (labels, reliable): labels (N,) int64, -1 where no model is reliable (y_hat = 0);
    reliable (M, N) bool, model m is in M(x_n).
    1. H~_m = the ceil(rho N)-th lowest entropy of model m over D_u.
    2. M(x) = {m : H(p_m(x)) <= H~_m}.
    3. y_m = +1 on argmax_c p_m(x), -1 elsewhere (negative learning).
    4. G(x) = sum_{m in M(x)} C2_m * y_m / sum_{m in M(x)} C2_m, elementwise per class, with the
       class-wise confidence C2_m = mean over D_u of p_m(x) (eq. 10).
    5. y_hat = one-hot(argmax_c G(x)) when M(x) is not empty.
    """
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 3 or min(probs.shape) < 1:
        raise ValueError(f"probs must be (models, samples, classes), got {probs.shape}")
    m, n, c = probs.shape
    h = entropy(probs)  # M x N
    k = min(n, max(1, math.ceil(rho * n)))
    baseline = np.partition(h, k - 1, axis=1)[:, k - 1]  # the k-th lowest, per model
    reliable = h <= baseline[:, None]
    conf = probs.mean(axis=1)  # C2: M x C
    votes = -np.ones((m, n, c))
    np.put_along_axis(votes, probs.argmax(-1)[..., None], 1.0, axis=-1)
    weight = reliable[..., None] * conf[:, None, :]  # M x N x C: C2_m where m is reliable
    num = (weight * votes).sum(0)
    den = weight.sum(0)
    # A class no reliable model ever gives mass to has no vote at all: G = 0 there.
    g = np.divide(num, den, out=np.zeros_like(num), where=den > 0)
    labels = np.where(reliable.any(0), g.argmax(-1), -1).astype(np.int64)
    return labels, reliable


def distillation_targets(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For eq. (6) with lambda_k(x) = softmax_k(-H(p_k(x))): sum_k lambda_k KL(p_k || p_s)
    = sum_k lambda_k sum_c p_k log p_k - sum_c q_c log p_s,c with q = sum_k lambda_k p_k.
    Returns (q N x C, the constant first term N): one cross-entropy per sample instead of K KLs,
    with the same gradient and the same loss value."""
    p = probs.astype(np.float64)
    h = entropy(p)  # K x N
    lam = np.exp(-h - (-h).max(0, keepdims=True))
    lam /= lam.sum(0, keepdims=True)
    q = (lam[..., None] * p).sum(0)
    const = -(lam * h).sum(0)
    return q.astype(np.float32), const.astype(np.float32)


@torch.no_grad()
def _server_probs(model, x: torch.Tensor, device, batch: int = 1024) -> np.ndarray:
    model.eval()
    out = [
        torch.softmax(model(x[i : i + batch].to(device)).float(), 1).cpu()
        for i in range(0, len(x), batch)
    ]
    return torch.cat(out).numpy()


def matching_predictions(ctx: FusionContext, fingerprint: str, size: int):
    """(uploads whose public set is the server's, [(file, reason)] for the others)."""
    used, rejected = [], []
    for u in ctx.uploads:
        if u.kind != "predictions":
            continue
        if u.meta["public_fingerprint"] != fingerprint:
            rejected.append(
                (
                    u.name,
                    (
                        f"predictions are for another public set (fingerprint "
                        f"{u.meta['public_fingerprint'][:12]}..., {u.meta['public_size']} samples; the "
                        f"server's is {fingerprint[:12]}..., {size} samples)"
                    ),
                )
            )
        else:
            used.append(u)
    return used, rejected


def fuse(ctx: FusionContext, cfg: FedOLConfig) -> FusionResult:
    with ctx.stage("public"):
        x_np = public_samples(ctx, cfg)
        fingerprint = public_fingerprint(x_np)
        x = torch.from_numpy(x_np)
    used, rejected, probs = _uploaded_predictions(ctx, cfg, fingerprint, len(x_np))
    q, const = (torch.from_numpy(a) for a in distillation_targets(probs))

    spec, student = ctx.student(cfg.student, images="scnn:width=32")
    opt = torch.optim.Adam(student.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed)
    rounds = []
    ctx.progress("round", 0, cfg.rounds)
    for t in range(1, cfg.rounds + 1):
        rho = min(1.0, cfg.rho + (t - 1) * cfg.rho_step)
        with ctx.stage("pseudo-label"):
            sources = probs
            if t > 1:  # the server model of round t-1 joins the voters
                sources = np.concatenate([probs, _server_probs(student, x, ctx.device)[None]])
            labels_np, reliable = fedol_pseudo_labels(sources, rho)
            labels = torch.from_numpy(labels_np)
        with ctx.stage("train"):
            totals = _train_round(student, opt, x, (q, const, labels), gen, cfg, ctx.device)
        rounds.append(
            {
                "round": t,
                "rho": round(rho, 4),
                "sources": len(sources),
                "labelled": int((labels_np >= 0).sum()),
                "reliable_per_source": reliable.sum(1).tolist(),
                "loss": float(totals[0]),
                "distill": float(totals[1]),
                "pseudo_ce": float(totals[2]),
            }
        )
        ctx.progress(
            "round",
            t,
            cfg.rounds,
            f"rho {rho:.2f}, {rounds[-1]['labelled']} pseudo-labels, loss {totals[0]:.4f}",
        )
    student.eval()
    info = {
        "sources": [u.client_id for u in used],
        "rejected_predictions": [{"file": n, "reason": r} for n, r in rejected],
        "public_samples": len(x),
        "public_fingerprint": fingerprint,
        "student": spec_label(spec),
        "upload_bytes": {u.client_id: Path(u.artifact.path).stat().st_size for u in used},
        "rounds": rounds,
    }
    return FusionResult(student, spec, info, samples=x)


def _uploaded_predictions(ctx: FusionContext, cfg: FedOLConfig, fingerprint: str, n: int):
    """(the predictions uploads made on the server's public set, the others with why, their
    probabilities (clients x samples x classes)); none made on it is refused."""
    used, rejected = matching_predictions(ctx, fingerprint, n)
    for name, reason in rejected:
        ctx.log(f"rejected {name}: {reason}")
    if not used:
        listing = "; ".join(f"{n}: {r}" for n, r in rejected) or "no predictions uploads"
        raise FusionError(
            f"fedol: no predictions match the server's public set {cfg.public} ({listing})",
            hint="clients and server must name the same public set, --public-size and seed",
        )
    # float16 uploads are renormalised after the cast so every row is a distribution again.
    probs = np.stack(
        [
            exporters.read_constant_outputs(u.artifact.model)["predictions"].astype(np.float32)
            for u in used
        ]
    )
    probs = np.clip(probs, 0.0, None)
    probs /= probs.sum(-1, keepdims=True)
    return used, rejected, probs


def _train_round(student, opt, x, targets, gen, cfg: FedOLConfig, device) -> np.ndarray:
    """One round's epochs of Eq. (7) on the public set; the last epoch's mean (loss, distill,
    pseudo-label CE)."""
    q, const, labels = targets
    student.train()
    parts = []  # each step's (distill, CE) and batch size

    def loss_of(idx):
        loss, (distill, ce) = _loss(
            student(x[idx].to(device)), q[idx], const[idx], labels[idx], cfg.tau, device
        )
        parts.append((distill, ce, len(idx)))
        return loss

    history = shuffled_epochs(
        opt, len(x), loss_of, epochs=cfg.epochs, batch_size=cfg.batch_size, gen=gen
    )
    last = parts[-math.ceil(len(x) / cfg.batch_size) :]  # the last epoch's steps
    distill, ce = (sum(p[i] * p[2] for p in last) / len(x) for i in (0, 1))
    return np.array([history[-1], distill, ce])


def _loss(logits, q, const, labels, tau: float, device):
    """Eq. (7) on one batch: mean_x [ sum_k lambda_k KL(p_k || p_s) ] + tau mean_x CE(y_hat, p_s)."""
    log_s = F.log_softmax(logits, 1)
    q, const, labels = q.to(device), const.to(device), labels.to(device)
    distill = (const - (q * log_s).sum(1)).mean()
    has = labels >= 0
    # Samples without a pseudo-label have y_hat = 0: they count in the mean with CE 0.
    ce = -log_s[has].gather(1, labels[has, None]).sum() / len(labels)
    return distill + tau * ce, (distill.item(), ce.item())


METHOD = Method(
    name="fedol",
    description="server model from client predictions on a public set (no weights uploaded)",
    paper="Ye et al., FedOL (Towards a Larger Model via One-Shot FL)",
    consumes=("predictions",),
    needs_modules=False,
    config_cls=FedOLConfig,
    fuse=fuse,
    # Sec. V's "50 epochs" per model training, each round; no public code of the authors is
    # known, so `--budget code` runs this too.
    budgets={"paper": {"epochs": 50}},
)
