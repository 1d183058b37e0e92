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
- Memory is counted in bytes of fp32 tensors unless the name says int8 or a runtime:
  `infer_peak_bytes` is a plain fp32 executor's (weights in RAM + the largest step),
  `tflm_arena_bytes` TFLite Micro's arena for the full-integer int8 file `edgefl deploy` makes
  (weights stay in flash; see `tflm_arena`), `ORT_FLOOR_BYTES` what onnxruntime adds to any model.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache

import torch
from torch import nn

from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import build_model, role_of
from edgefl.privacy.dpsgd import dp_chunk, ghost_clippable

FP32 = 4
# An empty onnxruntime session costs 16.4 MiB of resident memory above `import onnxruntime`
# (shared/notes/deploy.md, onnxruntime 1.32 on x86_64): no model runs in onnxruntime in less.
ORT_FLOOR_BYTES = int(16.4 * 2**20)
# Optimizer state per parameter, in multiples of the parameter tensor (SGD keeps none,
# momentum one buffer, Adam two moments).
OPTIMIZER_STATE = {"sgd": 0, "sgd-momentum": 1, "adam": 2}
# The optimizer step's temporaries, in largest-parameter tensors (torch's single-tensor CPU
# path): Adam's denominator (the sqrt and its division alive at once); SGD works in place.
OPTIMIZER_TEMPS = {"sgd": 0, "sgd-momentum": 0, "adam": 2}
# What the backward walk (`backward_lines`) does not see: a few small tensors; the probe
# measured at most 0.2 % above the walk on the zoo (bench/results/train_memory.md).
TRAIN_MARGIN = 1.01
# Forward + backward ~ 3 forward passes: backward computes gradients w.r.t. both the inputs and
# the weights of each layer, each about one forward's MACs (Kaplan et al. 2020, the "6N" rule).
TRAIN_MACS_PER_FORWARD = 3
# Ghost clipping (edgefl.privacy.dpsgd) runs two backward passes: 1 + 2 + 2 forwards' MACs.
GHOST_MACS_PER_FORWARD = 5
# DP-SGD's temporaries beyond the held buffers, in largest-parameter tensors: the noise draw and
# the optimizer's per-tensor work (Adam's denominator), measured on cvae-mlp with the probe
# (edgefl.privacy.memory); the per-sample path adds one more for its clipped einsum.
DP_STEP_TEMPS = 2
INDEX_BYTES = 8  # a Poisson batch's sample indices (int64), all that DP-SGD holds of the batch


