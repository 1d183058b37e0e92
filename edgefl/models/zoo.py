"""The model zoo: every entry is a name, a role, defaults and a builder `spec -> nn.Module`.

FedMHO prototypes (`vgg9`, `cnn`, `cvae-small`, `cvae-large`) follow the official code as described
in shared/notes/methods.md; `fedgh-cnn1..5` follow FedGH's Table 2; `scnn`, `mlp` and `cvae-mlp`
are width-scalable families so that even an MCU budget is met by something (see `ladder`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from edgefl.errors import ConfigError
from edgefl.models.nas import (
    DEFAULT_GENES,
    WINDOW_GENES,
    arch_string,
    build_nas_cnn,
    check_genes,
)
from edgefl.models.nets import (
    CVAE,
    Centre,
    Classifier,
    ConvDecoder,
    ConvEncoder,
    MLPDecoder,
    MLPEncoder,
    SignalDecoder,
    SignalEncoder,
    SlicedAdaptiveAvgPool2d,
    flat_size,
)
from edgefl.models.spec import ModelSpec
from edgefl.registry import Registry

Role = Literal["classifier", "generator"]


@dataclass(frozen=True)
class ZooEntry:
    name: str
    role: Role
    build: Callable[[ModelSpec], nn.Module]
    description: str
    defaults: dict[str, Any] = field(default_factory=dict)
    source: str = "edgefl"
    # Params of the scalable family's sizes, smallest first (empty: a fixed-size prototype).
    ladder: tuple[dict[str, Any], ...] = ()
    # Short human label of a spec's params (for families whose params are structures).
    describe: Callable[[dict[str, Any]], str] | None = None
    # What it reads: "image" (C, H, W) and/or "signal" (C, 1, L: windows of a sensor's channels).
    inputs: tuple[str, ...] = ("image",)
    # Defaults that replace `defaults` on one input kind (the planner still offers `defaults`).
    defaults_by_input: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Refuses params that cannot be built on an input shape (ConfigError), before any build.
    check: Callable[[dict[str, Any], tuple[int, ...]], None] | None = None


# The kinds of input the zoo's models read (and method options may default by): images, and
# windows of sensor channels. A feature vector stored as (D, 1, 1) reads as a 1x1 image.
INPUT_KINDS = ("image", "signal")


def input_kind(input_shape) -> str:
    """Windows of sensor channels are stored as (C, 1, L); anything else is an image."""
    return "signal" if input_shape[1] == 1 and input_shape[2] > 1 else "image"


ZOO: Registry[ZooEntry] = Registry("model")


def _head(features: nn.Sequential, spec: ModelSpec) -> Classifier:
    return Classifier(features, nn.Linear(flat_size(features, spec.input_shape), spec.num_classes))


def _pad_for(h: int, k: int) -> int:
    """Same-padding for inputs too small for the prototype's valid convolutions (8x8 digits)."""
    return k // 2 if h < 16 else 0


