"""A global model for every device class (`server fuse --for smartphone,wristband`).

For each named device profile the server picks the largest zoo classifier that runs within the
class's inference budget (edgefl.models.plan.plan_inference) and distils the method's fused
global model into it:

- transfer data, decided from the result, never from the method's name: the samples the method
  trained on when it exposes them (`FusionResult.samples`: decoder or generator draws, a public
  set), else samples inverted from the global model itself (`fusion.inversion.invert`);
- loss: KL(softmax(teacher / T) || softmax(student / T)) x T^2 (Hinton et al. 2015) at T = 4
  (pFedZKD's tau; between FedDF's 1 and DENSE's 20: the global model is confident on its own
  training samples, and a softer target carries the class similarities a small student lacks),
  the teacher run on the same jittered batch as the student (the shared train-time jitter by
  input kind), Adam with a cosine schedule.

A class whose budget already holds the global model gets the global model itself: a student
cannot be expected to beat its teacher, and it costs no training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from edgefl.bounds import Range, check_fields, declare, declared
from edgefl.data import DATASETS
from edgefl.errors import ConfigError, EdgeflError
from edgefl.fusion.base import FusionContext, FusionResult
from edgefl.fusion.generator import kl_at
from edgefl.fusion.inversion import invert
from edgefl.models.augment import jitter
from edgefl.models.cost import costs
from edgefl.models.plan import inference_misfit, plan_inference
from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import build_model, spec_label
from edgefl.profiles import Profile, get_profile

TEMPERATURE = 4.0
LR = 1e-3
BATCH = 64
INVERSION_STEPS = 200  # pFedZKD's default here
INVERSION_LR = 0.1
EPOCHS = 20  # --for-epochs' default (cli.common declares the flag with the same number)
SAMPLES = 5000  # --for-samples' default: most transfer samples a student trains on


COUNT = Range(1, integer=True)


@declared(profiles=())
@dataclass(frozen=True)
class ClassRequest:
    """What `--for` asks for, checked before any upload is read."""

    profiles: tuple[Profile, ...]
    epochs: int = declare(COUNT, EPOCHS, flag="--for-epochs", hint="e.g. --for-epochs 20")
    samples: int = declare(COUNT, SAMPLES, flag="--for-samples", hint="e.g. --for-samples 5000")
    # cap on a student's MACs (a CPU server trains it)
    max_macs: int | None = declare(
        COUNT, None, flag="--for-max-macs", hint="leave it out for no cap"
    )

    def __post_init__(self) -> None:
        check_fields(self)

    def targets(self, out: Path) -> list[tuple[Profile, Path]]:
        """Each class's model beside the global one: G.onnx -> G.<profile>.onnx."""
        return [(p, out.with_name(f"{out.stem}.{p.name}.onnx")) for p in self.profiles]


def parse_request(
    text: str | None,
    *,
    epochs: int = EPOCHS,
    samples: int = SAMPLES,
    max_macs: int | None = None,
    eval_ref: str | None = None,
) -> ClassRequest | None:
    """`--for a,b` -> the profiles (names or TOML paths), every one known and able to hold some
    zoo classifier for the task (the --eval dataset's when given, else any dataset's)."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError("--for expects device profiles", hint="e.g. --for smartphone,wristband")
    req = ClassRequest((), epochs, samples, max_macs)  # its numbers, before the profiles load
    profiles = _profiles(names)
    req = ClassRequest(tuple(profiles), epochs, samples, max_macs)
    tasks = _tasks(eval_ref)
    for p in profiles:
        _check_fits(p, tasks, max_macs)
    return req


def _profiles(names: list[str]) -> list[Profile]:
    """The profile of each name (or TOML path), each device class named once."""
    profiles = []
    for name in names:
        try:
            profiles.append(get_profile(name))
        except EdgeflError as exc:
            raise ConfigError(f"--for {name!r}: {exc.message}", hint=exc.hint) from None
    seen = [p.name for p in profiles]
    if len(set(seen)) != len(seen):
        raise ConfigError(
            f"--for names a device class twice: {', '.join(seen)}", hint="name each profile once"
        )
    return profiles


def _check_fits(p: Profile, tasks: list[tuple[tuple[int, ...], int]], max_macs: int | None) -> None:
    """The class holds some zoo classifier for one of `tasks`, else the first task's reason."""
    errors = []
    for shape, classes in tasks:
        try:
            plan_inference(p, shape, classes, max_macs=max_macs)
            return
        except EdgeflError as exc:
            errors.append(exc)
    raise ConfigError(f"--for {p.name}: {errors[0].message}", hint=errors[0].hint)