@dataclass(frozen=True)
class LayerCall:
    name: str
    kind: str
    in_elems: int  # per sample, all tensor inputs
    out_elems: int
    macs: int
    in_rank: int = 0  # dimensions of the first input per sample ((C, H, W) -> 3)
    channels: int = 0  # output channels of a Conv/ConvT/Linear (its per-channel quantization)

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
    upload_weight_bytes: int  # fp32 weights of the uploaded part
    upload_bytes: int  # the ONNX file `client train` writes: those weights + graph + metadata
    infer_peak_bytes: int  # uploaded part at batch 1: weights + the largest (inputs + output) step
    tflm_arena_bytes: int  # uploaded part as full-integer int8 TFLite: TFLite Micro's arena
    activation_bytes: int  # per sample: every layer output kept for backward, plus the input
    role: str
    # DP-SGD (see `dp_train_bytes`): bytes per sample of the batch DP-SGD draws (its input and
    # one-hot label), of the Linear outputs' gradients ghost clipping takes, the largest
    # parameter tensor, and whether ghost clipping applies to this model.
    dp_input_bytes: int = 0
    linear_out_bytes: int = 0
    largest_param_bytes: int = 0
    ghost: bool = False
    # The largest (input + output) of one layer call: the gradient pair a backward step holds.
    grad_step_bytes: int = 0
    # The backward pass's live bytes beyond the weights, as lines (per sample, fixed): one per
    # autograd node, see `backward_lines`. Not in as_dict (an internal schedule).
    backward: tuple[tuple[float, float], ...] = field(default=(), repr=False)

    def train_bytes(self, batch_size: int, optimizer: str, samples: int = 0) -> int:
        """Peak bytes of one training step (edgefl.training), an upper bound of the probe's
        measurement (edgefl.privacy.memory): held throughout, the weights, the optimizer's
        state and the epoch's sample order (int64 per sample of the shard, `samples`) and batch
        indices; on top, the larger of the backward pass (the batch, its outputs, the saved
        activations still to be used, the gradients so far, the gradient buffers in flight and
        the convolutions' work buffers: `backward_lines`) and the optimizer step (all the
        gradients and its temporaries, OPTIMIZER_TEMPS)."""
        b = batch_size
        held = self.weight_bytes * (1 + OPTIMIZER_STATE[optimizer]) + 8 * samples + 16 * b
        step = self.weight_bytes + OPTIMIZER_TEMPS[optimizer] * self.largest_param_bytes
        if self.backward:
            backward = max(a * b + c for a, c in self.backward)
        else:  # a Costs built by hand: the old sum (all gradients and activations at once)
            backward = self.weight_bytes + b * self.activation_bytes
        return math.ceil(TRAIN_MARGIN * (held + max(backward, step)))

    def train_macs(self, samples: int) -> int:
        return TRAIN_MACS_PER_FORWARD * self.macs * samples

    # --- DP-SGD (edgefl.privacy.dpsgd): what its step holds, as measured by
    # edgefl.privacy.memory's probe (tests/privacy/test_dp_planner.py) -------------------------------
    # Held through the step: the weights, the optimizer state, the clipped sums (which become the
    # gradients in place) and the Poisson batch's indices (its samples are gathered a chunk at a
    # time). On top, the larger of two phases:
    # - clipping a chunk of c samples: their inputs I, and ghost clipping their activations and
    #   Linear outputs' gradients, c (I + A + D); the per-sample path their gradients,
    #   activations and the gradient pair of the backward step under way, c (I + W + A + G)
    #   (measured: the convs' G is a third of W + A on scnn), plus one parameter tensor of
    #   clipping work on either path: under ghost clipping, each chunk after a step's first adds
    #   its gradients into .grad through a temporary (measured: the wristband's cvae-mlp, chunks
    #   of 14, peaked 62 KB over the estimate without it, over its budget, once full epochs
    #   drew batches of more than one chunk);
    # - the noisy step: DP_STEP_TEMPS largest parameter tensors.

    def dp_sample_bytes(self) -> int:
        """Bytes each sample of a chunk adds while it is clipped."""
        if self.ghost:
            return self.dp_input_bytes + self.activation_bytes + self.linear_out_bytes
        return (
            self.dp_input_bytes + self.weight_bytes + self.activation_bytes + self.grad_step_bytes
        )

    def _dp_held(self, batch_size: int, optimizer: str) -> int:
        state = OPTIMIZER_STATE[optimizer]
        return self.weight_bytes * (2 + state) + batch_size * INDEX_BYTES

    def dp_chunk(self, batch_size: int, optimizer: str, budget: int | None = None) -> int:
        """Samples DP-SGD clips at once: as many as `budget` bytes of training memory leave room
        for (0: not even one), or without a budget DP_GRADIENT_BYTES of per-sample gradients
        (ghost clipping holds none: the whole batch). The trainer takes this number
        (TrainConfig.dp_chunk), so the estimate and the run agree; a Poisson batch above the
        expected size is clipped in more chunks, not in larger ones."""
        if budget is None:
            return batch_size if self.ghost else dp_chunk(self.weight_bytes)
        room = budget - self._dp_held(batch_size, optimizer)
        if room < DP_STEP_TEMPS * self.largest_param_bytes:
            return 0
        room -= self.largest_param_bytes
        return max(0, room // self.dp_sample_bytes())

    def dp_train_bytes(self, batch_size: int, optimizer: str, chunk: int | None = None) -> int:
        """Training memory of a DP-SGD step clipping `chunk` samples at once (default: the
        unbudgeted `dp_chunk`) of an expected batch `batch_size`."""
        c = min(batch_size, chunk or self.dp_chunk(batch_size, optimizer))
        clipping = c * self.dp_sample_bytes() + self.largest_param_bytes
        step = DP_STEP_TEMPS * self.largest_param_bytes
        return self._dp_held(batch_size, optimizer) + max(clipping, step)

    def dp_train_macs(self, samples: int) -> int:
        per = GHOST_MACS_PER_FORWARD if self.ghost else TRAIN_MACS_PER_FORWARD
        return per * self.macs * samples

    def as_dict(self) -> dict:
        out = asdict(self)
        del out["backward"]
        return out


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


def _channels(m: nn.Module) -> int:
    if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
        return m.out_channels
    if isinstance(m, nn.Linear):
        return m.out_features
    return 0


def _torch_kind(m: nn.Module) -> str:
    """The torch layer a module is or extends (SlicedAdaptiveAvgPool2d counts as its base);
    a module of its own (Centre) keeps its name."""
    layers = (c for c in type(m).__mro__ if c.__module__.startswith("torch.nn"))
    return next((c.__name__ for c in layers if c is not nn.Module), type(m).__name__)


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
                    _torch_kind(m),
                    sum(t[0].numel() for t in tensors),
                    sum(t[0].numel() for t in outs),
                    macs,
                    tensors[0].dim() - 1 if tensors else 0,
                    _channels(m),
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


# TFLite Micro (tflite-micro 0.dev20261023, the files `edgefl deploy --target tflite-micro` makes
# through onnx2tf). Its arena has a head and a tail (RecordingMicroAllocator's report):
# - head: activations, planned so that a tensor's bytes are reused once its last reader ran. In a
#   chain the live tensors at an op are its input and output, so the head is the largest
#   (input + output) of any op, int8, each tensor rounded up to 16 bytes.
# - tail (persistent): 24 B per tensor (TfLiteEvalTensor), 64 B per op (NodeAndRegistration) and
#   ~60 B of op data per op, 8 B per output channel of a Conv/Linear (per-channel requantization
#   multiplier and shift, int32 each), and ~710 B fixed (the graph, the input and output tensors'
#   structs and their quantization). Fitted on mnist cnn/lenet5/mlp/scnn and hapt cnn1d within 3%.
# The converter folds ReLU, BatchNorm and Dropout into the op before them, and makes a Flatten of
# a feature map a TRANSPOSE (NHWC -> NCHW order) and a RESHAPE, each a copy.
TFLM_ALIGN = 16
TFLM_FIXED_BYTES = 712
TFLM_OP_BYTES = 150  # NodeAndRegistration 64 + op data ~60 + the allocator's per-op records ~26
TFLM_TENSOR_BYTES = 24
TFLM_CHANNEL_BYTES = 8
_FOLDED = {"ReLU", "ReLU6", "LeakyReLU", "BatchNorm1d", "BatchNorm2d", "Dropout", "Identity"}
_DENSE = {"Conv2d", "ConvTranspose2d", "Linear"}


def _aligned(n: int) -> int:
    return -(-n // TFLM_ALIGN) * TFLM_ALIGN


def tflm_arena(calls: list[LayerCall], input_elems: int) -> tuple[int, int]:
    """(head, tail) bytes of TFLite Micro's arena for the int8 chain of `calls` (see above)."""
    steps: list[tuple[int, int]] = []  # (input, output) elements of each TFLite op
    tensors, channels = 1, 0  # the graph input
    for c in calls:
        if c.kind in _FOLDED or (c.kind in _VIEWS and c.in_rank <= 2):
            continue
        if c.kind in _VIEWS:  # a feature map flattened: TRANSPOSE + RESHAPE, one constant each
            steps += [(c.in_elems, c.out_elems), (c.out_elems, c.out_elems)]
            tensors += 4
            continue
        steps.append((c.in_elems, c.out_elems))
        tensors += 1 + (2 if c.kind in _DENSE else 0)  # output, weights and bias
        channels += c.channels
    if not steps:
        return _aligned(input_elems), TFLM_FIXED_BYTES + TFLM_TENSOR_BYTES
    head = max(_aligned(i) + _aligned(o) for i, o in steps)
    tail = (
        TFLM_FIXED_BYTES
        + TFLM_OP_BYTES * len(steps)
        + TFLM_TENSOR_BYTES * tensors
        + TFLM_CHANNEL_BYTES * channels
    )
    return head, tail


# The file a client uploads (torch 2.13's exporter, opset 18, debugging records stripped): the
# fp32 tensors of the uploaded module's state plus ONNX's wrapping. Fitted on every zoo model's
# `client train` upload (mnist and hapt; tests/client/test_own_uploads.py holds it to 2%): per tensor
# its name, dims and ~12 B of fields; per leaf layer call ~240 B of nodes, attributes and value
# infos; ~540 B of graph, inputs and outputs; the metadata JSON ~850 B + 20 B per class.
ONNX_TENSOR_BYTES = 12
ONNX_LAYER_BYTES = 240
ONNX_GRAPH_BYTES = 540
METADATA_BYTES = 850
METADATA_CLASS_BYTES = 20


def upload_file_bytes(module: nn.Module, calls: list[LayerCall], num_classes: int) -> int:
    """Estimated size of `module`'s upload file (see above)."""
    state = [(k, v) for k, v in module.state_dict().items() if v.is_floating_point()]
    tensors = sum(FP32 * v.numel() + len(k) + 2 * v.dim() + ONNX_TENSOR_BYTES for k, v in state)
    return (
        tensors
        + ONNX_LAYER_BYTES * len(calls)
        + ONNX_GRAPH_BYTES
        + METADATA_BYTES
        + METADATA_CLASS_BYTES * num_classes
    )


def _n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _examples(spec: ModelSpec) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None]:
    x = torch.zeros(1, *spec.input_shape)
    if role_of(spec) == "classifier":
        return (x,), None
    y = torch.zeros(1, spec.num_classes)
    y[0, 0] = 1
    return (x, y), y


def _uploaded_part(model: nn.Module, calls: list[LayerCall], onehot):
    """(the module a client uploads, its layer calls): the classifier, or a CVAE's decoder."""
    if onehot is None:
        return model, calls
    z = torch.zeros(1, model.latent_dim)
    infer_calls, _ = trace(model.decoder, (z, onehot))
    return model.decoder, infer_calls


def _ghost(model: nn.Module, linears: list[LayerCall]) -> bool:
    """Whether ghost clipping can train `model`: its runtime rule holds for these Linear calls."""
    # The rule (edgefl.privacy.dpsgd): each Linear called once, on vectors.
    return (
        ghost_clippable(model)
        and all(c.in_rank == 1 for c in linears)
        and len({c.name for c in linears}) == len(linears)
    )


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
    upload, infer_calls = _uploaded_part(model, calls, onehot)
    upload_params = _n_params(upload)
    # A chain executor frees each tensor once its consumer ran: the peak is the largest step.
    peak_step = max((c.in_elems + c.out_elems for c in infer_calls if c.allocates), default=0)
    head, tail = tflm_arena(infer_calls, math.prod(spec.input_shape))
    linears = [c for c in calls if c.kind == "Linear"]
    ghost = _ghost(model, linears)
    return Costs(
        params=params,
        macs=sum(c.macs for c in calls),
        flops=2 * dense_macs,
        weight_bytes=FP32 * params,
        weight_bytes_int8=params,
        upload_params=upload_params,
        upload_weight_bytes=FP32 * upload_params,
        upload_bytes=upload_file_bytes(upload, infer_calls, spec.num_classes),
        infer_peak_bytes=FP32 * (upload_params + peak_step),
        tflm_arena_bytes=head + tail,
        activation_bytes=act,
        role=role_of(spec),
        dp_input_bytes=FP32 * (math.prod(spec.input_shape) + spec.num_classes),
        linear_out_bytes=FP32 * sum(c.out_elems for c in linears),
        largest_param_bytes=FP32 * max((p.numel() for p in model.parameters()), default=0),
        ghost=ghost,
        grad_step_bytes=FP32
        * max((c.in_elems + c.out_elems for c in calls if c.allocates), default=0),
        backward=backward_lines(model, spec),
    )


# Autograd nodes whose gradients are views of the one they receive (no new buffer).
_GRAD_VIEWS = {
    "TBackward0", "ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0",
    "TransposeBackward0", "PermuteBackward0", "SqueezeBackward0", "SqueezeBackward1",
    "UnsqueezeBackward0", "AliasBackward0", "CatBackward0", "AddBackward0",
}  # fmt: skip
_ACCUMULATE = "torch::autograd::AccumulateGrad"


def _saved_tensors(node) -> list[torch.Tensor]:
    out = []
    for name in dir(node):
        if name.startswith("_saved_"):
            v = getattr(node, name)
            out += [t for t in (v if isinstance(v, (tuple, list)) else (v,)) if torch.is_tensor(t)]
    return out


def _kernel_work(node) -> int:
    """A convolution's backward work buffers (oneDNN's): the larger of its gradient and input
    in 16-channel blocks, and a weight-sized buffer; fitted on the zoo's convs with the probe."""
    if node.name() != "ConvolutionBackward0":
        return 0
    x, out = node._saved_input, node._input_metadata[0].shape

    def blocked(shape) -> int:
        return -(-shape[1] // 16) * 16 * math.prod(shape[2:]) * shape[0]

    return FP32 * (max(blocked(out), blocked(x.shape)) + node._saved_weight.numel())


def _graph(loss: torch.Tensor) -> tuple[set, dict]:
    """(the autograd nodes behind `loss`, each node's number of consumers among them)."""
    deps: dict = {}
    nodes, stack = set(), [loss.grad_fn]
    while stack:
        n = stack.pop()
        if n in nodes:
            continue
        nodes.add(n)
        for f, _ in n.next_functions:
            if f is not None:
                deps[f] = deps.get(f, 0) + 1
                stack.append(f)
    return nodes, deps


def _saved_storages(nodes: set, keep: set[int]) -> tuple[dict[int, set], dict[int, int]]:
    """(the nodes holding each saved storage outside `keep`, that storage's bytes)."""
    holders: dict[int, set] = {}
    size: dict[int, int] = {}
    for n in nodes:
        for t in _saved_tensors(n):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in keep:
                size[ptr] = t.untyped_storage().nbytes()
                holders.setdefault(ptr, set()).add(n)
    return holders, size


def _release(grads: dict[int, list[int]], buf: int) -> int:
    """The bytes freed by dropping one reference to gradient buffer `buf` (0 while it is held)."""
    grads[buf][1] -= 1
    return grads[buf][0] if grads[buf][1] == 0 else 0


def _send_gradients(n, inputs: dict, grads: dict[int, list[int]], order: int):
    """(the nodes `n` sends a gradient to, the next buffer id, the live bytes that adds)."""
    received, targets, added = inputs[n], [], 0
    for f, i in n.next_functions:
        if f is None:
            continue
        if n.name() in _GRAD_VIEWS and received:  # a view of the gradient it received
            buf = received[0]
            grads[buf][1] += 1
        else:
            buf, order = order, order + 1
            meta = f._input_metadata[i]
            grads[buf] = [math.prod(meta.shape) * meta.dtype.itemsize, 1]
            added += grads[buf][0]
        if inputs[f] and f.name() != _ACCUMULATE:
            added -= _release(grads, buf)  # summed into the buffer already there
        else:
            inputs[f].append(buf)
        targets.append(f)
    return targets, order, added


def _free_saved(n, holders: dict[int, set], size: dict[int, int]) -> int:
    """The bytes of the saved storages whose last holder is `n`, which has run."""
    freed = 0
    for t in _saved_tensors(n):
        ptr = t.untyped_storage().data_ptr()
        if ptr in holders:
            holders[ptr].discard(n)
            if not holders[ptr]:
                freed += size.pop(ptr)
                del holders[ptr]
    return freed


def _schedule(targets: list, deps: dict, ready: list, order: int) -> int:
    """The next order number, once the `targets` whose last input arrived are pushed on `ready`."""
    for f in targets:
        deps[f] -= 1
        if deps[f] == 0:
            first = f.name() == _ACCUMULATE  # the engine runs these at once
            heapq.heappush(ready, (-(2**64) if first else -f._sequence_nr(), order, f))
            order += 1
    return order


def _walk(loss: torch.Tensor, frame: list[torch.Tensor], params: set[int]) -> list[int]:
    """Replays autograd's backward of `loss` (its CPU engine: ready nodes by sequence number,
    highest first; a node's saved tensors freed when it ran, its gradient buffers when consumed,
    the parameters' gradients kept) and returns the live bytes at each node, beyond the
    parameters, with the `frame`'s tensors (the batch and the model's outputs) alive throughout."""
    keep = {t.untyped_storage().data_ptr() for t in frame} | params
    nodes, deps = _graph(loss)
    holders, size = _saved_storages(nodes, keep)
    live = sum(size.values()) + sum(t.untyped_storage().nbytes() for t in frame)
    grads: dict[int, list[int]] = {}  # buffer id -> [bytes, references]
    inputs: dict = {n: [] for n in nodes}
    ready, order, trace = [(0, 0, loss.grad_fn)], 1, []
    while ready:
        n = heapq.heappop(ready)[2]
        if n.name() == _ACCUMULATE:  # its buffer becomes the parameter's .grad: kept
            trace.append(live)
            continue
        targets, order, added = _send_gradients(n, inputs, grads, order)
        live += added
        trace.append(live + _kernel_work(n))
        live -= sum(_release(grads, buf) for buf in inputs[n])
        live -= _free_saved(n, holders, size)
        order = _schedule(targets, deps, ready, order)
    return trace


def _cvae_loss(recon, mu, logvar, x) -> torch.Tensor:
    """edgefl.training.cvae_loss's operations (training sits above this package)."""
    bce = nn.functional.binary_cross_entropy(recon.flatten(1), x.flatten(1), reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return (bce + kld) / len(x)


def backward_lines(model: nn.Module, spec: ModelSpec) -> tuple[tuple[float, float], ...]:
    """The backward pass of edgefl.training's loss as lines in the batch size: the walk's live
    bytes at each node at batches of 2 and 4 (every buffer but the gradients of the parameters
    grows with the batch), as (per sample, fixed). Runs the model in training mode under a
    forked RNG (a CVAE draws its noise)."""
    traces = []
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    was_training = model.training
    model.train()
    with torch.random.fork_rng(devices=[]):
        for b in (2, 4):
            x, y = torch.rand(b, *spec.input_shape), torch.zeros(b, dtype=torch.long)
            if role_of(spec) == "classifier":
                frame = [x, y]
                loss = nn.functional.cross_entropy(model(x), y)
            else:
                onehot = nn.functional.one_hot(y, spec.num_classes).float()
                outs = model(x, onehot)
                frame = [x, y, onehot, *outs]
                loss = _cvae_loss(*outs, x)
            traces.append(_walk(loss, frame, params))
            del loss, frame
    model.train(was_training)
    lines = {((v4 - v2) / 2, v2 - (v4 - v2)) for v2, v4 in zip(*traces, strict=True)}
    best: dict[float, float] = {}
    for a, c in lines:
        best[a] = max(c, best.get(a, c))
    return tuple(sorted(best.items()))


def runtime_needs(c: Costs) -> dict[str, tuple[int, int]]:
    """(memory, storage) bytes the uploaded part needs in each device runtime `edgefl deploy`
    targets: onnxruntime (its session floor + the fp32 peak; the fp32 file) and TFLite Micro
    (the int8 arena; the int8 weights in flash, a lower bound of the .tflite file)."""
    return {
        "onnxruntime": (ORT_FLOOR_BYTES + c.infer_peak_bytes, c.upload_bytes),
        "TFLite Micro": (c.tflm_arena_bytes, c.weight_bytes_int8),
    }


def costs(spec: ModelSpec) -> Costs:
    return _costs_cached(spec.to_json())


def layer_table(spec: ModelSpec) -> list[LayerCall]:
    """Per-layer calls (for `edgefl models --layers` and for checking formulas by hand)."""
    model = build_model(spec)
    example, _ = _examples(spec)
    return trace(model, example)[0]
