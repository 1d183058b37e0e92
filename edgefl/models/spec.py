"""ModelSpec: the JSON-serialisable description of a model that travels inside every artifact.

A spec names a zoo entry and carries the input shape, class count and the entry's hyperparameters.
`ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec` holds for every spec, so the
server can rebuild exactly the module a device trained. What needs the zoo lives above it:
a spec's human-readable label (edgefl.models.zoo.spec_label) and reading a spec from what a
user writes (edgefl.models.parse).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from edgefl.bounds import Range
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
    raise ConfigError(
        f"model param {where} has a non-JSON value of type {type(value).__name__}",
        hint=SPEC_HINT,
    )


# What a spec file is, for every refusal of one.
SPEC_HINT = (
    "pass a spec `edgefl search --save` wrote: a JSON object with name, input_shape, "
    "num_classes and params"
)


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
                f"input_shape must be (channels, height, width), got {self.input_shape}",
                hint=SPEC_HINT,
            )
        Range(2).check("num_classes", self.num_classes)

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
            raise ConfigError(
                f"a model spec must be a JSON object, got {type(data).__name__}", hint=SPEC_HINT
            )
        problems = []
        for key, typ in (("name", str), ("input_shape", list), ("num_classes", int)):
            if key not in data:
                problems.append(f"missing key {key!r}")
            elif not isinstance(data[key], typ) or isinstance(data[key], bool):
                problems.append(f"key {key!r} must be {typ.__name__}")
        extra = set(data) - {"name", "input_shape", "num_classes", "params", "searched"}
        if extra:
            problems.append(f"unknown keys {sorted(extra)}")
        params = data.get("params", {})
        if not isinstance(params, dict):
            problems.append("key 'params' must be an object")
        # what `edgefl search --save` searched it for (its profile, dataset, shard): a record only
        if not isinstance(data.get("searched", {}), dict):
            problems.append("key 'searched' must be an object")
        if problems:
            raise ConfigError("invalid model spec: " + "; ".join(problems), hint=SPEC_HINT)
        return cls(data["name"], tuple(data["input_shape"]), data["num_classes"], params)

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"model spec is not valid JSON: {exc}", hint=SPEC_HINT) from None


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
