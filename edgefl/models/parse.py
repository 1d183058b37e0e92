"""A model as a user names it: `--model NAME:key=value,...` or a spec file saved by
`edgefl search --save`, read into a spec through the zoo, so that its parameters are checked
like the zoo's own (edgefl.models.zoo.make_spec)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgefl.errors import ConfigError
from edgefl.models.spec import ModelSpec, parse_value
from edgefl.models.zoo import make_spec


def parse_model_arg(text: str, input_shape, num_classes: int) -> ModelSpec:
    """`scnn` or `scnn:width=16,depth=3` or `mlp:hidden=32x16` -> a spec."""
    name, _, rest = text.partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(
                f"--model {text!r}: expected key=value, got {item!r}",
                hint="e.g. --model cnn:width=16 (`edgefl models` lists each model's params)",
            )
        params[key.strip()] = parse_value(value.strip())
    return make_spec(name, input_shape, num_classes, **params)


MAX_SPEC_BYTES = 1 << 20


def load_spec_file(path: str, input_shape=None, num_classes: int | None = None) -> ModelSpec:
    """A spec saved by `edgefl search --save`: read, checked against the task when it is given
    (a spec for other images or classes cannot train here) and rebuilt through the zoo, so that
    its parameters are validated like --model's."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"--spec {path}: no such file",
            hint="save one with `edgefl search ... --save spec.json`",
        )
    if p.stat().st_size > MAX_SPEC_BYTES:
        raise ConfigError(
            f"--spec {path} is larger than a model spec can be (1 MiB)",
            hint="pass a spec `edgefl search --save` wrote",
        )
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"--spec {path} cannot be read: {exc}",
            hint="pass a spec file you can read, e.g. one `edgefl search --save` wrote",
        ) from None
    spec = ModelSpec.from_json(text)
    if (
        input_shape is not None
        and tuple(spec.input_shape) != tuple(input_shape)
        or (num_classes is not None and spec.num_classes != num_classes)
    ):
        raise ConfigError(
            f"--spec {path} is for input {list(spec.input_shape)} with {spec.num_classes} "
            f"classes; this dataset has input {list(input_shape)} with {num_classes}",
            hint="search again on this dataset, or train on the dataset the spec was searched on",
        )
    return make_spec(spec.name, tuple(spec.input_shape), spec.num_classes, **spec.params)
