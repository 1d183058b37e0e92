"""The metadata every edgefl artifact carries: one JSON object under one metadata_props key.

This module is pure Python so the server can check metadata without touching a model.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

METADATA_KEY = "edgefl"
SCHEMA_VERSION = 1
ARTIFACT_KINDS = ("classifier", "decoder", "global", "predictions", "prototypes")
# Kinds that carry data, not a model: a graph with no inputs whose outputs are constant
# initializers (exporters.constant), so they pass the same ingest as every model upload.
CONSTANT_KINDS = ("predictions", "prototypes")

_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAX_INPUT_RANK = 3
# Every number the server sizes work or memory by is bounded here, before anything uses it: an
# upload's metadata is the client's word. Far above any real edge task, far below harm.
MAX_SAMPLE_ELEMENTS = 1 << 24  # one input sample: a 4096 x 4096 image at most
MAX_CLASSES = 100_000
MAX_LATENT = 65_536
MAX_SAMPLES = 10**12  # one client's label counts, summed
MAX_PUBLIC = 10**7  # samples of a public set a predictions upload labels
# The one value `quantized` may carry (exporters.quantize writes it): the server runs such an
# upload through onnxruntime only, so any other truthy value would be a claim it cannot check.
QUANTIZED_TAG = "int8-dynamic"
# A model upload's per-sample input is (channels, height, width) (sensor windows: (C, 1, L)),
# the shape every zoo model and every student the server trains reads; a global FedGH header
# takes a representation ([R]), hence the rank 1-3 allowed in general.
_MODEL_KINDS = ("classifier", "decoder")


def _is_int(value: Any) -> bool:
    # bool is an int subclass; `true` is never a valid count or dimension.
    return isinstance(value, int) and not isinstance(value, bool)


def _tname(value: Any) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "bool", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def validate_metadata(meta: object) -> list[str]:
    """Return every problem with ``meta`` (empty list: valid). Each message names its key."""
    if not isinstance(meta, dict):
        return [f"metadata must be a JSON object, got {_tname(meta)}"]
    if meta.get("deployed") is True:  # edgefl deploy's output: its own record, said as such
        return ["a model `edgefl deploy` wrote for a device, not a client upload or a global "
                "model"]  # fmt: skip
    num_classes = meta.get("num_classes")
    ctx = _Context(meta, meta.get("kind"), num_classes if _num_classes_ok(num_classes) else None)
    problems = [p for rule in _RULES if (p := _apply(rule, ctx)) is not None]
    problems.extend(_non_finite(meta, ""))
    return problems


@dataclass(frozen=True)
class _Context:
    """What a rule may look at beside its own value."""

    meta: dict[str, Any]
    kind: Any
    num_classes: int | None  # None unless 'num_classes' itself is valid


# A check gets (key, value, context) and returns one problem or None.
_Check = Callable[[str, Any, _Context], str | None]


def _always(ctx: _Context) -> bool:
    return True


class _Rule(NamedTuple):
    key: str
    check: _Check
    applies: Callable[[_Context], bool] = _always
    # An optional key is checked only when present; a required one is reported when missing.
    required: bool = True


def _apply(rule: _Rule, ctx: _Context) -> str | None:
    if not rule.applies(ctx):
        return None
    if rule.key not in ctx.meta:
        return f"missing required key '{rule.key}'" if rule.required else None
    return rule.check(rule.key, ctx.meta[rule.key], ctx)


def _wrong(key: str, value: Any, expected: str) -> str:
    return f"'{key}' must be {expected}, got {_tname(value)} {value!r:.60}"


def _entries(key: str, n: int, other: str, m: int) -> str:
    return f"'{key}' has {n} entries but '{other}' is {m}"


def _unless(ok: Callable[[Any], Any], expected: str) -> _Check:
    """A check that refuses any value for which ``ok`` is falsy."""
    return lambda key, value, ctx: None if ok(value) else _wrong(key, value, expected)


def _int_in(low: int, high: int) -> Callable[[Any], bool]:
    return lambda value: _is_int(value) and low <= value <= high


def _hex64(value: Any) -> Any:
    return isinstance(value, str) and _HEX64.fullmatch(value)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_dict(value: Any) -> bool:
    return isinstance(value, dict)


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _check_input_shape(key: str, shape: Any, ctx: _Context) -> str | None:
    if not (
        isinstance(shape, list)
        and 1 <= len(shape) <= _MAX_INPUT_RANK
        and all(_is_int(d) and d > 0 for d in shape)
    ):
        return _wrong(key, shape, "a list of 1 to 3 positive ints (per sample, no batch)")
    if math.prod(shape) > MAX_SAMPLE_ELEMENTS:
        return _wrong(key, shape, f"at most {MAX_SAMPLE_ELEMENTS:,} values per sample")
    if ctx.kind in _MODEL_KINDS and len(shape) != 3:
        return _wrong(key, shape, f"[channels, height, width] for a {ctx.kind}")
    return None


def _check_class_names(key: str, names: Any, ctx: _Context) -> str | None:
    if not _str_list(names):
        return _wrong(key, names, "a list of strings")
    if ctx.num_classes is not None and len(names) != ctx.num_classes:
        return _entries(key, len(names), "num_classes", ctx.num_classes)
    return None


def _check_label_counts(key: str, counts: Any, ctx: _Context) -> str | None:
    if not (isinstance(counts, list) and all(_is_int(c) and c >= 0 for c in counts)):
        return _wrong(key, counts, "a list of non-negative ints")
    if ctx.num_classes is not None and len(counts) != ctx.num_classes:
        return _entries(key, len(counts), "num_classes", ctx.num_classes)
    if not 0 < sum(counts) <= MAX_SAMPLES:
        return f"'{key}' must sum to more than 0 and at most {MAX_SAMPLES:,}"
    return None


def _check_constant_spec(key: str, spec: Any, ctx: _Context) -> str | None:
    # No weights travel in a data artifact: a spec would invite the server to rebuild one.
    return None if spec is None else _wrong(key, spec, f"null for a {ctx.kind} artifact")


def _check_classes(key: str, classes: Any, ctx: _Context) -> str | None:
    if not (isinstance(classes, list) and classes and all(_is_int(c) for c in classes)):
        return _wrong(key, classes, "a non-empty list of class ids")
    if len(set(classes)) != len(classes):
        return f"'{key}' lists a class more than once"
    if ctx.num_classes is not None and not all(0 <= c < ctx.num_classes for c in classes):
        return f"'{key}' has ids outside 0..{ctx.num_classes - 1}"
    return None


def _counts_stated(ctx: _Context) -> bool:
    """(Of a prototypes upload.) Prototypes state their per-class counts where the label counts are released exactly, or
    where DP released both (the counts then noisy); withheld or noised label counts leave them
    out: the exact counts are that histogram."""
    record = ctx.meta.get("privacy")
    dp_prototypes = isinstance(record, dict) and "prototypes" in record
    return _label_release(ctx) == "exact" or dp_prototypes


def _check_counts(key: str, counts: Any, ctx: _Context) -> str | None:
    if not _counts_stated(ctx):
        return (
            f"'{key}' states exact class counts, but the privacy record releases the label "
            f"counts {_label_release(ctx)}"
        )
    if not (isinstance(counts, list) and all(_is_int(c) and 1 <= c <= MAX_SAMPLES for c in counts)):
        return _wrong(
            key,
            counts,
            f"a list of ints from 1 to {MAX_SAMPLES:,} (samples behind each class mean)",
        )
    # Compared with 'classes' only where that key passed its own check (the rule before).
    classes = ctx.meta.get("classes")
    classes_valid = "classes" in ctx.meta and _check_classes("classes", classes, ctx) is None
    if classes_valid and len(counts) != len(classes):
        return f"'{key}' has {len(counts)} entries but 'classes' has {len(classes)}"
    return None


def _kind_is(*kinds: str) -> Callable[[_Context], bool]:
    return lambda ctx: ctx.kind in kinds


def _counted(ctx: _Context) -> bool:
    # Every kind's label counts are summed into the federation's: checked wherever they appear,
    # required of the kinds that carry them unless the privacy record says they are withheld.
    if "label_counts" in ctx.meta:
        return True
    return ctx.kind in ("classifier", "decoder", "predictions") and _label_release(ctx) == "exact"


def _label_release(ctx: _Context) -> Any:
    """How the label counts were released, by the upload's privacy record ("exact" without
    one, or for a record that does not say: its own rule reports it)."""
    record = ctx.meta.get("privacy")
    labels = record.get("label_counts") if isinstance(record, dict) else None
    return labels.get("release", "exact") if isinstance(labels, dict) else "exact"


# --- the privacy record (issue 57): its shape only; edgefl recomputes what it spent ---------

PRIVACY_MECHANISMS = ("none", "dp-sgd")
LABEL_RELEASES = ("exact", "noised", "absent")
NOISE_SOURCES = ("secret", "seeded")  # seeded: a simulation's, replayable by who knows the seed
_PLAN_NUMBERS = ("epsilon", "delta", "clip", "noise_multiplier", "sample_rate")


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _probability(value: Any) -> bool:
    return _positive(value) and value < 1


def _check_plan(plan: Any) -> str | None:
    """The DP-SGD plan: DPPlan.as_dict() of edgefl.privacy."""
    if not isinstance(plan, dict):
        return f"'dp_sgd' must be an object, got {_tname(plan)}"
    expected = set(_PLAN_NUMBERS) | {"steps", "accountant", "mechanism"}
    if set(plan) != expected:
        return f"'dp_sgd' must hold exactly {', '.join(sorted(expected))}"
    bad = [k for k in _PLAN_NUMBERS if not _positive(plan[k])]
    bad += [k for k in ("delta", "sample_rate") if k not in bad and not plan[k] <= 1]
    bad += [] if _is_int(plan["steps"]) and plan["steps"] >= 1 else ["steps"]
    bad += [k for k in ("accountant", "mechanism") if not _is_str(plan[k])]
    return f"'dp_sgd' has invalid {', '.join(bad)}" if bad else None


def _check_labels(labels: Any, ctx: _Context) -> str | None:
    if not isinstance(labels, dict) or labels.get("release") not in LABEL_RELEASES:
        return f"'label_counts' must be an object whose 'release' is one of {LABEL_RELEASES}"
    if labels["release"] == "absent" and "label_counts" in ctx.meta:
        return "'label_counts' says absent, but the metadata carries label counts"
    if labels["release"] != "noised":
        return None
    ok = (
        labels.get("mechanism") == "gaussian"
        and labels.get("sensitivity") == 1
        and _positive(labels.get("noise_multiplier"))
        and _positive(labels.get("epsilon"))
        and _probability(labels.get("delta"))
    )
    return (
        None
        if ok
        else (
            "noised 'label_counts' must name mechanism gaussian, sensitivity 1 and a positive "
            "noise_multiplier, epsilon and delta (in (0, 1))"
        )
    )


def _check_privacy(key: str, record: Any, ctx: _Context) -> str | None:
    """What an upload says it spent of its clients' privacy: a shape the server can recompute."""
    if not isinstance(record, dict) or record.get("mechanism") not in PRIVACY_MECHANISMS:
        return _wrong(key, record, f"an object whose 'mechanism' is one of {PRIVACY_MECHANISMS}")
    problem = _check_labels(record.get("label_counts"), ctx)
    if problem is None and record["mechanism"] == "dp-sgd":
        problem = _check_plan(record.get("dp_sgd"))
    elif problem is None and "dp_sgd" in record:
        problem = "'dp_sgd' is given, but the mechanism is none"
    problem = problem or _check_extras(record)
    noised = record["label_counts"]["release"] == "noised" if problem is None else False
    if problem is None and (record["mechanism"] == "dp-sgd" or noised):
        problem = _check_total(record)
    return None if problem is None else f"'{key}': {problem}"


