"""The cost model against hand-computed values, the FedMHO paper's Table 2 and torch's counters."""

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from edgefl.models.cost import (
    OPTIMIZER_STATE,
    OPTIMIZER_TEMPS,
    TRAIN_MARGIN,
    costs,
    layer_table,
)
from edgefl.models.zoo import ZOO, build_model, make_spec

MNIST = ((1, 28, 28), 10)


def test_cnn_layers_by_hand():
    # Conv(1,10,5): 24*24*10 outputs x 1*25; Conv(10,20,5): 8*8*20 x 10*25; FC 320 -> 10.
    macs = [c.macs for c in layer_table(make_spec("cnn", *MNIST)) if c.macs]
    assert macs == [24 * 24 * 10 * 25, 8 * 8 * 20 * 10 * 25, 320 * 10]


@pytest.mark.parametrize(
    "name, shape, expected",
    [
        ("vgg9", (1, 28, 28), 126_467_584),
        ("cnn", (1, 28, 28), 467_200),  # Table 2's 467,229 less the stray Softmax
        ("cvae-small", (1, 28, 28), 408_064),
        ("vgg9", (3, 32, 32), 145_481_984),  # SVHN
        ("cnn", (3, 32, 32), 4_001_792),  # SVHN
    ],
)
def test_fedmho_table2_macs(name, shape, expected):
    assert costs(make_spec(name, shape, 10)).macs == expected


def test_adaptive_avgpool_follows_thop():
    # VGG-9's 3x3 -> 7x7 adaptive pool: (9/49 + 1) * 256*49 = 14,848 "ops" in thop's count.
    calls = layer_table(make_spec("vgg9", *MNIST))
    pool = [c for c in calls if c.kind == "AdaptiveAvgPool2d"]
    assert [c.macs for c in pool] == [14_848]


def test_conv_transpose_counts_input_side():
    spec = make_spec("cvae-large", *MNIST)
    convt = [c for c in layer_table(spec) if c.kind == "ConvTranspose2d"]
    # 256x7x7 input -> 128 channels, 3x3 kernel: 49*256 inputs x 128*9.
    assert convt[0].macs == 7 * 7 * 256 * 128 * 9


@pytest.mark.parametrize("name", ZOO.names())
def test_flops_match_torch_flop_counter(name):
    spec = make_spec(name, *(MNIST if "image" in ZOO.get(name).inputs else ((3, 1, 128), 10)))
    model = build_model(spec).eval()
    x = torch.zeros(1, *spec.input_shape)
    args = (x,) if ZOO.get(name).role == "classifier" else (x, torch.eye(10)[:1])
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(*args)
    assert costs(spec).flops == counter.get_total_flops()


def test_params_and_weight_bytes():
    c = costs(make_spec("cnn", *MNIST))
    assert c.params == (10 * 25 + 10) + (20 * 10 * 25 + 20) + (320 * 10 + 10) == 8_490
    assert c.weight_bytes == 4 * 8_490 and c.weight_bytes_int8 == 8_490
    assert c.upload_weight_bytes == c.weight_bytes  # a classifier uploads all of itself
    # The file wraps them in ONNX: 8 layer calls, 6 tensors, the metadata of 10 classes.
    names = len("features.0.weight") + len("features.0.bias") + len("features.3.weight")
    names += len("features.3.bias") + len("head.weight") + len("head.bias")
    dims = 2 * (4 + 1 + 4 + 1 + 2 + 1)
    assert c.upload_bytes == 4 * 8_490 + names + dims + 6 * 12 + 8 * 240 + 540 + 850 + 10 * 20


def test_cvae_uploads_only_the_decoder():
    c = costs(make_spec("cvae-small", *MNIST))
    decoder = (2 + 10) * 256 + 256 + 256 * 784 + 784
    assert c.upload_params == decoder
    assert c.params > c.upload_params
    # The paper's CVAE-small is ~1.6 MB of fp32 parameters: more than a Mi Band 8 has RAM.
    assert c.weight_bytes > 1.375 * 2**20


def test_inference_peak_by_hand():
    spec = make_spec("cnn", *MNIST)
    c = costs(spec)
    # Steps: Conv1 784 -> 5,760; MaxPool 5,760 -> 1,440 (the largest); ...
    assert c.infer_peak_bytes == 4 * (8_490 + 5_760 + 1_440)


def test_tflm_arena_by_hand():
    c = costs(make_spec("cnn", *MNIST))
    # Activations: ReLU folds into the pool before it; the largest step is MaxPool 5,760 ->
    # 1,440 int8 values (16-byte multiples). Persistent: 7 TFLite ops (conv, pool, conv, pool,
    # transpose + reshape for the flatten, FC), 16 tensors (input, 7 outputs, 3 x weights and
    # bias, 2 shape constants), 10 + 20 + 10 output channels.
    assert c.tflm_arena_bytes == (5_760 + 1_440) + (712 + 150 * 7 + 24 * 16 + 8 * 40)
    # TFLite Micro measured 9,616 bytes for this model (bench/results/deploy_memory.md).
    assert abs(c.tflm_arena_bytes / 9_616 - 1) < 0.25


def test_train_bytes_formula():
    """Held (weights, state, the sample order) + the larger of backward and the step."""
    c = costs(make_spec("cnn", *MNIST))
    for opt, state in OPTIMIZER_STATE.items():
        step = c.weight_bytes + OPTIMIZER_TEMPS[opt] * c.largest_param_bytes
        backward = max(a * 32 + b for a, b in c.backward)
        held = c.weight_bytes * (1 + state) + 8 * 1000 + 16 * 32
        want = math.ceil(TRAIN_MARGIN * (held + max(step, backward)))
        assert c.train_bytes(32, opt, 1000) == want


@pytest.mark.parametrize("name", ["cnn", "lenet5", "scnn", "vgg9", "cvae-large"])
def test_activation_estimate_tracks_autograd(name):
    """Saved activations measured through autograd's hooks stay within the estimate's ballpark."""
    spec = make_spec(name, *MNIST)
    model = build_model(spec).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            saved[st.data_ptr()] = st.nbytes()
        return t

    batch = 4
    x = torch.rand(batch, *spec.input_shape)
    args = (x,) if ZOO.get(name).role == "classifier" else (x, torch.eye(10)[:batch])
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*args)
    measured = sum(saved.values()) / batch
    estimate = costs(spec).activation_bytes
    assert 0.5 * estimate <= measured <= 1.5 * estimate
