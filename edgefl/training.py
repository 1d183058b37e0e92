"""Local training on a device: a classifier (cross-entropy) or a CVAE (BCE + KL).

Deterministic under a seed (own batching from a seeded generator, no DataLoader workers), and
the optimizer and batch size come from the device profile, so the memory the cost model
estimated is the memory actually used. It sits below both `edgefl.search` (which trains every
candidate) and `edgefl.client` (which trains the chosen model), and imports only models and errors.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from device_profiles import OPTIMIZERS
from edgefl.bounds import SEED, OneOf, Range, check_fields, declare, declared
from edgefl.errors import ConfigError, DataError
from edgefl.models.augment import CHOICES as AUGMENT_CHOICES
from edgefl.models.augment import jitter
from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import build_model
from edgefl.privacy import DPConfig, plan_dp
from edgefl.privacy.dpsgd import default_chunk, dp_ready, dp_train_epoch

# Default learning rates by (role, optimizer). FedMHO: VGG-9 SGD(0.9) lr 5e-3 over 200 epochs;
# we train 10-20 epochs, so SGD starts higher. CVAE: Adam 1e-3 (methods.md: safer than 5e-2).
DEFAULT_LR = {
    ("classifier", "sgd"): 0.05,
    ("classifier", "sgd-momentum"): 0.01,
    ("classifier", "adam"): 1e-3,
    ("generator", "sgd"): 0.05,
    ("generator", "sgd-momentum"): 0.01,
    ("generator", "adam"): 1e-3,
}


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread for the block, then as before: a device trains single-threaded
    (and so a simulation's results never depend on how many clients run at once), and tiny nets
    only pay synchronisation for a second thread (~15x slower on 2 busy cores, measured)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


COUNT = Range(1, integer=True)
# A learning rate torch's float32 optimizers can hold (1e39 overflowed inside the optimizer);
# no useful one is near the bound.
LR = Range(0, 1e6, low_open=True)


@declared(epochs=1, batch_size=1, optimizer="sgd", lr=0.1)
@dataclass(frozen=True)
class TrainConfig:
    epochs: int = declare(COUNT)
    batch_size: int = declare(COUNT)
    optimizer: str = declare(OneOf(OPTIMIZERS), flag="optimizer")  # the profile's
    lr: float = declare(LR)
    seed: int = declare(SEED, 0)
    weight_decay: float = declare(Range(0), 0.0)
    # train-time jitter (edgefl.models.augment): none | rotate | affine
    augment: str = declare(OneOf(AUGMENT_CHOICES), "none")
    # "cpu" on a device; a simulation may train its clients on a GPU (the model comes back on
    # the CPU for evaluation and export either way).
    device: str = "cpu"
    dp: DPConfig | None = None  # DP-SGD for this request (edgefl.privacy); None: plain training
    # DP-SGD's batches and noise: None draws them from the system's entropy (a device: a seed
    # written anywhere would let the server replay the noise and undo the guarantee); a
    # simulation may seed them to be reproducible, and its record says so.
    noise_seed: int | None = declare(SEED, None)
    # DP-SGD's samples clipped at once: the planner sizes it to the device's memory budget
    # (edgefl.models.cost.Costs.dp_chunk); None: edgefl.privacy.dpsgd.default_chunk.
    dp_chunk: int | None = declare(COUNT, None, flag="dp_chunk")

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class TrainSummary:
    epochs: int
    final_loss: float
    val_accuracy: float | None  # classifiers
    val_loss: float | None
    seconds: float
    samples: int
    interrupted: bool = False
    privacy: dict | None = None  # the DPPlan trained under (DPPlan.as_dict()), for the upload
    # What stopped it (Ctrl-C, or the CLI's SIGTERM subclass), raised again by `stop_if_interrupted`
    # so that the command exits as that signal says (130 or 143)
    stop: KeyboardInterrupt | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "stop"}


def stop_if_interrupted(summary: TrainSummary | None) -> None:
    """Raise what interrupted `summary`'s training, if anything did: its caller publishes
    nothing of a half-trained model."""
    if summary is not None and summary.interrupted:
        raise summary.stop or KeyboardInterrupt()


def make_optimizer(params, cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    momentum = 0.9 if cfg.optimizer == "sgd-momentum" else 0.0
    return torch.optim.SGD(params, lr=cfg.lr, momentum=momentum, weight_decay=cfg.weight_decay)


def init_model(spec: ModelSpec, fed_seed: int) -> nn.Module:
    """Build with weights drawn from the federation seed: every client of one architecture starts
    identical, which one-shot parameter averaging (FedAvg, FedMHO's w0) requires."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(fed_seed)
        return build_model(spec)


def _batches(n: int, batch_size: int, gen: torch.Generator, min_last: int = 1):
    """Shuffled batches of `batch_size`; a last one under `min_last` samples is left out of
    this epoch (BatchNorm takes no batch of one sample where a map is 1x1: a NAS spec on a
    shard of 17, 33, ... samples failed its last batch). Left out, not joined to the batch
    before it: no step may hold more than the batch the planner counted."""
    order = torch.randperm(n, generator=gen)
    for i in range(0, n, batch_size):
        if n - i >= min_last or i == 0:
            yield order[i : i + batch_size]


def _min_batch(model: nn.Module) -> int:
    return 2 if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()) else 1


