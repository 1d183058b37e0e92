"""What an upload gives away about the samples it was trained on: membership inference, measured.

A membership-inference attack gives each query a score, higher meaning "was in the client's
training set". It is run on the client's own training samples (members) and on held-out samples
of the same distribution (non-members); its success is the ROC curve between the two score sets,
read as the AUC and as the true-positive rate at a low false-positive rate (Carlini et al. 2022,
"Membership Inference Attacks From First Principles": an attack must be judged where it is sure,
not on average), each with a seeded bootstrap confidence interval.

The attacks, one per upload kind (issue 57, item 5):
- a classifier, black-box: the loss threshold (Yeom et al. 2018: score = -loss of the true
  label) and LiRA's offline form (Carlini et al. 2022): shadow models trained without the query
  give the distribution of its logit-scaled confidence when it is *out*; the target's confidence
  is scored by how far above that it lies;
- a CVAE decoder, white-box: reconstruction by optimising the latent (members reconstruct closer,
  as a generator that memorised them can produce them; Hayes et al. 2019 and Chen et al. 2020's
  GAN-Leaks for generators) and the distance to the nearest of many samples of the query's class,
  each optionally calibrated by the same distance under a reference decoder trained on other data;
- label counts: how well a client's class histogram links it to its own later data among the
  federation's clients (no sample-level DP hides a histogram's shape).

Models are given already trained: training (DP or not) lives above this layer, so a shadow or
reference model comes from a trainer the caller passes in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from edgefl.bounds import Range
from edgefl.errors import DataError

FPRS: tuple[float, ...] = (0.01, 0.001)  # the false-positive rates a report reads TPR at
BOOTSTRAP = 1000  # resamples for a confidence interval
LEVEL = 0.95

# ---------------------------------------------------------------------------------------------
# Metrics: from member and non-member scores (higher: "member")


def _scores(name: str, values) -> np.ndarray:
    s = np.asarray(values, dtype=np.float64).ravel()
    if len(s) == 0:
        raise DataError(f"no {name} scores", hint="score at least one member and one non-member")
    if not np.all(np.isfinite(s)):
        raise DataError(
            f"{np.sum(~np.isfinite(s))} of {len(s)} {name} scores are not finite",
            hint="an attack must give every query a finite score",
        )
    return s


def roc_auc(members, nonmembers) -> float:
    """The probability that a random member outscores a random non-member, ties counting half:
    the Mann-Whitney U statistic over n1 n0, from the members' ranks in the pooled scores."""
    s1, s0 = _scores("member", members), _scores("non-member", nonmembers)
    n1, n0 = len(s1), len(s0)
    from scipy.stats import rankdata  # imported here: ~0.5 s a process

    ranks = rankdata(np.concatenate([s1, s0]))  # average ranks: a tie counts half either way
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    return float(u / (n1 * n0))


def tpr_at_fpr(members, nonmembers, fpr: float) -> float:
    """The highest TPR of a threshold rule "member if score >= t" whose FPR is at most `fpr`.

    With k = floor(fpr n0) false positives allowed, any such t lies above the (k+1)-th highest
    non-member score s (else s and the k above it would all be flagged); the members above s
    are the most it can catch. k >= n0 allows every threshold: TPR 1."""
    Range(0, 1).check("fpr", fpr)
    s1, s0 = _scores("member", members), _scores("non-member", nonmembers)
    k = int(np.floor(fpr * len(s0) + 1e-9))  # 1e-9: 0.01 * 100 is not 1 in floats
    if k >= len(s0):
        return 1.0
    cut = np.sort(s0)[::-1][k]
    return float(np.mean(s1 > cut))


def resolves(fpr: float, nonmembers: int) -> bool:
    """Whether `nonmembers` non-members can show an FPR of `fpr` at all (one false positive)."""
    return fpr * nonmembers >= 1 - 1e-9


@dataclass(frozen=True)
class AttackMetrics:
    """An attack's success with (LEVEL) bootstrap intervals. `tpr` holds only the FPRs the
    non-members resolve (key: the FPR)."""

    auc: float
    auc_ci: tuple[float, float]
    tpr: dict[float, float]
    tpr_ci: dict[float, tuple[float, float]]
    members: int
    nonmembers: int

    def as_dict(self) -> dict:
        out = asdict(self)
        out["tpr"] = {f"{k:g}": v for k, v in self.tpr.items()}
        out["tpr_ci"] = {f"{k:g}": list(v) for k, v in self.tpr_ci.items()}
        out["auc_ci"] = list(self.auc_ci)
        return out


