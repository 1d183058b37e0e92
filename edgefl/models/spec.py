"""ModelSpec: the JSON-serialisable description of a model that travels inside every artifact.

A spec names a zoo entry and carries the input shape, class count and the entry's hyperparameters.
`ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec` holds for every spec, so the
server can rebuild exactly the module a device trained.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from edgefl.errors import ConfigError

_JSON_SCALARS = (str, int, float, bool, type(None))  # isinstance() takes this tuple


def _check_json_value(value: Any, where: str) -> Any:
    """Params must be JSON-native (lists, not tuples) so a round trip is exact."""
    if isinstance(value, _JSON_SCALARS):
        return value
    if isinstance(value, list | tuple):
        return [_check_json_value(v, where) for v in value]
    if isinstance(value, dict):
        return {str(k): _check_json_value(v, where) for k, v in value.items()}
    raise ConfigError(f"model param {where} has a non-JSON value of type {type(value).__name__}")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", tuple(int(d) for d in self.input_shape))
        object.__setattr__(
            self, "params", {k: _check_json_value(v, k) for k, v in sorted(self.params.items())}
        )
        if len(self.input_shape) != 3 or min(self.input_shape) < 1:
            raise ConfigError(
                f"input_shape must be (channels, height, width), got {self.input_shape}"
            )
        if self.num_classes < 2:
            raise ConfigError(f"num_classes must be >= 2, got {self.num_classes}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "params": dict(self.params),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any) -> ModelSpec:
        if not isinstance(data, dict):
            raise ConfigError(f"a model spec must be a JSON object, got {type(data).__name__}")
        problems = []
        for key, typ in (("name", str), ("input_shape", list), ("num_classes", int)):
            if key not in data:
                problems.append(f"missing key {key!r}")
            elif not isinstance(data[key], typ) or isinstance(data[key], bool):
                problems.append(f"key {key!r} must be {typ.__name__}")
        extra = set(data) - {"name", "input_shape", "num_classes", "params"}
        if extra:
            problems.append(f"unknown keys {sorted(extra)}")
        params = data.get("params", {})
        if not isinstance(params, dict):
            problems.append("key 'params' must be an object")
        if problems:
            raise ConfigError("invalid model spec: " + "; ".join(problems))
        return cls(data["name"], tuple(data["input_shape"]), data["num_classes"], params)

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"model spec is not valid JSON: {exc}") from None

    @property
    def label(self) -> str:
        """Human-readable name: the zoo name plus any non-default params."""
        from edgefl.models.zoo import ZOO

        entry = ZOO.get(self.name)
        if entry.describe is not None:
            return f"{self.name}({entry.describe(self.params)})"
        diff = {k: v for k, v in self.params.items() if entry.defaults.get(k) != v}
        if not diff:
            return self.name
        return self.name + "(" + ",".join(f"{k}={_short(v)}" for k, v in diff.items()) + ")"


def parse_model_arg(text: str, input_shape, num_classes: int) -> ModelSpec:
    """`scnn` or `scnn:width=16,depth=3` or `mlp:hidden=32x16` -> a spec."""
    from edgefl.models.zoo import make_spec  # the zoo imports this module

    name, _, rest = text.partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"--model {text!r}: expected key=value, got {item!r}")
        params[key.strip()] = parse_value(value.strip())
    return make_spec(name, input_shape, num_classes, **params)


MAX_SPEC_BYTES = 1 << 20


def load_spec_file(path: str, input_shape=None, num_classes: int | None = None) -> ModelSpec:
    """A spec saved by `edgefl search --save`: read, checked against the task when it is given
    (a spec for other images or classes cannot train here) and rebuilt through the zoo, so that
    its parameters are validated like --model's."""
    from pathlib import Path

    from edgefl.models.zoo import make_spec  # the zoo imports this module

    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"--spec {path}: no such file",
            hint="save one with `edgefl search ... --save spec.json`",
        )
    if p.stat().st_size > MAX_SPEC_BYTES:
        raise ConfigError(f"--spec {path} is larger than a model spec can be (1 MiB)")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--spec {path} cannot be read: {exc}") from None
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


def parse_value(value: str) -> Any:
    """A `key=value` option's value: true/false, `32x16` (a list of ints), an int, a float, or
    the string itself."""
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    if "x" in value and all(p.isdigit() for p in value.split("x")):
        return [int(p) for p in value.split("x")]
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def _short(v: Any) -> str:
    if isinstance(v, list):
        return "x".join(str(x) for x in v)
    return str(v)
