"""The metadata every edgefl artifact carries: one JSON object under one metadata_props key.

This module is pure Python so the server can check metadata without touching a model.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

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
    problems: list[str] = []

    def missing(key: str) -> bool:
        if key not in meta:
            problems.append(f"missing required key '{key}'")
            return True
        return False

    def wrong(key: str, expected: str) -> None:
        problems.append(f"'{key}' must be {expected}, got {_tname(meta[key])} {meta[key]!r:.60}")

    if not missing("schema_version") and (
        not _is_int(meta["schema_version"]) or meta["schema_version"] != SCHEMA_VERSION
    ):
        wrong("schema_version", f"the integer {SCHEMA_VERSION}")

    kind = meta.get("kind")
    if not missing("kind") and kind not in ARTIFACT_KINDS:
        wrong("kind", f"one of {', '.join(ARTIFACT_KINDS)}")

    if not missing("input_shape"):
        shape = meta["input_shape"]
        if not (
            isinstance(shape, list)
            and 1 <= len(shape) <= _MAX_INPUT_RANK
            and all(_is_int(d) and d > 0 for d in shape)
        ):
            wrong("input_shape", "a list of 1 to 3 positive ints (per sample, no batch)")
        elif math.prod(shape) > MAX_SAMPLE_ELEMENTS:
            wrong("input_shape", f"at most {MAX_SAMPLE_ELEMENTS:,} values per sample")
        elif kind in _MODEL_KINDS and len(shape) != 3:
            wrong("input_shape", f"[channels, height, width] for a {kind}")

    num_classes = meta.get("num_classes")
    classes_ok = _is_int(num_classes) and 2 <= num_classes <= MAX_CLASSES
    if not missing("num_classes") and not classes_ok:
        wrong("num_classes", f"an int from 2 to {MAX_CLASSES:,}")

    if not missing("class_names"):
        names = meta["class_names"]
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            wrong("class_names", "a list of strings")
        elif classes_ok and len(names) != num_classes:
            problems.append(
                f"'class_names' has {len(names)} entries but 'num_classes' is {num_classes}"
            )

    if not missing("edgefl_version") and not isinstance(meta["edgefl_version"], str):
        wrong("edgefl_version", "a string")

    if not missing("weights_sha256") and not (
        isinstance(meta["weights_sha256"], str) and _HEX64.fullmatch(meta["weights_sha256"])
    ):
        wrong("weights_sha256", "64 lowercase hex characters")

    if not missing("spec"):
        spec = meta["spec"]
        if spec is not None and not (isinstance(spec, dict) and isinstance(spec.get("name"), str)):
            wrong("spec", "an object with a string 'name', or null")

    if not missing("client_id") and not (isinstance(meta["client_id"], str) and meta["client_id"]):
        wrong("client_id", "a non-empty string")

    # Every kind's label counts are summed into the federation's: checked wherever they appear.
    counted = kind in ("classifier", "decoder", "predictions") or "label_counts" in meta
    if counted and not missing("label_counts"):
        counts = meta["label_counts"]
        if not (isinstance(counts, list) and all(_is_int(c) and c >= 0 for c in counts)):
            wrong("label_counts", "a list of non-negative ints")
        elif classes_ok and len(counts) != num_classes:
            problems.append(
                f"'label_counts' has {len(counts)} entries but 'num_classes' is {num_classes}"
            )
        elif not 0 < sum(counts) <= MAX_SAMPLES:
            problems.append(f"'label_counts' must sum to more than 0 and at most {MAX_SAMPLES:,}")
    if kind in ("classifier", "decoder"):
        if not missing("profile") and not (
            meta["profile"] is None or isinstance(meta["profile"], str)
        ):
            wrong("profile", "a string or null")
        for key in ("costs", "training"):
            if not missing(key) and not isinstance(meta[key], dict):
                wrong(key, "an object")

    if meta.get("quantized", False) not in (None, False, QUANTIZED_TAG):
        wrong("quantized", f"absent, false or {QUANTIZED_TAG!r}")

    if kind == "decoder" and not missing("latent_dim"):
        latent = meta["latent_dim"]
        if not (_is_int(latent) and 1 <= latent <= MAX_LATENT):
            wrong("latent_dim", f"an int from 1 to {MAX_LATENT:,}")

    if kind in CONSTANT_KINDS and meta.get("spec") is not None:
        # No weights travel in a data artifact: a spec would invite the server to rebuild one.
        wrong("spec", f"null for a {kind} artifact")
    if kind == "predictions":
        _check_predictions(meta, missing, wrong)
    if kind == "prototypes":
        _check_prototypes(meta, missing, wrong, problems, num_classes if classes_ok else None)

    if kind == "global":
        if not missing("method") and not isinstance(meta["method"], str):
            wrong("method", "a string")
        if not missing("config") and not isinstance(meta["config"], dict):
            wrong("config", "an object")
        if not missing("client_ids"):
            ids = meta["client_ids"]
            if not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
                wrong("client_ids", "a list of strings")

    problems.extend(_non_finite(meta, ""))
    return problems


def _check_predictions(meta: dict[str, Any], missing, wrong) -> None:
    if not missing("public_fingerprint") and not (
        isinstance(meta["public_fingerprint"], str) and _HEX64.fullmatch(meta["public_fingerprint"])
    ):
        wrong("public_fingerprint", "64 lowercase hex characters (sha256 of the public samples)")
    if not missing("public_size") and not (
        _is_int(meta["public_size"]) and 1 <= meta["public_size"] <= MAX_PUBLIC
    ):
        wrong("public_size", f"an int from 1 to {MAX_PUBLIC:,}")


def _check_prototypes(meta: dict[str, Any], missing, wrong, problems, num_classes) -> None:
    if not missing("representation_size") and not (
        _is_int(meta["representation_size"]) and 1 <= meta["representation_size"] <= MAX_LATENT
    ):
        wrong("representation_size", f"an int from 1 to {MAX_LATENT:,}")
    classes_valid = False
    if not missing("classes"):
        classes = meta["classes"]
        if not (isinstance(classes, list) and classes and all(_is_int(c) for c in classes)):
            wrong("classes", "a non-empty list of class ids")
        elif len(set(classes)) != len(classes):
            problems.append("'classes' lists a class more than once")
        elif num_classes is not None and not all(0 <= c < num_classes for c in classes):
            problems.append(f"'classes' has ids outside 0..{num_classes - 1}")
        else:
            classes_valid = True
    if not missing("counts"):
        counts = meta["counts"]
        if not (
            isinstance(counts, list) and all(_is_int(c) and 1 <= c <= MAX_SAMPLES for c in counts)
        ):
            wrong(
                "counts",
                f"a list of ints from 1 to {MAX_SAMPLES:,} (samples behind each class mean)",
            )
        elif classes_valid and len(counts) != len(meta["classes"]):
            problems.append(
                f"'counts' has {len(counts)} entries but 'classes' has {len(meta['classes'])}"
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