def _check_extras(record: dict[str, Any]) -> str | None:
    """The DP prototypes' part, if any, and where the noise came from."""
    if "prototypes" in record and (problem := _check_prototypes_part(record)):
        return problem
    if record.get("noise", "secret") not in NOISE_SOURCES:
        return f"'noise' must be one of {NOISE_SOURCES}"
    return None


def _check_prototypes_part(record: dict[str, Any]) -> str | None:
    """DP prototypes' release: sums of representations clipped to norm `clip` and counts,
    sensitivity clip x sqrt(2), from a DP-trained model (edgefl.client.privacy)."""
    part = record["prototypes"]
    ok = (
        record["mechanism"] == "dp-sgd"
        and isinstance(part, dict)
        and set(part) == set(_PROTOTYPES_KEYS)
        and part["mechanism"] == "gaussian"
        and part["representation"] == "clipped"
        and _positive(part["clip"])
        and _positive(part["sensitivity"])
        and math.isclose(part["sensitivity"], part["clip"] * math.sqrt(2), rel_tol=1e-9)
        and all(_positive(part[k]) for k in ("noise_multiplier", "epsilon"))
        and _probability(part["delta"])
    )
    return (
        None
        if ok
        else (
            "'prototypes' must come with mechanism dp-sgd and hold exactly "
            f"{', '.join(_PROTOTYPES_KEYS)}: gaussian, clipped, sensitivity clip x sqrt(2), a positive "
            "noise_multiplier and epsilon, and delta in (0, 1)"
        )
    )


