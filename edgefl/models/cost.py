"""Exact cost accounting per spec and input shape.

Counting conventions (so numbers compare with the FedMHO paper's Table 2, which used `thop`):
- MACs per sample forward at batch 1 ("multiply-accumulates"):
  Conv2d: output elements x (Cin / groups) x kh x kw (bias not counted);
  ConvTranspose2d: input elements x (Cout / groups) x kh x kw (each input pixel is scattered into a
  kh x kw window of every output channel: the true count; thop instead uses output elements);
  Linear: in_features x out_features x (leading elements); AdaptiveAvgPool2d: thop's
  (prod(in_size / out_size) + 1) x output elements, kept so VGG-9's 126,467,584 reproduces;
  ReLU, Sigmoid, MaxPool, BatchNorm (foldable into the conv), Dropout, Upsample, Flatten: 0.
  A CVAE's MACs are encoder + decoder (its training forward), as in the paper.
- FLOPs = 2 x the Conv/ConvT/Linear MACs, the convention of torch.utils.flop_counter.FlopCounterMode.
- Memory is counted in bytes of fp32 tensors unless the name says int8.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

import torch
from torch import nn

from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import build_model, role_of

FP32 = 4
# Optimizer state per parameter, in multiples of the parameter tensor (SGD keeps none,
# momentum one buffer, Adam two moments).
OPTIMIZER_STATE = {"sgd": 0, "sgd-momentum": 1, "adam": 2}
# Forward + backward ~ 3 forward passes: backward computes gradients w.r.t. both the inputs and
# the weights of each layer, each about one forward's MACs (Kaplan et al. 2020, the "6N" rule).
TRAIN_MACS_PER_FORWARD = 3


@dataclass(frozen=True)
class LayerCall:
    name: str
    kind: str
    in_elems: int  # per sample, all tensor inputs
    out_elems: int
    macs: int

    @property
    def allocates(self) -> bool:
        """Flatten (and Identity) return views of their input: no new memory."""
        return self.kind not in _VIEWS


_VIEWS = {"Flatten", "Identity", "Unflatten"}


@dataclass(frozen=True)
class Costs:
    params: int
    macs: int  # per sample forward (CVAE: encoder + decoder)
    flops: int  # 2 x conv/linear MACs (FlopCounterMode convention)
    weight_bytes: int  # fp32
    weight_bytes_int8: int  # int8 weights (dynamic quantization of every weight tensor)
    upload_params: int  # what leaves the device: the classifier, or a CVAE's decoder only
    upload_bytes: int  # fp32 weights of the uploaded part
    infer_peak_bytes: int  # uploaded part at batch 1: weights + the largest (inputs + output) step
    activation_bytes: int  # per sample: every layer output kept for backward, plus the input
    role: str

    def train_bytes(self, batch_size: int, optimizer: str) -> int:
        """Weights + gradients + optimizer state + saved activations for one batch."""
        state = OPTIMIZER_STATE[optimizer]
        return self.weight_bytes * (2 + state) + batch_size * self.activation_bytes

    def train_macs(self, samples: int) -> int:
        return TRAIN_MACS_PER_FORWARD * self.macs * samples

    def as_dict(self) -> dict:
        return asdict(self)


def _layer_macs(m: nn.Module, inputs: tuple, out: torch.Tensor) -> tuple[int, bool]:
    """MACs for one sample through leaf `m`, and whether they are conv/linear MACs (for FLOPs)."""
    if isinstance(m, nn.Conv2d):
        kh, kw = m.kernel_size
        return out[0].numel() * (m.in_channels // m.groups) * kh * kw, True
    if isinstance(m, nn.ConvTranspose2d):
        kh, kw = m.kernel_size
        return inputs[0][0].numel() * (m.out_channels // m.groups) * kh * kw, True
    if isinstance(m, nn.Linear):
        return out[0].numel() * m.in_features, True
    if isinstance(m, nn.AdaptiveAvgPool2d):
        kernel = math.prod(i / o for i, o in zip(inputs[0].shape[2:], out.shape[2:], strict=True))
        return round((kernel + 1) * out[0].numel()), False
    return 0, False


def trace(module: nn.Module, example: tuple[torch.Tensor, ...]) -> tuple[list[LayerCall], int]:
    """Run `module` once at batch 1, recording every leaf module call in execution order.
    Returns the calls and the conv/linear MACs."""
    calls: list[LayerCall] = []
    dense = [0]

    def hook(name):
        def fn(m, inputs, out):
            tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
            outs = out if isinstance(out, tuple) else (out,)
            macs, is_dense = _layer_macs(m, inputs, outs[0])
            if is_dense:
                dense[0] += macs
            calls.append(
                LayerCall(
                    name,
                    type(m).__name__,
                    sum(t[0].numel() for t in tensors),
                    sum(t[0].numel() for t in outs),
                    macs,
                )
            )

        return fn

    handles = [
        m.register_forward_hook(hook(n))
        for n, m in module.named_modules()
        if not list(m.children())
    ]
    try:
        was_training = module.training
        module.eval()
        with torch.no_grad():
            module(*example)
        module.train(was_training)
    finally:
        for h in handles:
            h.remove()
    return calls, dense[0]


def _n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _examples(spec: ModelSpec) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None]:
    x = torch.zeros(1, *spec.input_shape)
    if role_of(spec) == "classifier":
        return (x,), None
    y = torch.zeros(1, spec.num_classes)
    y[0, 0] = 1
    return (x, y), y


@lru_cache(maxsize=512)
def _costs_cached(spec_json: str) -> Costs:
    spec = ModelSpec.from_json(spec_json)
    model = build_model(spec)
    example, onehot = _examples(spec)
    calls, dense_macs = trace(model, example)
    params = _n_params(model)
    # Training keeps every layer's output for backward (ReLU saves its output, Conv/Linear their
    # input = the previous output), plus the input batch itself.
    act = FP32 * (math.prod(spec.input_shape) + sum(c.out_elems for c in calls if c.allocates))
    if onehot is None:
        upload, infer_calls = model, calls
    else:
        upload = model.decoder
        z = torch.zeros(1, model.latent_dim)
        infer_calls, _ = trace(upload, (z, onehot))
    upload_params = _n_params(upload)
    # A chain executor frees each tensor once its consumer ran: the peak is the largest step.
    peak_step = max((c.in_elems + c.out_elems for c in infer_calls if c.allocates), default=0)
    return Costs(
        params=params,
        macs=sum(c.macs for c in calls),
        flops=2 * dense_macs,
        weight_bytes=FP32 * params,
        weight_bytes_int8=params,
        upload_params=upload_params,
        upload_bytes=FP32 * upload_params,
        infer_peak_bytes=FP32 * (upload_params + peak_step),
        activation_bytes=act,
        role=role_of(spec),
    )


def costs(spec: ModelSpec) -> Costs:
    return _costs_cached(spec.to_json())


def layer_table(spec: ModelSpec) -> list[LayerCall]:
    """Per-layer calls (for `edgefl models --layers` and for checking formulas by hand)."""
    model = build_model(spec)
    example, _ = _examples(spec)
    return trace(model, example)[0]