def cvae_loss(recon, x, mu, logvar) -> torch.Tensor:
    """BCE(sum) + KL(q(z|x,y) || N(0, I)), divided by the batch size (FedMHO code)."""
    bce = F.binary_cross_entropy(recon.flatten(1), x.flatten(1), reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return (bce + kld) / len(x)


Progress = Callable[[int, int, float], None]  # (epoch, total epochs, loss) after each epoch
# (task, done, total, note): edgefl.progress's form; DP-SGD reports its steps through it.
StepProgress = Callable[..., None]
DP_TASK = "DP-SGD step"  # an epoch under DP can take minutes: its steps show progress and ETA


def train(
    model: nn.Module,
    role: str,
    x: np.ndarray,
    y: np.ndarray,
    num_classes: int,
    cfg: TrainConfig,
    *,
    x_val: np.ndarray | None = None,
    y_val: np.ndarray | None = None,
    on_epoch: Progress | None = None,
    on_progress: StepProgress | None = None,
) -> TrainSummary:
    """Train `model` in place. Ctrl-C stops after the current batch and returns what was trained
    so far with `interrupted=True`; the caller decides not to publish it. Under DP-SGD,
    `on_progress(DP_TASK, step, all steps)` follows every step (epochs alone can be minutes)."""
    if len(x) == 0:
        raise DataError(
            "this client's shard is empty: nothing to train on",
            hint="use fewer clients, a larger alpha, or another --client-index",
        )
    plan = _dp_plan(model, len(x), cfg)  # refuses before any training
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    dev = torch.device(cfg.device)
    model.to(dev)
    xt, yt = torch.from_numpy(x).to(dev), torch.from_numpy(y).to(dev)
    opt = make_optimizer(model.parameters(), cfg)
    epoch_of = _epoch_step(model, role, (xt, yt, num_classes), cfg, plan, opt, gen)
    start = time.perf_counter()
    model.train()
    loss_value, epochs_done, stop = _epochs(epoch_of, cfg, plan, on_epoch, on_progress)
    model.to("cpu").eval()
    val_acc = val_loss = None
    if x_val is not None and len(x_val):
        # at the training batch, as the budget was checked for (512 at once: 4.3 MB on a band)
        val_acc, val_loss = evaluate(model, role, x_val, y_val, num_classes, cfg.batch_size)
    return TrainSummary(
        epochs=epochs_done,
        final_loss=float(loss_value),
        val_accuracy=val_acc,
        val_loss=val_loss,
        seconds=time.perf_counter() - start,
        samples=len(x),
        interrupted=stop is not None,
        privacy=plan.as_dict() if plan is not None else None,
        stop=stop,
    )


def _epochs(epoch_of, cfg: TrainConfig, plan, on_epoch, on_progress):
    """(last loss, epochs done, the KeyboardInterrupt that stopped them or None): the epochs of
    `epoch_of`, a diverged loss refused with the fix."""
    loss_value, epochs_done = math.nan, 0
    try:
        for epoch in range(cfg.epochs):
            loss_value = epoch_of(_step_reporter(on_progress, plan, epoch, cfg.epochs))
            epochs_done = epoch + 1
            if not math.isfinite(loss_value):
                raise ConfigError(
                    f"training diverged (loss {loss_value}) at epoch {epoch + 1} at lr {cfg.lr:g}",
                    hint="lower --lr",
                )
            if on_epoch:
                on_epoch(epochs_done, cfg.epochs, loss_value)
    except KeyboardInterrupt as exc:
        return loss_value, epochs_done, exc
    return loss_value, epochs_done, None


def _step_reporter(on_progress, plan, epoch: int, epochs: int):
    """DP-SGD's per-step callback for `epoch` (0-based): steps counted over all epochs."""
    if on_progress is None or plan is None:
        return None
    per_epoch = plan.steps // epochs

    def on_step(done: int) -> None:
        on_progress(DP_TASK, epoch * per_epoch + done, plan.steps, f"epoch {epoch + 1}/{epochs}")

    return on_step


def _train_epoch(model, role, xt, yt, num_classes, cfg: TrainConfig, opt, gen) -> float:
    """One pass over (xt, yt) in `cfg.batch_size` batches; the mean loss per sample.

    Memory (what `edgefl.models.cost.Costs.train_bytes` counts): the batch and its outputs die
    with `_backward`'s frame before the optimizer steps, and the gradients are freed right after
    it, so neither overlaps the next batch's forward. The same operations in the same order as
    zeroing before each backward: the same weights bit for bit."""
    total, count = 0.0, 0
    opt.zero_grad(set_to_none=True)
    for idx in _batches(len(xt), cfg.batch_size, gen, _min_batch(model)):  # drawn on the CPU
        loss = _backward(model, role, xt, yt, idx.to(xt.device), num_classes, cfg.augment, gen)
        if not math.isfinite(loss):
            return loss  # diverged: `train` says so now, not at the epoch's end
        opt.step()
        opt.zero_grad(set_to_none=True)
        total += loss * len(idx)
        count += len(idx)
    return total / count


def _backward(model, role, xt, yt, idx, num_classes, augment, gen) -> float:
    """The gradients of batch `idx`'s loss; its value."""
    xb, yb = jitter(xt[idx], augment, gen), yt[idx]
    if role == "classifier":
        loss = F.cross_entropy(model(xb), yb)
    else:
        recon, mu, logvar = model(xb, F.one_hot(yb, num_classes).float())
        # BCE refuses a decoder output outside [0, 1]: NaNs from diverged weights would raise
        # deep in torch on a CPU and, on a GPU, assert on the device and take the process's
        # CUDA context with it (cvae-large at the paper's Adam lr 5e-2, MNIST and Fashion)
        if not bool(torch.isfinite(recon).all()):
            return math.nan
        loss = cvae_loss(recon, xb, mu, logvar)
    loss.backward()
    return loss.item()


def _dp_plan(model, samples, cfg: TrainConfig):
    """The DP-SGD plan for this request, or None without --dp; refuses a model it cannot train."""
    if cfg.dp is None:
        return None
    reason = dp_ready(model)
    if reason is not None:
        raise ConfigError(
            f"--dp cannot train this model: {reason}",
            hint="pick a model without BatchNorm, e.g. --model scnn:bn=false",
        )
    return plan_dp(cfg.dp, samples, cfg.batch_size, cfg.epochs)


def _cvae_loss_of_one(forward, x, onehot):
    recon, mu, logvar = forward(x, onehot)
    return cvae_loss(recon, x, mu, logvar)


def _cvae_losses(forward, x, onehot):
    """Each sample's CVAE loss (cvae_loss of a batch of one, for the whole batch at once)."""
    recon, mu, logvar = forward(x, onehot)
    bce = F.binary_cross_entropy(recon.flatten(1), x.flatten(1), reduction="none").sum(1)
    return bce - 0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(1)


def _classifier_losses(forward, x, y):
    return F.cross_entropy(forward(x), y, reduction="none")


def _epoch_step(model, role, data, cfg: TrainConfig, plan, opt, gen) -> Callable[[], float]:
    """One epoch's training, plain or DP-SGD under `plan` (its batches and noise from their own
    generator, secret unless the request seeds it)."""
    xt, yt, num_classes = data
    if plan is None:
        return lambda on_step: _train_epoch(model, role, xt, yt, num_classes, cfg, opt, gen)
    gens = (gen, _noise_generator(cfg))
    return lambda on_step: _dp_epoch(
        model, role, xt, yt, num_classes, cfg, plan, opt, gens, on_step
    )


def _noise_generator(cfg: TrainConfig) -> torch.Generator:
    seed = cfg.noise_seed if cfg.noise_seed is not None else secrets.randbits(63)
    return torch.Generator().manual_seed(seed)


def _dp_epoch(
    model, role, xt, yt, num_classes, cfg: TrainConfig, plan, opt, gens, on_step=None
) -> float:
    """One epoch of DP-SGD under `plan`, with the same losses taken per sample; `gens`: (the
    augmentation's generator, the one for the batches and the noise). Labels go in one-hot for a
    CVAE: F.one_hot cannot run inside torch.func's vmap."""
    gen, noise = gens
    if role == "classifier":
        target, loss_of_one = None, lambda forward, x, y: F.cross_entropy(forward(x), y)
        losses_of = _classifier_losses
    else:
        target, loss_of_one = _one_hot(num_classes), _cvae_loss_of_one
        losses_of = _cvae_losses
    return dp_train_epoch(
        model,
        loss_of_one,
        xt,
        yt,
        sample_rate=plan.sample_rate,
        noise_multiplier=plan.noise_multiplier,
        clip=plan.clip,
        opt=opt,
        gen=noise,
        transform=lambda xb: jitter(xb, cfg.augment, gen),
        chunk=cfg.dp_chunk if cfg.dp_chunk is not None else default_chunk(model),
        losses_of=losses_of,
        on_step=on_step,
        target=target,
    )


def _one_hot(num_classes: int):
    return lambda y: F.one_hot(y, num_classes).float()


@torch.no_grad()
def evaluate(model, role, x, y, num_classes, batch_size: int = 512):
    """(accuracy, mean loss) for a classifier; (None, mean CVAE loss) for a generator."""
    model.eval()
    correct, loss_sum = 0, 0.0
    gen = torch.Generator().manual_seed(0)  # the CVAE's sampling noise, fixed for comparability
    for i in range(0, len(x), batch_size):
        xb = torch.from_numpy(x[i : i + batch_size])
        yb = torch.from_numpy(y[i : i + batch_size])
        if role == "classifier":
            logits = model(xb)
            loss_sum += F.cross_entropy(logits, yb, reduction="sum").item()
            correct += (logits.argmax(1) == yb).sum().item()
        else:
            onehot = F.one_hot(yb, num_classes).float()
            mu, logvar = model.encoder(xb, onehot)
            z = mu + torch.exp(0.5 * logvar) * torch.randn(mu.shape, generator=gen)
            loss_sum += cvae_loss(model.decoder(z, onehot), xb, mu, logvar).item() * len(xb)
    n = max(1, len(x))
    return (correct / n if role == "classifier" else None), loss_sum / n
