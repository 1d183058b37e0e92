"""Teacher passes: the classifier uploads' logits on a fusion's samples, a group at a time, each
teacher run in its evaluation form.

Why an evaluation form (bench/results/teacher_pass.md): on a CPU, torch's max-pool kernel for
NCHW tensors runs at a fraction of the speed of the convolutions around it; in the `cnn` teacher
its two pools took over half of a forward. A pool whose window equals its stride, without
padding, is the element-wise maximum of its window's strided slices, which is the same value bit
for bit (a maximum is exact) and several times faster. The evaluation form is a private copy of
the teacher with those pools replaced and its runs of convolutions, pools and ReLUs kept in
oneDNN's layout between layers (`edgefl.fusion.onednn`, bit for bit too; a pass 1.2-1.4x
faster): the upload's own module, which the ensemble exports, is never touched. Teachers
stacked into one batched module (torch.func's stack_module_state and vmap, or grouped
convolutions) were measured slower on a CPU (bench/results/stacked_teachers.md) and are not
used there.

On a GPU it is the other way round (bench/results/teacher_pass_gpu.md, an H200): one small
teacher at a time leaves the GPU waiting on kernel launches, and the evaluation form's slices
are more of them (2,000 `cnn` teachers: form 21.0 s, plain module 5.3 s, stacked 1.7 s). There
a group's teachers of one architecture are stacked and run as one vmapped module, equal to the
one-by-one logits up to float rounding; a teacher alone of its kind runs as it is.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from edgefl.artifacts.upload import Upload
from edgefl.errors import FusionError
from edgefl.fusion.onednn import keep_layout


def _slice_max(parts: list[torch.Tensor]) -> torch.Tensor:
    # NaN wins, as in max_pool2d: torch.maximum propagates it; a maximum is exact in any order
    out = parts[0]
    for part in parts[1:]:
        out = torch.maximum(out, part)
    return out


def window_max(x: torch.Tensor, kh: int, kw: int) -> torch.Tensor:
    """Max over non-overlapping (kh, kw) windows of the last two dims, from strided slices."""
    ho, wo = x.shape[-2] // kh, x.shape[-1] // kw
    # rows first, then columns: the first pass reads whole rows of x and writes a map kh
    # times smaller, contiguous, for the strided second pass (0.17 -> 0.11 ms over 182 x 10
    # x 24 x 24 against columns first; kh * kw quarter slices read every line kh * kw times)
    rows = _slice_max([x[..., i : i + kh * ho : kh, : kw * wo] for i in range(kh)])
    return _slice_max([rows[..., j : j + kw * wo : kw] for j in range(kw)])


class WindowMax(nn.Module):
    """What a MaxPool with kernel == stride, no padding, dilation 1 and floor mode computes. Where
    a gradient will flow through it (a generator or an input trained through the teacher) it
    is that pool: torch's forward and backward together beat the slices' forward with a
    backward of their own, where 38 % of a Co-Boosting fusion had gone (a Fashion cell's 10
    epochs: 91 -> 69 s, the same weights; bench/results/window_max_backward.md)."""

    def __init__(self, kh: int, kw: int):
        super().__init__()
        self.kh, self.kw = kh, kw

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad and torch.is_grad_enabled():
            return F.max_pool2d(x, (self.kh, self.kw))
        return window_max(x, self.kh, self.kw)


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def _window_of(pool: nn.Module) -> tuple[int, int] | None:
    """(kh, kw) of a pool WindowMax computes exactly, else None."""
    if isinstance(pool, nn.MaxPool2d):
        kernel = _pair(pool.kernel_size)
        stride = _pair(pool.stride if pool.stride is not None else pool.kernel_size)
        if (
            kernel == stride
            and _pair(pool.padding) == (0, 0)
            and _pair(pool.dilation) == (1, 1)
            and not pool.ceil_mode
            and not pool.return_indices
        ):
            return kernel
    return None


def evaluation_form(module: nn.Module, inplace: bool = False) -> nn.Module:
    """A private copy of `module` that computes the same outputs, bit for bit, faster on a CPU:
    its exactly-reproducible max pools replaced (module docstring) and its runs of
    convolutions, pools and ReLUs kept in oneDNN's layout (`edgefl.fusion.onednn`). The module
    itself is left as it is (unless `inplace`: then it is changed and returned, for a copy the
    caller owns); a module with neither such a pool nor a Conv2d is returned as it is, uncopied."""
    if not any(isinstance(m, nn.Conv2d) or _window_of(m) for m in module.modules()):
        return module
    fast = module if inplace else copy.deepcopy(module)
    keep_layout(fast)  # first: its runs then hold the pools replaced below as their plain layers
    pools = [(name, _window_of(m)) for name, m in fast.named_modules()]
    for name, (kh, kw) in [(name, w) for name, w in pools if w is not None]:
        parent_name, _, child = name.rpartition(".")
        parent = fast.get_submodule(parent_name) if parent_name else fast
        setattr(parent, child, WindowMax(kh, kw))
    return fast


# Samples a CPU teacher pass feeds a teacher at once: as many as keep its largest activation
# within ACTIVATION_BYTES, so the maps one layer writes are still in cache when the next reads
# them (bench/results/teacher_pass_2000.md: a 32-filter scnn ran 3x faster at 64 samples than at
# 512 in a probe).
# A teacher's logits do not depend on the batch but for float rounding (tests/fusion/
# test_teacher_form.py): bit for bit on the AMD EPYC this was measured on; on an AVX-512 Xeon
# oneDNN's kernels for another batch size round up to 1.3e-7 apart (a 64-filter scnn).
ACTIVATION_BYTES = 4 << 20
BATCH_RANGE = (32, 512)


def largest_activation(module: nn.Module, sample: torch.Tensor) -> int:
    """Bytes of the largest output of any leaf module of `module` on `sample` (one sample)."""
    sizes = [0]

    def hook(_mod, _inputs, out):
        if isinstance(out, torch.Tensor):
            sizes.append(out.numel() * out.element_size())

    leaves = [m for m in module.modules() if next(m.children(), None) is None]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:  # with a gradient to come: every layer runs as itself (a OneDNNRun's plain layers)
        with torch.enable_grad():
            module(sample.detach().requires_grad_(True))
    finally:
        for h in handles:
            h.remove()
    return max(sizes)


def evaluation_batch(module: nn.Module, x: torch.Tensor, device) -> int:
    """Samples per call of a teacher pass over x (ACTIVATION_BYTES; 512 on an accelerator)."""
    lo, hi = BATCH_RANGE
    if torch.device(device).type != "cpu" or len(x) <= lo:
        return hi
    size = largest_activation(module, x[:1].to(device))
    return max(lo, min(hi, ACTIVATION_BYTES // max(1, size)))


def _on_cpu(device) -> bool:
    return torch.device(device).type == "cpu"


def teacher_logits(upload: Upload, x: torch.Tensor, device: torch.device, batch: int = 0):
    """Logits of one classifier upload on x (no gradient): the rebuilt module's evaluation form
    where there is one, onnxruntime otherwise (artifacts from other tools, int8 uploads); `batch`
    samples a call, by default evaluation_batch's."""
    outs = []
    module = upload.module  # once: a parked upload's is read from disk at each access
    if module is not None:
        module = (evaluation_form(module) if _on_cpu(device) else module).to(device)
        batch = batch or evaluation_batch(module, x, device)
    batch = batch or BATCH_RANGE[1]
    # inference mode, not no_grad: no version counters nor views' autograd metadata (3% of a
    # `cnn` pass); the concatenation below, made outside it, is an ordinary tensor
    with torch.inference_mode():
        for i in range(0, len(x), batch):
            xb = x[i : i + batch]
            if module is not None:
                outs.append(module(xb.to(device)).float().cpu())
            else:
                outs.append(torch.from_numpy(upload.artifact.run(xb.cpu().numpy())))
    return torch.cat(outs) if outs else torch.zeros(0, upload.meta["num_classes"])


