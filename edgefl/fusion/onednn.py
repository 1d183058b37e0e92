"""Runs of convolutions, max pools and ReLUs kept in oneDNN's own tensor layout through a
teacher pass on a CPU (issue 59; bench/results/teacher_pass_onednn.md).

torch runs a CPU Conv2d through oneDNN, converting its input to oneDNN's memory and the output
back to a plain strided tensor at every layer. Between the layers of a run those conversions are
the only work that is not the model's: kept in oneDNN's layout from the run's first convolution
to its last layer, the same convolution kernels compute the same values, and a maximum and a
ReLU are exact in any layout. A `cnn` teacher's pass takes 1.2-1.4x less time.

It is the same result only where oneDNN picks the same kernel for both paths, which is true of
every zoo teacher measured but is no contract of oneDNN's. So the runs check themselves: the
first batch of each kind of run and input shape in a process (`VERDICTS`; torch's own kernels
differ between a batch of one and of more) is also run the plain way, and a kind that differs
by one bit takes the plain layers for good. NaN is the other difference: oneDNN's max pool
skips a NaN that torch's propagates. The fast path is taken only where no value of the run can
be NaN or infinite: a finite input whose magnitude, carried through each layer's worst case
(fan-in x largest weight + largest bias), stays far from float32's range. Where a gradient may
flow (the data-free generators' steps) the plain layers run, as autograd needs.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

# Whether the fast path gave the plain layers' result, bit for bit, by (the run's layers as
# printed, the input's shape, torch's threads): oneDNN picks a kernel by shapes, never by the
# weights' values, so one teacher's check holds for every teacher of its kind in the process.
VERDICTS: dict[tuple, bool] = {}
# The largest magnitude the run may reach in its worst case: far under float32's 3.4e38, so no
# sum of the run overflows into an infinity (and then a NaN) on either path.
SAFE_MAGNITUDE = 1e30


def _pool_args(layer: nn.Module) -> tuple | None:
    """(kernel, stride, padding, ceil_mode) of a max pool oneDNN runs as torch does, else None."""
    if not isinstance(layer, nn.MaxPool2d) or layer.return_indices:
        return None
    if layer.dilation not in (1, (1, 1)):
        return None
    stride = layer.stride if layer.stride is not None else layer.kernel_size
    return (layer.kernel_size, stride, layer.padding, layer.ceil_mode)


def _convertible(layer: nn.Module) -> bool:
    if isinstance(layer, nn.Conv2d):
        return (
            layer.padding_mode == "zeros"
            and isinstance(layer.padding, tuple)  # "same" / "valid" strings: leave them be
            and layer.weight.dtype == torch.float32
            and layer.weight.device.type == "cpu"
        )
    return isinstance(layer, nn.ReLU) or _pool_args(layer) is not None


def _growth(layer: nn.Module) -> tuple[float, float]:
    """(a, b): |output| <= a |input| + b for every output of `layer`."""
    if isinstance(layer, nn.Conv2d):
        w = layer.weight.detach()
        fan_in = w[0].numel()
        bias = 0.0 if layer.bias is None else float(layer.bias.detach().abs().max())
        return fan_in * float(w.abs().max()), bias
    return 1.0, 0.0


class OneDNNRun(nn.Module):
    """Consecutive layers (Conv2d, max pools, ReLU) of a teacher's evaluation form, run in
    oneDNN's layout when no gradient is wanted (module docstring); `layers` is the plain run,
    whose own weights the fast path reads (nothing copied)."""

    def __init__(self, layers: list[nn.Module]):
        super().__init__()
        self.layers = nn.Sequential(*layers)
        self.kind = repr(self.layers)  # the layers' kinds and shapes: what picks a kernel
        # each pool's arguments, kept: teachers.evaluation_form then replaces the plain layers'
        # pools by the WindowMax that computes the same
        self.pools = {i: _pool_args(layer) for i, layer in enumerate(layers)}
        a, b = 1.0, 0.0  # |any value of the run| <= a |input| + b
        for layer in layers:
            ga, gb = _growth(layer)
            a, b = a * ga, b * ga + gb
        self.bound = (a, b)

    def _fast_ok(self, x: torch.Tensor) -> bool:
        if x.device.type != "cpu" or x.dtype != torch.float32:
            return False
        if not x.numel() or (
            torch.is_grad_enabled()
            and (x.requires_grad or any(p.requires_grad for p in self.layers.parameters()))
        ):
            return False
        lo, hi = x.aminmax()  # one pass; NaN in x makes both NaN
        top = max(-float(lo), float(hi))
        a, b = self.bound
        return math.isfinite(top) and a * top + b < SAFE_MAGNITUDE

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to_mkldnn()  # a copy: the in-place ReLUs below never touch x
        for i, layer in enumerate(self.layers):
            if isinstance(layer, nn.Conv2d):
                w, b, st, pad, dil, g = (
                    layer.weight, layer.bias, layer.stride, layer.padding, layer.dilation,
                    layer.groups,
                )  # fmt: skip
                h = F.conv2d(h, w, b, st, pad, dil, g)
            elif isinstance(layer, nn.ReLU):
                h = h.relu_()  # every h here is the run's own
            else:
                kernel, stride, padding, ceil = self.pools[i]
                h = F.max_pool2d(h, kernel, stride, padding, 1, ceil)
        return h.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._fast_ok(x):
            return self.layers(x)
        key = (self.kind, tuple(x.shape), torch.get_num_threads())
        same = VERDICTS.get(key)
        if same is False:
            return self.layers(x)
        out = self._fast(x)
        if same is None:  # the first batch of this kind and shape: also the plain way
            plain = self.layers(x)
            VERDICTS[key] = torch.equal(out, plain)
            return plain
        return out


def keep_layout(module: nn.Module) -> int:
    """Replace, in place, each run of >= 2 convertible layers that holds a Conv2d inside any
    nn.Sequential of `module` by one OneDNNRun; the number of runs made."""
    made = 0
    for seq in [m for m in module.modules() if isinstance(m, nn.Sequential)]:
        children = list(seq.children())
        out, run = [], []
        for child in [*children, None]:
            if child is not None and _convertible(child):
                run.append(child)
                continue
            if len(run) >= 2 and any(isinstance(c, nn.Conv2d) for c in run):
                out.append(OneDNNRun(run))
                made += 1
            else:
                out.extend(run)
            run = []
            if child is not None:
                out.append(child)
        if len(out) != len(children):
            for name in list(seq._modules):
                del seq._modules[name]
            for i, child in enumerate(out):
                seq.add_module(str(i), child)
    return made
