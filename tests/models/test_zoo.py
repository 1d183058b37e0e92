"""Registry-wide contract: every zoo entry builds for every shape and round-trips its spec."""

import json

import pytest
import torch

import exporters
from edgefl.errors import ConfigError, UnknownNameError
from edgefl.models.cost import costs
from edgefl.models.nets import SlicedAdaptiveAvgPool2d
from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import ZOO, build_model, candidate_specs, input_kind, make_spec

# Images (C, H, W) and windows of sensor channels (C, 1, L), as hapt and hapt-gyro give them.
SHAPES = [
    ((1, 28, 28), 10),
    ((3, 32, 32), 10),
    ((1, 28, 28), 47),
    ((1, 8, 8), 10),
    ((3, 1, 128), 6),
    ((6, 1, 128), 6),
]
FIRST = {"image": (1, 28, 28), "signal": (3, 1, 128)}


@pytest.mark.parametrize("name", ZOO.names())
@pytest.mark.parametrize("shape, classes", SHAPES)
def test_builds_and_runs(name, shape, classes):
    if input_kind(shape) not in ZOO.get(name).inputs:
        # An entry never builds for what it cannot read: one message naming the models that can.
        with pytest.raises(ConfigError, match="models for"):
            make_spec(name, shape, classes)
        return
    spec = make_spec(name, shape, classes)
    model = build_model(spec)
    x = torch.rand(2, *shape)
    # What a client uploads at fp32 must pass the server's default caps (VGG-9 once did not).
    assert costs(spec).upload_bytes < exporters.DEFAULT_MAX_UPLOAD_BYTES
    largest = max(p.numel() for p in model.parameters())
    assert largest <= exporters.DEFAULT_MAX_TENSOR_ELEMENTS
    if ZOO.get(name).role == "classifier":
        assert model(x).shape == (2, classes)
        assert isinstance(model.head, torch.nn.Linear)
    else:
        recon, mu, logvar = model(x, torch.eye(classes)[:2])
        assert recon.shape == (2, *shape) and mu.shape == logvar.shape
        z = torch.zeros(2, model.latent_dim)
        assert model.decoder(z, torch.eye(classes)[:2]).shape == (2, *shape)


@pytest.mark.parametrize("name", ZOO.names())
def test_spec_round_trips_through_json(name):
    shape = FIRST[ZOO.get(name).inputs[0]]
    for spec in [make_spec(name, shape, 10)] + [
        s for s in candidate_specs(shape, 10, ZOO.get(name).role) if s.name == name
    ]:
        again = ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
        assert again == spec and again.to_json() == spec.to_json()
        # Same spec, same architecture: state_dict keys and shapes agree.
        a, b = build_model(spec).state_dict(), build_model(again).state_dict()
        assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}


def test_unknown_model_suggests():
    with pytest.raises(UnknownNameError, match="did you mean 'vgg9'"):
        make_spec("vgg", (1, 28, 28), 10)


def test_bad_params_and_specs():
    with pytest.raises(ConfigError, match="no parameter"):
        make_spec("cnn", (1, 28, 28), 10, width=3)
    with pytest.raises(ConfigError, match="missing key 'num_classes'"):
        ModelSpec.from_dict({"name": "cnn", "input_shape": [1, 28, 28]})
    with pytest.raises(ConfigError):
        ModelSpec.from_json("{not json")


def test_families_scale_monotonically():
    from edgefl.models.cost import costs

    for name in ("scnn", "mlp", "cvae-mlp"):
        role = ZOO.get(name).role
        ladder = [s for s in candidate_specs((1, 28, 28), 10, role) if s.name == name]
        params = [costs(s).params for s in ladder]
        assert params == sorted(params) and len(set(params)) == len(params)


@pytest.mark.parametrize("hw", [(3, 3), (1, 1), (14, 14), (7, 7), (10, 9), (5, 12)])
def test_sliced_adaptive_pool_has_adaptive_pools_windows(hw):
    """VGG-9's pool (sliced for phones' accelerators) computes torch's adaptive average pooling:
    uneven windows up (3 -> 7, MNIST), down (10 -> 7) and even ones."""
    x = torch.randn(2, 3, *hw)
    want = torch.nn.AdaptiveAvgPool2d((7, 7))(x)
    torch.testing.assert_close(SlicedAdaptiveAvgPool2d((7, 7))(x), want, atol=1e-6, rtol=0)
