"""Reading artifacts back: metadata access and a small wrapper around one loaded model."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from .graph import real_inputs
from .schema import METADATA_KEY, decode_metadata, encode_metadata

# onnxruntime severity FATAL: its warnings are noise to a user, and its errors come back as
# exceptions that edgefl turns into one message; its own log lines would put a hostile
# upload's node names on the operator's terminal raw.
_QUIET = 4
SPINNING_KEYS = ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning")


def get_metadata(model: onnx.ModelProto) -> dict[str, Any] | None:
    """The edgefl metadata object, None if absent; ValueError if malformed or duplicated."""
    values = [p.value for p in model.metadata_props if p.key == METADATA_KEY]
    if not values:
        return None
    if len(values) > 1:
        raise ValueError(f"metadata key '{METADATA_KEY}' appears {len(values)} times")
    return decode_metadata(values[0])


def set_metadata(model: onnx.ModelProto, meta: dict[str, Any]) -> None:
    """Store ``meta`` as the single ``METADATA_KEY`` entry, keeping other entries."""
    text = encode_metadata(meta)
    keep = [(p.key, p.value) for p in model.metadata_props if p.key != METADATA_KEY]
    del model.metadata_props[:]
    for key, value in [*keep, (METADATA_KEY, text)]:
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value


def session_options() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.log_severity_level = _QUIET
    # Idle pool threads sleep instead of spinning: on cores shared with other processes the
    # spinners take the CPU from the thread doing the work. One knob for both thread pools: a
    # user who sets OMP_WAIT_POLICY=ACTIVE (a dedicated machine) gets onnxruntime's spinning too.
    spin = "1" if os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "ACTIVE" else "0"
    for key in SPINNING_KEYS:
        options.add_session_config_entry(key, spin)
    return options


@dataclass
class Artifact:
    """One model file, parsed once; the onnxruntime session is built on first use."""

    path: str
    size_bytes: int
    metadata: dict[str, Any]
    model: onnx.ModelProto = field(repr=False)
    input_names: list[str]
    output_names: list[str]
    _data: bytes = field(repr=False, default=b"")
    _sessions: dict[tuple[str, ...], ort.InferenceSession] = field(repr=False, default_factory=dict)
    # Its name in the upload folder it was ingested from: "phones/client-000.onnx" when read
    # from a subfolder (ingest_dir(recursive=True)); "" elsewhere (the file name is used).
    name: str = ""
    # An upload's: sha256 of the bytes validated (exporters.validate), what a report names as
    # the file it used, so a later reader can tell whether the file beside it is still that one.
    sha256: str = ""

    @property
    def kind(self) -> str | None:
        return self.metadata.get("kind")

    @property
    def client_id(self) -> str | None:
        return self.metadata.get("client_id")

    def session(self, providers: list[str] | None = None) -> ort.InferenceSession:
        # Built from the bytes already in memory: onnxruntime never re-resolves the path.
        key = tuple(providers or ["CPUExecutionProvider"])
        if key not in self._sessions:
            data = self._data or self.model.SerializeToString()
            self._sessions[key] = ort.InferenceSession(
                data, sess_options=session_options(), providers=list(key)
            )
        return self._sessions[key]

    def run(self, *arrays: Any) -> np.ndarray:
        """Run on positional inputs (cast to float32); returns the first output."""
        if len(arrays) != len(self.input_names):
            raise ValueError(f"expected {len(self.input_names)} inputs, got {len(arrays)}")
        feed = {
            n: np.asarray(a, dtype=np.float32)
            for n, a in zip(self.input_names, arrays, strict=True)
        }
        return self.session().run(None, feed)[0]

    def state_dict(self, strip_prefix: str = "") -> dict[str, np.ndarray]:
        """Initializers by name (== the exporting module's state_dict keys).

        ``strip_prefix`` drops a wrapper module's attribute prefix (e.g. "model.") if present.
        Unused buffers (BatchNorm's num_batches_tracked) are not exported: load with strict=False.
        """
        out: dict[str, np.ndarray] = {}
        for tensor in self.model.graph.initializer:
            name = tensor.name
            if strip_prefix and name.startswith(strip_prefix):
                name = name[len(strip_prefix) :]
            out[name] = numpy_helper.to_array(tensor).copy()
        return out


def artifact_from_bytes(
    path: str | os.PathLike[str], data: bytes, model: onnx.ModelProto, metadata: dict[str, Any]
) -> Artifact:
    return Artifact(
        path=str(path),
        size_bytes=len(data),
        metadata=metadata,
        model=model,
        input_names=[v.name for v in real_inputs(model.graph)],
        output_names=[v.name for v in model.graph.output],
        _data=data,
    )


def read_artifact(path: str | os.PathLike[str], *, require_metadata: bool = True) -> Artifact:
    """Load a TRUSTED artifact (our own export). Untrusted uploads go through validate_upload."""
    data = Path(path).read_bytes()
    # From bytes, not from the path: no external-data resolution relative to the file.
    model = onnx.load_model_from_string(data)
    metadata = get_metadata(model)
    if metadata is None:
        if require_metadata:
            raise ValueError(f"{path}: no '{METADATA_KEY}' metadata; not an edgefl artifact")
        metadata = {}
    return artifact_from_bytes(path, data, model, metadata)