def _tasks(eval_ref: str | None) -> list[tuple[tuple[int, ...], int]]:
    """The tasks a class's model may be for before the uploads say which: the --eval dataset's,
    or every registered dataset's."""
    from edgefl.data import parse_dataset_ref

    if eval_ref:
        name = parse_dataset_ref(eval_ref)[0]
        if name in DATASETS:
            info = DATASETS.get(name)
            return [(tuple(info.input_shape), info.num_classes)]
    return list(dict.fromkeys((tuple(i.input_shape), i.num_classes) for i in DATASETS))


def check_task(req: ClassRequest, input_shape, num_classes: int) -> None:
    """After the ingest, before any fusion: every class holds some classifier for this task."""
    for p in req.profiles:
        try:
            plan_inference(p, input_shape, num_classes, max_macs=req.max_macs)
        except EdgeflError as exc:
            raise ConfigError(f"--for {p.name}: {exc.message}", hint=exc.hint) from None


# --- one class -------------------------------------------------------------------------------


def student_for(profile: Profile, ctx: FusionContext, result: FusionResult, max_macs):
    """(spec, None) to distil into, or (global spec, global model) when the global model already
    fits the class's inference budget."""
    if result.spec is not None and not inference_misfit(result.spec, profile):
        return result.spec, result.model
    return plan_inference(profile, ctx.input_shape, ctx.num_classes, max_macs=max_macs), None


def transfer_set(ctx: FusionContext, result: FusionResult, teacher, n: int, seed: int):
    """(inputs, where they came from): up to n of the method's own samples, else inverted."""
    gen = torch.Generator().manual_seed(seed)
    if result.samples is not None and len(result.samples):
        x = result.samples
        if len(x) > n:
            x = x[torch.randperm(len(x), generator=gen)[:n]]
        return x.float().cpu(), "method samples"
    # Inverted from the global model: the classes the federation holds, evenly.
    held = torch.from_numpy(ctx.label_counts > 0)
    classes = torch.nonzero(held).flatten() if held.any() else torch.arange(ctx.num_classes)
    targets = torch.eye(ctx.num_classes)[classes.repeat(math.ceil(n / len(classes)))[:n]]
    x = invert(
        teacher,
        targets,
        ctx.input_shape,
        steps=INVERSION_STEPS,
        lr=INVERSION_LR,
        tau=1.0,
        gen=gen,
        device=ctx.device,
    )
    return x, "inverted from the global model"


def distil(
    teacher, spec: ModelSpec, x: torch.Tensor, *, epochs: int, seed: int, device, progress=None
) -> tuple[torch.nn.Module, list[float]]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        student = build_model(spec).to(device)
    teacher = teacher.to(device).eval()
    opt = torch.optim.Adam(student.parameters(), lr=LR)
    steps = epochs * math.ceil(len(x) / BATCH)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    gen = torch.Generator().manual_seed(seed)
    history = []
    student.train()
    for epoch in range(epochs):
        total = 0.0
        for idx in torch.randperm(len(x), generator=gen).split(BATCH):
            xb = jitter(x[idx], "auto", gen).to(device)
            with torch.no_grad():
                target = teacher(xb).float()
            loss = kl_at(target, student(xb), TEMPERATURE)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        history.append(total / len(x))
        if progress:
            progress("epoch", epoch + 1, epochs, f"KL {history[-1]:.4f}")
    return student.eval(), history


def class_entry(
    profile: Profile, spec: ModelSpec, path: Path, staged: Path, sha256: str, **extra: Any
) -> dict[str, Any]:
    c = costs(spec)
    return {
        "profile": profile.name,
        "model": str(path),
        "bytes": staged.stat().st_size,
        "sha256": sha256,
        "spec": spec_label(spec),
        "costs": {
            "macs": c.macs,
            "params": c.params,
            "weight_bytes": c.weight_bytes,
            "infer_peak_bytes": c.infer_peak_bytes,
        },
        "budget": {
            "ram_budget_bytes": profile.ram_budget_bytes,
            "storage_bytes": profile.storage_bytes,
        },
        **extra,
    }