def evaluate_attack(
    members,
    nonmembers,
    *,
    fprs: Sequence[float] = FPRS,
    bootstrap: int = BOOTSTRAP,
    level: float = LEVEL,
    seed: int = 0,
) -> AttackMetrics:
    """AUC and TPR at each resolvable FPR, with percentile bootstrap intervals: members and
    non-members are resampled apart (each with replacement, at its own size), so each interval
    reflects both finite samples."""
    Range(1, integer=True).check("bootstrap", bootstrap)
    Range(0, 1, low_open=True, high_open=True).check("level", level)
    s1, s0 = _scores("member", members), _scores("non-member", nonmembers)
    kept = [f for f in fprs if resolves(f, len(s0))]
    rng = np.random.default_rng(seed)
    aucs = np.empty(bootstrap)
    tprs = np.empty((len(kept), bootstrap))
    for b in range(bootstrap):
        r1 = s1[rng.integers(0, len(s1), len(s1))]
        r0 = s0[rng.integers(0, len(s0), len(s0))]
        aucs[b] = roc_auc(r1, r0)
        for i, f in enumerate(kept):
            tprs[i, b] = tpr_at_fpr(r1, r0, f)
    tail = 100 * (1 - level) / 2

    def interval(values: np.ndarray) -> tuple[float, float]:
        lo, hi = np.percentile(values, [tail, 100 - tail])
        return float(lo), float(hi)

    return AttackMetrics(
        auc=roc_auc(s1, s0),
        auc_ci=interval(aucs),
        tpr={f: tpr_at_fpr(s1, s0, f) for f in kept},
        tpr_ci={f: interval(tprs[i]) for i, f in enumerate(kept)},
        members=len(s1),
        nonmembers=len(s0),
    )


# ---------------------------------------------------------------------------------------------
# Classifiers (black-box: the attacker queries the uploaded model's logits)


@torch.no_grad()
def model_logits(model: nn.Module, x: np.ndarray, batch: int = 512) -> torch.Tensor:
    """The model's logits for every query, `batch` at a time."""
    model.eval()
    xt = torch.as_tensor(np.asarray(x, dtype=np.float32))
    return torch.cat([model(xt[i : i + batch]) for i in range(0, len(xt), batch)])