_PROTOTYPES_KEYS = (
    "mechanism",
    "representation",
    "clip",
    "sensitivity",
    "noise_multiplier",
    "epsilon",
    "delta",
)


def _check_total(record: dict[str, Any]) -> str | None:
    """A DP record's total (null: not private as a whole) and its accountant's name."""
    total = (record.get("epsilon"), record.get("delta"))
    if total != (None, None) and not (_positive(total[0]) and _probability(total[1])):
        return "'epsilon' and 'delta' must be a positive number and one in (0, 1), or null"
    return None if _is_str(record.get("accountant")) else "'accountant' must be a string"


_num_classes_ok = _int_in(2, MAX_CLASSES)
_model = _kind_is(*_MODEL_KINDS)
_predictions = _kind_is("predictions")
_prototypes = _kind_is("prototypes")
_global = _kind_is("global")

# Evaluated in this order, one problem per rule at most: the order of the messages is the
# order of the rules.
_RULES: tuple[_Rule, ...] = (
    _Rule(
        "schema_version",
        _unless(lambda v: _is_int(v) and v == SCHEMA_VERSION, f"the integer {SCHEMA_VERSION}"),
    ),
    _Rule("kind", _unless(lambda v: v in ARTIFACT_KINDS, f"one of {', '.join(ARTIFACT_KINDS)}")),
    _Rule("input_shape", _check_input_shape),
    _Rule("num_classes", _unless(_num_classes_ok, f"an int from 2 to {MAX_CLASSES:,}")),
    _Rule("class_names", _check_class_names),
    _Rule("edgefl_version", _unless(_is_str, "a string")),
    _Rule("weights_sha256", _unless(_hex64, "64 lowercase hex characters")),
    _Rule(
        "spec",
        _unless(
            lambda v: v is None or (isinstance(v, dict) and isinstance(v.get("name"), str)),
            "an object with a string 'name', or null",
        ),
    ),
    _Rule("client_id", _unless(lambda v: isinstance(v, str) and v, "a non-empty string")),
    _Rule("label_counts", _check_label_counts, _counted),
    _Rule(
        "profile", _unless(lambda v: v is None or isinstance(v, str), "a string or null"), _model
    ),
    _Rule("costs", _unless(_is_dict, "an object"), _model),
    _Rule("training", _unless(_is_dict, "an object"), _model),
    _Rule("privacy", _check_privacy, _kind_is(*ARTIFACT_KINDS[:2], *CONSTANT_KINDS), False),
    _Rule(
        "quantized",
        _unless(lambda v: v in (None, False, QUANTIZED_TAG), f"absent, false or {QUANTIZED_TAG!r}"),
        required=False,
    ),
    _Rule(
        "latent_dim",
        _unless(_int_in(1, MAX_LATENT), f"an int from 1 to {MAX_LATENT:,}"),
        _kind_is("decoder"),
    ),
    _Rule("spec", _check_constant_spec, _kind_is(*CONSTANT_KINDS), required=False),
    _Rule(
        "public_fingerprint",
        _unless(_hex64, "64 lowercase hex characters (sha256 of the public samples)"),
        _predictions,
    ),
    _Rule(
        "public_size",
        _unless(_int_in(1, MAX_PUBLIC), f"an int from 1 to {MAX_PUBLIC:,}"),
        _predictions,
    ),
    _Rule(
        "representation_size",
        _unless(_int_in(1, MAX_LATENT), f"an int from 1 to {MAX_LATENT:,}"),
        _prototypes,
    ),
    _Rule("classes", _check_classes, _prototypes),
    # required where stated (`_counts_stated`); present otherwise, a problem of its own
    _Rule(
        "counts",
        _check_counts,
        lambda ctx: _prototypes(ctx) and (_counts_stated(ctx) or "counts" in ctx.meta),
    ),
    _Rule("method", _unless(_is_str, "a string"), _global),
    _Rule("config", _unless(_is_dict, "an object"), _global),
    _Rule("client_ids", _unless(_str_list, "a list of strings"), _global),
)


def _non_finite(value: Any, where: str) -> list[str]:
    # JSON has no NaN/Infinity; a NaN loss would otherwise make the file unreadable by strict
    # parsers (and by decode_metadata below).
    if isinstance(value, float) and not math.isfinite(value):
        return [f"'{where}' is {value}, which JSON cannot carry"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _non_finite(v, f"{where}.{k}" if where else k)]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _non_finite(v, f"{where}[{i}]")]
    return []


def encode_metadata(meta: dict[str, Any]) -> str:
    """Canonical JSON text for ``meta`` (sorted keys, strict: NaN/Infinity refused)."""
    return json.dumps(meta, sort_keys=True, allow_nan=False, separators=(",", ":"))


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def decode_metadata(text: str) -> dict[str, Any]:
    """Parse metadata JSON; raise ValueError if it is not a strict-JSON object."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError as exc:
        raise ValueError("metadata JSON is nested too deeply") from exc
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"metadata is not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise ValueError(f"metadata must be a JSON object, got {_tname(value)}")
    return value