def build_vgg9(spec: ModelSpec) -> nn.Module:
    c = spec.input_shape[0]
    drop = spec.params["dropout"]
    features = nn.Sequential(
        nn.Conv2d(c, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(128, 256, 3, padding=1), nn.ReLU(),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        SlicedAdaptiveAvgPool2d((7, 7)), nn.Flatten(),
        nn.Linear(256 * 7 * 7, 4096), nn.ReLU(), nn.Dropout(drop),
        nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(drop),
    )  # fmt: skip
    return Classifier(features, nn.Linear(4096, spec.num_classes))


def build_cnn(spec: ModelSpec) -> nn.Module:
    c, h, _ = spec.input_shape
    if c == 1:
        # FedMHO MNIST CNN (without the official code's stray Softmax before cross-entropy).
        p = _pad_for(h, 5)
        features = nn.Sequential(
            nn.Conv2d(1, 10, 5, padding=p), nn.MaxPool2d(2), nn.ReLU(),
            nn.Conv2d(10, 20, 5, padding=p), nn.MaxPool2d(2), nn.ReLU(),
            nn.Flatten(),
        )  # fmt: skip
    else:
        # FedMHO SVHN CNN: 3x3 convs 16-32-64-128, max-pool after the first three.
        features = nn.Sequential(
            nn.Conv2d(c, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
            nn.Flatten(),
        )  # fmt: skip
    return _head(features, spec)


def build_lenet5(spec: ModelSpec) -> nn.Module:
    c, h, _ = spec.input_shape
    features = nn.Sequential(
        nn.Conv2d(c, 6, 5, padding=2 if h <= 28 else 0), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5, padding=_pad_for(h, 5)), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
    )  # fmt: skip
    n = flat_size(features, spec.input_shape)
    features.extend([nn.Linear(n, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU()])
    return Classifier(features, nn.Linear(84, spec.num_classes))


def build_fedgh_cnn(spec: ModelSpec) -> nn.Module:
    """FedGH Table 2: Conv5x5 16, Conv5x5 c2, fc1, fc2 = representation (500), fc3 = header."""
    c, h, _ = spec.input_shape
    p = _pad_for(h, 5)
    features = nn.Sequential(
        nn.Conv2d(c, 16, 5, padding=p), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, spec.params["conv2"], 5, padding=p), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
    )  # fmt: skip
    n = flat_size(features, spec.input_shape)
    rep = spec.params["representation"]
    features.extend([nn.Linear(n, spec.params["fc1"]), nn.ReLU()])
    features.extend([nn.Linear(spec.params["fc1"], rep), nn.ReLU()])
    return Classifier(features, nn.Linear(rep, spec.num_classes))


def build_scnn(spec: ModelSpec) -> nn.Module:
    """Width/depth-scalable CNN: `depth` blocks of Conv3x3(p1)[-BN]-ReLU-MaxPool2, widths w, 2w, ..."""
    c, h, w = spec.input_shape
    width, depth, bn = spec.params["width"], spec.params["depth"], spec.params["bn"]
    layers: list[nn.Module] = []
    cin = c
    for i in range(depth):
        cout = width * 2**i
        layers.append(nn.Conv2d(cin, cout, 3, padding=1))
        if bn:
            layers.append(nn.BatchNorm2d(cout))
        layers.append(nn.ReLU())
        if min(h, w) >= 2:
            layers.append(nn.MaxPool2d(2))
            h, w = h // 2, w // 2
        cin = cout
    layers.append(nn.Flatten())
    features = nn.Sequential(*layers)
    hidden = spec.params["hidden"]
    if hidden:
        n = flat_size(features, spec.input_shape)
        features.extend([nn.Linear(n, hidden), nn.ReLU()])
    return _head(features, spec)


def build_mlp(spec: ModelSpec) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    n = int(spec.input_shape[0] * spec.input_shape[1] * spec.input_shape[2])
    for hsize in spec.params["hidden"]:
        layers += [nn.Linear(n, hsize), nn.ReLU()]
        n = hsize
    return Classifier(nn.Sequential(*layers), nn.Linear(n, spec.num_classes))


def build_cvae_mlp(spec: ModelSpec) -> nn.Module:
    h, latent = spec.params["hidden"], spec.params["latent"]
    enc = MLPEncoder(latent, spec.num_classes, h, spec.input_shape)
    dec = MLPDecoder(latent, spec.num_classes, h, spec.input_shape)
    return CVAE(enc, dec, spec.num_classes)


def build_cvae_large(spec: ModelSpec) -> nn.Module:
    latent = spec.params["latent"]
    if min(spec.input_shape[1:]) < 8:
        raise ConfigError(
            f"cvae-large needs images of at least 8x8, got {spec.input_shape}",
            hint="use cvae-small or cvae-mlp for this dataset",
        )
    enc = ConvEncoder(latent, spec.num_classes, spec.input_shape)
    dec = ConvDecoder(latent, spec.num_classes, spec.input_shape)
    return CVAE(enc, dec, spec.num_classes)


def build_cnn1d(spec: ModelSpec) -> nn.Module:
    """1-D CNN over (C, 1, L) windows: `depth` blocks of Conv(1, k)-ReLU-MaxPool(1, 2), widths
    w, 2w, 4w, ..., then an optional hidden FC and the head. (1, k) kernels are 1-D convolutions
    that every exporter, runtime and the cost model already read as plain Conv2d."""
    c, _, length = spec.input_shape
    width, depth, k = spec.params["width"], spec.params["depth"], spec.params["kernel"]
    if length >> depth < 1:
        raise ConfigError(
            f"cnn1d: depth {depth} halves a window of {length} samples to nothing",
            hint=f"use depth <= {max(1, length.bit_length() - 1)}",
        )
    layers: list[nn.Module] = [Centre()]
    cin = c
    for i in range(depth):
        cout = width * 2**i
        layers += [
            nn.Conv2d(cin, cout, (1, k), padding=(0, k // 2)),
            nn.ReLU(),
            nn.MaxPool2d((1, 2)),
        ]
        cin = cout
    features = nn.Sequential(*layers, nn.Flatten())
    if spec.params["hidden"]:
        n = flat_size(features, spec.input_shape)
        features.extend([nn.Linear(n, spec.params["hidden"]), nn.ReLU()])
    return _head(features, spec)


def build_cvae1d(spec: ModelSpec) -> nn.Module:
    c, _, length = spec.input_shape
    if length % 4:
        raise ConfigError(
            f"cvae1d needs a window length divisible by 4, got {length}",
            hint="use cvae-mlp for this dataset",
        )
    p = spec.params
    enc = SignalEncoder(p["latent"], spec.num_classes, p["width"], p["hidden"], spec.input_shape)
    dec = SignalDecoder(p["latent"], spec.num_classes, p["width"], p["hidden"], spec.input_shape)
    return CVAE(enc, dec, spec.num_classes)


def _add(entry: ZooEntry) -> None:
    ZOO.add(entry.name, entry)


_add(
    ZooEntry(
        "vgg9",
        "classifier",
        build_vgg9,
        "FedMHO VGG-9 (no BN), 126.5M MACs on MNIST",
        {"dropout": 0.5},
        "FedMHO code",
    )
)
_add(
    ZooEntry(
        "cnn",
        "classifier",
        build_cnn,
        "FedMHO CNN: 2 conv + FC (MNIST), 4 conv (RGB)",
        {},
        "FedMHO code",
    )
)
_add(ZooEntry("lenet5", "classifier", build_lenet5, "LeNet-5 (ReLU, max-pool)", {}, "LeCun 1998"))
for _i, (_c2, _fc1) in enumerate([(32, 2000), (16, 2000), (32, 1000), (32, 800), (32, 500)], 1):
    _add(
        ZooEntry(
            f"fedgh-cnn{_i}",
            "classifier",
            build_fedgh_cnn,
            f"FedGH CNN-{_i}: conv 16-{_c2}, fc1 {_fc1}, 500-d representation",
            {"conv2": _c2, "fc1": _fc1, "representation": 500},
            "FedGH Table 2",
        )
    )
_add(
    ZooEntry(
        "scnn",
        "classifier",
        build_scnn,
        "scalable CNN: width x depth conv blocks",
        {"width": 8, "depth": 2, "bn": False, "hidden": 0},
        "edgefl",
        tuple(
            {"width": w, "depth": 2, "bn": False, "hidden": 0}
            for w in (2, 4, 6, 8, 12, 16, 24, 32, 48, 64)
        ),
    )
)
_add(
    ZooEntry(
        "mlp",
        "classifier",
        build_mlp,
        "scalable MLP classifier (smallest budgets)",
        {"hidden": [32]},
        "edgefl",
        tuple({"hidden": [h]} for h in (4, 8, 16, 32, 64, 128)),
        inputs=("image", "signal"),
    )
)
_add(
    ZooEntry(
        "cvae-small",
        "generator",
        build_cvae_mlp,
        "FedMHO CVAE-small: MLP 256 hidden, latent 2 (408k MACs on MNIST)",
        {"hidden": 256, "latent": 2},
        "FedMHO code",
    )
)
_add(
    ZooEntry(
        "cvae-large",
        "generator",
        build_cvae_large,
        "FedMHO CVAE-large: conv encoder 64-128-256, ConvT decoder, latent 20",
        {"latent": 20},
        "FedMHO code",
    )
)
_add(
    ZooEntry(
        "cvae-mlp",
        "generator",
        build_cvae_mlp,
        "scalable MLP CVAE (hidden width ladder)",
        {"hidden": 64, "latent": 2},
        "edgefl",
        tuple(
            {"hidden": h, "latent": 2}
            for h in (4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
        ),
        inputs=("image", "signal"),
    )
)
# Sensor windows (C, 1, L), e.g. a wristband's accelerometer (hapt). The defaults of cnn1d are
# the reference HAR classifier a device must be able to train to be given a classifier.
_add(
    ZooEntry(
        "cnn1d",
        "classifier",
        build_cnn1d,
        "1-D CNN for sensor windows: conv(1,k) blocks of widths w, 2w, 4w + pooling",
        {"width": 32, "depth": 3, "kernel": 5, "hidden": 0},
        "edgefl",
        tuple(
            {"width": w, "depth": 3, "kernel": 5, "hidden": 0}
            for w in (2, 4, 6, 8, 12, 16, 24, 32, 48, 64)
        ),
        inputs=("signal",),
    )
)
_add(
    ZooEntry(
        "cvae1d",
        "generator",
        build_cvae1d,
        "1-D conv CVAE for sensor windows: strided conv encoder, ConvT decoder (uploaded)",
        {"width": 16, "hidden": 128, "latent": 8},
        "edgefl",
        tuple(
            {"width": w, "hidden": h, "latent": 8}
            for w, h in ((2, 16), (4, 32), (6, 48), (8, 64), (12, 96), (16, 128), (32, 256))
        ),
        inputs=("signal",),
    )
)


def make_spec(name: str, input_shape, num_classes: int, **params: Any) -> ModelSpec:
    """A spec for zoo entry `name` with its defaults overridden by `params` (unknown ones refused)."""
    entry = ZOO.get(name)
    kind = input_kind(input_shape)
    if kind not in entry.inputs:
        fits = sorted(e.name for e in ZOO if kind in e.inputs)
        raise ConfigError(
            f"model {name!r} reads {' or '.join(entry.inputs)}s, but this data is {kind}s of "
            f"shape {tuple(input_shape)}",
            hint=f"models for {kind}s: {', '.join(fits)}",
        )
    unknown = set(params) - set(entry.defaults)
    if unknown:
        raise ConfigError(
            f"model {name!r} has no parameter(s) {sorted(unknown)}",
            hint=f"its parameters are: {sorted(entry.defaults) or 'none'}",
        )
    merged = {**entry.defaults, **entry.defaults_by_input.get(kind, {}), **_typed(entry, params)}
    if entry.check is not None:
        entry.check(merged, tuple(input_shape))
    return ModelSpec(name, tuple(input_shape), num_classes, merged)


def _typed(entry: ZooEntry, params: dict[str, Any]) -> dict[str, Any]:
    """Params must have their default's type (`hidden=64` for a list param means [64])."""
    return {key: _typed_value(entry, key, value) for key, value in params.items()}


def _typed_value(entry: ZooEntry, key: str, value: Any) -> Any:
    default = entry.defaults[key]
    if isinstance(default, list) and isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not _fits(default, value):
        raise ConfigError(
            f"model {entry.name!r}: parameter {key}={value!r} should be like {default!r}",
            hint="e.g. --model scnn:width=16 or --model mlp:hidden=64x32",
        )
    return value


def _fits(default: Any, value: Any) -> bool:
    """Whether `value` has the type of `default` (an int list: positive ints)."""
    int_list = isinstance(default, list) and all(type(v) is int for v in default) and default
    if int_list and isinstance(value, list):  # layer widths
        return all(type(v) is int and v > 0 for v in value)
    return (
        isinstance(value, bool) == isinstance(default, bool)
        and (isinstance(value, type(default)) or (default is None))
        or (isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool))
    )


def build_model(spec: ModelSpec) -> nn.Module:
    entry = ZOO.get(spec.name)
    missing = set(entry.defaults) - set(spec.params)
    unknown = set(spec.params) - set(entry.defaults)
    if missing or unknown:
        raise ConfigError(
            f"spec for {spec.name!r} has missing params {sorted(missing)} / unknown {sorted(unknown)}",
            hint="`edgefl models` lists each model's params",
        )
    return entry.build(spec)


def spec_label(spec: ModelSpec) -> str:
    """Human-readable name: the zoo name plus any non-default params."""
    entry = ZOO.get(spec.name)
    if entry.describe is not None:
        return f"{spec.name}({entry.describe(spec.params)})"
    diff = {k: v for k, v in spec.params.items() if entry.defaults.get(k) != v}
    if not diff:
        return spec.name
    return spec.name + "(" + ",".join(f"{k}={_short(v)}" for k, v in diff.items()) + ")"


def _short(v: Any) -> str:
    if isinstance(v, list):
        return "x".join(str(x) for x in v)
    return str(v)


def role_of(spec_or_name: ModelSpec | str) -> Role:
    name = spec_or_name if isinstance(spec_or_name, str) else spec_or_name.name
    return ZOO.get(name).role


def candidate_specs(input_shape, num_classes: int, role: Role) -> list[ModelSpec]:
    """Every model of `role` the planner may choose: fixed prototypes plus each family's ladder."""
    specs = []
    for entry in ZOO:
        if entry.role != role or input_kind(input_shape) not in entry.inputs:
            continue
        for params in entry.ladder or (entry.defaults,):
            try:
                specs.append(make_spec(entry.name, input_shape, num_classes, **params))
            except ConfigError:
                continue
    return specs


# pFedZKD's searched family; `edgefl search` / `client train --search pso` pick its genes.
_add(
    ZooEntry(
        "nas-cnn",
        "classifier",
        build_nas_cnn,
        "PSO-FedNAS space: conv/pool genes, FC head",
        {"genes": DEFAULT_GENES},
        "pFedZKD Sec. 3.2",
        describe=lambda p: arch_string(p["genes"]),
        # A window (C, 1, L) is a one-row image: `edgefl search` and pFedZKD search it there.
        # No pool fits a map of one row: `--model nas-cnn` takes convs only on windows, and the
        # planner, offered the image genes there, is refused them (HAPT's choices unchanged).
        inputs=("image", "signal"),
        defaults_by_input={"signal": {"genes": WINDOW_GENES}},
        check=lambda p, shape: check_genes(p["genes"], shape),
    )
)