# Bytes a stacked call's largest activation may take (all the stack's teachers together).
STACK_BYTES = 1 << 30


def _architecture(module: nn.Module) -> tuple:
    """What decides whether modules can share one vmapped forward: their layers as printed (kinds
    and hyperparameters) and the names and shapes of their weights."""
    shapes = tuple((k, tuple(v.shape)) for k, v in module.state_dict().items())
    return type(module), str(module), shapes


def stacked_forward(modules: list[nn.Module], device):
    """One function `xb -> (k, b, C)` running k modules of one architecture as one module under
    vmap: their weights stacked on `device` (copies; the modules stay as they are)."""
    from torch.func import functional_call, stack_module_state, vmap

    params, buffers = stack_module_state(modules)
    params = {k: v.detach().to(device) for k, v in params.items()}
    buffers = {k: v.to(device) for k, v in buffers.items()}
    shell = copy.deepcopy(modules[0]).to("meta")
    run = vmap(lambda p, b, xb: functional_call(shell, (p, b), (xb,)), in_dims=(0, 0, None))
    return lambda xb: run(params, buffers, xb)


def stacked_logits(modules: list[nn.Module], x: torch.Tensor, device) -> torch.Tensor:
    """(k, N, C) logits of k modules of one architecture on x (`stacked_forward`), as many
    samples a call as keep the stack's largest activation within STACK_BYTES."""
    forward = stacked_forward(modules, device)
    one = largest_activation(modules[0], x[:1].to(next(modules[0].parameters()).device))
    batch = max(1, min(len(x), STACK_BYTES // max(1, len(modules) * one)))
    with torch.inference_mode():
        outs = [forward(x[i : i + batch].to(device)).float().cpu() for i in range(0, len(x), batch)]
    return torch.cat(outs, 1)


def group_logits(ups: list[Upload], x: torch.Tensor, device, stack: bool | None = None):
    """(k, N, C) logits of `ups` on x. `stack` (by default: on an accelerator, module docstring)
    runs the teachers that share an architecture as one stacked module."""
    if stack is None:
        stack = not _on_cpu(device)
    if not stack:
        return torch.stack([teacher_logits(u, x, device) for u in ups])
    modules = [u.module for u in ups]  # once: a parked upload's is read from disk at each access
    kinds: dict[tuple, list[int]] = {}
    for i, m in enumerate(modules):
        if m is not None:
            kinds.setdefault(_architecture(m), []).append(i)
    out: list[torch.Tensor | None] = [None] * len(ups)
    for members in kinds.values():
        if len(members) > 1:
            logits = stacked_logits([modules[i] for i in members], x, device)
            for j, i in enumerate(members):
                out[i] = logits[j]
    for i, u in enumerate(ups):
        if out[i] is None:
            out[i] = teacher_logits(u, x, device)
    return torch.stack(out)


# Teachers whose logits a teacher pass holds at once: a pass over 2,000 classifiers holds 64 x
# samples x classes floats, not 2,000 x (480 MB for FedMHO's 6,000 samples). Up to 64 teachers
# (every recorded federation but the scale bench's 1,000 and 10,000) the sum is one reduction,
# as it was before the grouping; past it the groups' sums are added, equal up to float rounding.
TEACHER_GROUP = 64


def grouped_teacher_sum(
    teachers: list[Upload], x: torch.Tensor, device, term=None, stack: bool | None = None
):
    """The sum over the teachers of `term(logits, group)` (by default the logits themselves), on
    x: `logits` is (k, N, C), the logits of `teachers[group]` for a `range` of at most
    TEACHER_GROUP teachers, and `term` returns k terms to be summed. `stack`: group_logits'."""
    total = None
    for start in range(0, len(teachers), TEACHER_GROUP):
        group = range(start, min(start + TEACHER_GROUP, len(teachers)))
        logits = group_logits([teachers[i] for i in group], x, device, stack)
        part = (logits if term is None else term(logits, group)).sum(0)
        total = part if total is None else total + part
    if total is None:
        raise FusionError(
            "a teacher pass needs at least one classifier upload",
            hint="add classifier uploads, or fuse with a method for decoders (server methods)",
        )
    return total


def mean_teacher_logits(
    teachers: list[Upload], x: torch.Tensor, device, stack: bool | None = None
) -> torch.Tensor:
    # sum / K is bit for bit the stacked logits' mean(0), its form before the grouping
    return grouped_teacher_sum(teachers, x, device, stack=stack) / len(teachers)