def loss_scores(model: nn.Module, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The loss attack's scores: minus each query's cross-entropy at its true label (a model
    fits what it was trained on better)."""
    # In float64: float32's log-softmax rounds every confident sample's loss to exactly 0, and
    # the tie at the top hid all members behind the non-members there (TPR 0 at 1 % FPR for a
    # DP-trained MNIST cnn, 96 members and >15 non-members at loss 0).
    logits = model_logits(model, x).double()
    loss = F.cross_entropy(logits, torch.as_tensor(np.asarray(y, dtype=np.int64)), reduction="none")
    return (-loss).numpy()


def logit_confidence(model: nn.Module, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """log(p_y / (1 - p_y)) per query, where LiRA fits Gaussians (the softmax confidence itself
    piles up at 1). Computed from the logits without forming p: log p_y = z_y - LSE(z) and
    log(1 - p_y) = LSE_{j != y}(z_j) - LSE(z), so the ratio is z_y - LSE_{j != y}(z_j)."""
    logits = model_logits(model, x).double()
    yt = torch.as_tensor(np.asarray(y, dtype=np.int64))
    own = logits.gather(1, yt[:, None])[:, 0]
    others = logits.scatter(1, yt[:, None], float("-inf")).logsumexp(1)
    return (own - others).numpy()


# (x, y, seed) -> a model trained on them as the target was: the caller's training recipe.
Trainer = Callable[[np.ndarray, np.ndarray, int], nn.Module]


def shadow_confidences(
    train: Trainer,
    pool_x: np.ndarray,
    pool_y: np.ndarray,
    query_x: np.ndarray,
    query_y: np.ndarray,
    *,
    shadows: int,
    size: int,
    seed: int = 0,
) -> np.ndarray:
    """(shadows, queries) logit-scaled confidences of the queries under `shadows` models, each
    trained by `train` on `size` samples drawn from the pool without replacement. The pool must
    hold none of the queries: every shadow is an *out* model for every query (offline LiRA)."""
    Range(1, integer=True).check("shadows", shadows)
    Range(1, len(pool_y), integer=True).check("shadow training size", size)
    rng = np.random.default_rng(seed)
    out = np.empty((shadows, len(query_y)))
    for k in range(shadows):
        pick = rng.choice(len(pool_y), size, replace=False)
        model = train(pool_x[pick], pool_y[pick], seed + 1 + k)
        out[k] = logit_confidence(model, query_x, query_y)
    return out


OWN_VARIANCE_FROM = 64  # shadows; fewer: one variance for all queries (Carlini et al. 2022, 5.2)


def lira_offline_scores(
    target: np.ndarray, shadow: np.ndarray, *, global_variance: bool | None = None
) -> np.ndarray:
    """Offline LiRA: each query's confidence under the target, in standard deviations above the
    mean of its *out* distribution N(mu_q, sigma^2) fitted to the shadows' confidences.

    Carlini et al. score 1 - P(Z > target), Z ~ N(mu_q, sigma_q^2); that is monotone in the
    one-sided z-score returned here, which keeps the extreme tail's order where the probability
    would round to 1. With fewer than OWN_VARIANCE_FROM shadows a per-query variance is too
    noisy, so sigma^2 is pooled: the mean over queries of each query's unbiased variance."""
    target, shadow = np.asarray(target, dtype=np.float64), np.asarray(shadow, dtype=np.float64)
    if shadow.ndim != 2 or shadow.shape[1] != len(target):
        raise DataError(
            f"shadow confidences of shape {shadow.shape} for {len(target)} queries",
            hint="pass one row per shadow model, one column per query",
        )
    if shadow.shape[0] < 2:
        raise DataError(
            "LiRA needs at least 2 shadow models to fit a variance", hint="use --shadows 2 or more"
        )
    if global_variance is None:
        global_variance = shadow.shape[0] < OWN_VARIANCE_FROM
    mu = shadow.mean(0)
    var = shadow.var(0, ddof=1)
    if global_variance:
        var = np.full_like(var, var.mean())
    return (target - mu) / np.sqrt(var + 1e-12)


# ---------------------------------------------------------------------------------------------
# CVAE decoders (white-box: the attacker holds the uploaded decoder(z, onehot) -> sample)


def _onehot(y: np.ndarray, num_classes: int) -> torch.Tensor:
    return F.one_hot(torch.as_tensor(np.asarray(y, dtype=np.int64)), num_classes).float()


def _mse(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean squared difference per sample over all of its values."""
    return (a - b).flatten(1).pow(2).mean(1)


def _frozen(decoder: nn.Module):
    """The decoder's parameters, switched to need no gradient (restore with `_restore`)."""
    was = [(p, p.requires_grad) for p in decoder.parameters()]
    for p, _ in was:
        p.requires_grad_(False)
    return was


def _restore(was) -> None:
    for p, flag in was:
        p.requires_grad_(flag)


@dataclass(frozen=True)
class Reconstruction:
    """How the latent is searched: `restarts` starts from N(0, I), `steps` Adam steps each."""

    restarts: int = 4
    steps: int = 100
    lr: float = 0.1
    batch: int = 256  # queries optimised together (memory: batch x restarts samples)

    def __post_init__(self) -> None:
        for name in ("restarts", "steps", "batch"):
            Range(1, integer=True).check(name, getattr(self, name))
        Range(0, low_open=True).check("lr", self.lr)


def reconstruction_distances(
    decoder: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    num_classes: int,
    how: Reconstruction = Reconstruction(),  # noqa: B008 (frozen: a shared default is safe)
    *,
    seed: int = 0,
) -> np.ndarray:
    """Per query (x, y): min over z of the mean squared distance between decoder(z, y) and x,
    searched by Adam from `how.restarts` random starts; the least distance seen at any step.

    Each (restart, query) pair has its own z and the total loss is the sum of their distances,
    so the pairs do not interact: Adam's per-coordinate steps are each pair's own."""
    latent = int(decoder.latent_dim)
    gen = torch.Generator().manual_seed(seed)
    xt = torch.as_tensor(np.asarray(x, dtype=np.float32))
    onehot = _onehot(y, num_classes)
    decoder.eval()
    was = _frozen(decoder)
    best = []
    try:
        for i in range(0, len(xt), how.batch):
            xb, ob = xt[i : i + how.batch], onehot[i : i + how.batch]
            r, n = how.restarts, len(xb)
            target = xb.repeat(r, *([1] * (xb.dim() - 1)))  # restart-major: row j*n + q
            labels = ob.repeat(r, 1)
            z = torch.randn(r * n, latent, generator=gen).requires_grad_(True)
            opt = torch.optim.Adam([z], lr=how.lr)
            least = torch.full((r * n,), float("inf"))
            for _ in range(how.steps):
                dist = _mse(decoder(z, labels), target)
                least = torch.minimum(least, dist.detach())
                opt.zero_grad(set_to_none=True)
                dist.sum().backward()
                opt.step()
            with torch.no_grad():
                least = torch.minimum(least, _mse(decoder(z, labels), target))
            best.append(least.view(r, n).min(0).values)
    finally:
        _restore(was)
    return torch.cat(best).double().numpy()


@torch.no_grad()
def sample_distances(
    decoder: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    num_classes: int,
    *,
    samples: int = 2000,
    seed: int = 0,
) -> np.ndarray:
    """Per query (x, y): the mean squared distance to the nearest of `samples` draws
    decoder(z, y), z ~ N(0, I) (a black-box view of the decoder: it only needs samples)."""
    Range(1, integer=True).check("samples", samples)
    latent = int(decoder.latent_dim)
    gen = torch.Generator().manual_seed(seed)
    decoder.eval()
    xt = torch.as_tensor(np.asarray(x, dtype=np.float32)).flatten(1)
    y = np.asarray(y, dtype=np.int64)
    out = np.full(len(y), np.inf)
    for c in np.unique(y):
        z = torch.randn(samples, latent, generator=gen)
        drawn = decoder(z, _onehot(np.full(samples, c), num_classes)).flatten(1)
        rows = np.flatnonzero(y == c)
        # ||a - b||^2 / D, from cdist; squared after the min (monotone).
        nearest = torch.cdist(xt[rows].double(), drawn.double()).min(1).values
        out[rows] = (nearest.pow(2) / xt.shape[1]).numpy()
    return out


def distance_scores(distance: np.ndarray, reference: np.ndarray | None = None) -> np.ndarray:
    """Scores from distances (closer: more likely a member). With a reference decoder's
    distances for the same queries, each query is judged against how hard it is to reach at
    all: score = reference - target (Chen et al. 2020's calibration)."""
    distance = np.asarray(distance, dtype=np.float64)
    if reference is None:
        return -distance
    return np.asarray(reference, dtype=np.float64) - distance


# ---------------------------------------------------------------------------------------------
# Label counts: what a class histogram says about who sent it


@dataclass(frozen=True)
class Linkage:
    """Each client's histogram of one part of its data matched to the nearest (total variation
    between class proportions) histogram of the other part of every client's data."""

    clients: int
    linked: int  # clients whose nearest histogram was their own
    unique: int  # clients whose exact histogram (the upload's) no other client shares

    @property
    def rate(self) -> float:
        return self.linked / self.clients

    @property
    def chance(self) -> float:
        """A guess's rate: 1 / clients."""
        return 1 / self.clients

    def as_dict(self) -> dict:
        return {**asdict(self), "rate": self.rate, "chance": self.chance}


def histogram_linkage(first: np.ndarray, second: np.ndarray) -> Linkage:
    """How often a client's label counts of one part of its data (`first[c]`, e.g. the upload)
    pick out the same client's counts of another part (`second[c]`, e.g. a later upload, or
    counts the server learns elsewhere) among all clients'. Rows: clients; columns: classes."""
    first = np.asarray(first, dtype=np.float64)
    second = np.asarray(second, dtype=np.float64)
    if first.shape != second.shape or first.ndim != 2 or len(first) < 2:
        raise DataError(
            f"label counts of shapes {first.shape} and {second.shape}",
            hint="pass two (clients, classes) arrays of the same shape, 2 clients or more",
        )
    if np.any(first.sum(1) <= 0) or np.any(second.sum(1) <= 0):
        raise DataError("a client holds no samples in one of the parts", hint="drop it")
    p = first / first.sum(1, keepdims=True)
    q = second / second.sum(1, keepdims=True)
    tv = 0.5 * np.abs(p[:, None, :] - q[None, :, :]).sum(2)  # tv[a, b]: a's first vs b's second
    linked = int(np.sum(tv.argmin(1) == np.arange(len(p))))
    _, inverse, counts = np.unique(first, axis=0, return_inverse=True, return_counts=True)
    unique = int(np.sum(counts[np.ravel(inverse)] == 1))
    return Linkage(clients=len(p), linked=linked, unique=unique)
