"""FedGH: a generalized global prediction header trained on class-mean representations
(Yi et al., ACM MM 2023; shared/papers/fedgh.txt, Sec. 3.2 and Algorithm 1), one-shot.

Clients upload, per class s they hold, the local averaged representation R_k^s (prototypes
artifacts, edgefl.client.weightless). The server trains one shared header H = Linear(R, C) with
cross-entropy on the (R_k^s, s) pairs (eq. 4) and exports it as the global model: input
"representation" [B, R] -> logits. Each client splices it in with `edgefl client apply-header`.

The official code steps the wrong optimizer, so its header never changes (methods.md); ours
trains it, as HtFLlib does: SGD lr 0.01 (the paper's eta_theta), 100 epochs over the pairs,
batch 10. `header=PATH` continues from a previous round's header (multi-round FedGH).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

import exporters
from edgefl.artifacts import read_header
from edgefl.errors import ArtifactError, ConfigError, FusionError
from edgefl.fusion.base import FusionContext, FusionResult, Method
from edgefl.fusion.config import FusionConfig
from edgefl.fusion.options import option
from edgefl.fusion.student import shuffled_epochs


@dataclass(frozen=True)
class FedGHConfig(FusionConfig):
    """Paper: SGD with eta_theta = 0.01. HtFLlib: 100 server epochs, batch 10."""

    epochs: int = option(100, "header epochs over the prototypes (HtFLlib: 100)", low=1)
    lr: float = option(0.01, "header SGD learning rate (paper's eta_theta)", low=0, low_open=True)
    batch_size: int = option(10, "batch size (HtFLlib: 10)", low=1)
    header: str | None = option(
        None, "a previous global header (.onnx) to continue training (multi-round)"
    )


def collect_prototypes(ctx: FusionContext):
    """(reps P x R, labels P, per-upload summary, rejected) from every prototypes upload whose
    representation size is the majority's (one header cannot take two input sizes)."""
    uploads = [u for u in ctx.uploads if u.kind == "prototypes"]
    if not uploads:
        raise FusionError(
            "fedgh needs prototypes uploads",
            hint="have the devices run `edgefl client prototypes`, or fuse with another method",
        )
    sizes = Counter(u.meta["representation_size"] for u in uploads)
    rep = sizes.most_common(1)[0][0]
    reps, labels, used, rejected = [], [], [], []
    for u in uploads:
        if u.meta["representation_size"] != rep:
            rejected.append(
                {
                    "file": u.name,
                    "reason": (
                        f"representation size {u.meta['representation_size']} differs from the "
                        f"majority's {rep}"
                    ),
                }
            )
            continue
        means = exporters.read_constant_outputs(u.artifact.model)["prototypes"]
        reps.append(means.astype(np.float32))
        labels.append(np.asarray(u.meta["classes"], dtype=np.int64))
        used.append(
            {"client_id": u.client_id, "classes": u.meta["classes"], "counts": u.meta.get("counts")}
        )
    return np.concatenate(reps), np.concatenate(labels), used, rejected


def load_header(path: str, rep: int, classes: int) -> dict[str, torch.Tensor]:
    """Weights of a previous header: the server's own output, still validated (it is a file)."""
    try:
        weight, bias = read_header(path, rep, classes)
    except ArtifactError as exc:
        raise ConfigError(
            f"--header: {exc.message}",
            hint=exc.hint or "pass a header a previous fedgh fusion wrote",
        ) from None
    return {"weight": torch.from_numpy(weight), "bias": torch.from_numpy(bias)}


def train_header(
    header: nn.Linear, reps: np.ndarray, labels: np.ndarray, cfg: FedGHConfig, device, progress
) -> list[float]:
    """Eq. (4): SGD on CE(H(R_k^s), s) over every uploaded pair."""
    x, y = torch.from_numpy(reps), torch.from_numpy(labels)
    opt = torch.optim.SGD(header.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed)
    header.to(device).train()

    def loss_of(idx):
        return F.cross_entropy(header(x[idx].to(device)), y[idx].to(device))

    history = shuffled_epochs(
        opt,
        len(x),
        loss_of,
        epochs=cfg.epochs,
        batch_size=cfg.batch_size,
        gen=gen,
        progress=progress,
        note="CE",
        what="the global header",
    )
    header.eval()
    return history


def fuse(ctx: FusionContext, cfg: FedGHConfig) -> FusionResult:
    with ctx.stage("collect"):
        reps, labels, used, rejected = collect_prototypes(ctx)
    rep = reps.shape[1]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        header = nn.Linear(rep, ctx.num_classes)
    if cfg.header:
        header.load_state_dict(load_header(cfg.header, rep, ctx.num_classes))
    with ctx.stage("train"):
        history = train_header(header, reps, labels, cfg, ctx.device, ctx.progress)
    with torch.no_grad():
        fit = header(torch.from_numpy(reps).to(ctx.device)).argmax(1).cpu().numpy() == labels
    info = {
        "prototypes": len(labels),
        "prototypes_per_class": np.bincount(labels, minlength=ctx.num_classes).tolist(),
        "representation_size": rep,
        "clients": used,
        "rejected_prototypes": rejected,
        "continued_from": cfg.header,
        "loss_history": history,
        "prototype_accuracy": float(fit.mean()),
    }
    return FusionResult(header.cpu(), None, info, input_shape=(rep,), input_name="representation")


METHOD = Method(
    name="fedgh",
    description="shared prediction header trained on uploaded class-mean representations",
    paper="Yi et al., FedGH, ACM MM 2023",
    consumes=("prototypes",),
    needs_modules=False,
    config_cls=FedGHConfig,
    fuse=fuse,
    judged="per-client",  # FedGH's metric: personalized models on local test splits
    personalize="header",  # each client splices the header into its own model
    divergences=(
        "the official server loop (LipingYi/FedGH, FedGH_Codes/experiments/FLHetero/FedGH.py) "
        "backpropagates into the header but steps the clients' optimizer, so the header never "
        "changes; edgefl trains it under every budget (a defect, not a setting to copy)",
    ),
)
