"""edgefl.exporters: the boundary between devices and the server.

Devices export self-describing ONNX files (``export_onnx``); the server reads its own files
(``read_artifact``) and validates untrusted uploads (``validate_upload``, ``ingest_dir``),
after a cheap count of what they declare (``declared_kinds``, ``peek_kind``: no parsing). Data
uploads (predictions, prototypes) are ONNX too (``write_constant_artifact``). This
package knows nothing about which method consumes an artifact and never imports ``edgefl``.
"""

from .atomic import atomic_write_bytes, atomic_write_text, write_model_atomic
from .constant import read_constant_outputs, write_constant_artifact
from .errors import ExportError, UploadRejected
from .export import MAX_INLINE_BYTES, ExportReport, export_onnx, max_relative_diff
from .folder import IngestResult, ingest_dir, list_uploads, shape_text
from .graph import weights_hash, without_weights
from .peek import declared_kinds, peek_kind, peek_metadata
from .quantize import QUANTIZED_TAG, quantize_int8
from .read import Artifact, get_metadata, read_artifact, set_metadata
from .schema import (
    ARTIFACT_KINDS,
    CONSTANT_KINDS,
    METADATA_KEY,
    SCHEMA_VERSION,
    validate_metadata,
)
from .timing import add_times, timed
from .validate import (
    DEFAULT_ALLOWED_OPS,
    DEFAULT_MAX_TENSOR_ELEMENTS,
    DEFAULT_MAX_UPLOAD_BYTES,
    validate_upload,
)

__all__ = [
    "ARTIFACT_KINDS",
    "CONSTANT_KINDS",
    "DEFAULT_ALLOWED_OPS",
    "DEFAULT_MAX_TENSOR_ELEMENTS",
    "DEFAULT_MAX_UPLOAD_BYTES",
    "METADATA_KEY",
    "QUANTIZED_TAG",
    "SCHEMA_VERSION",
    "Artifact",
    "ExportError",
    "MAX_INLINE_BYTES",
    "ExportReport",
    "IngestResult",
    "UploadRejected",
    "add_times",
    "atomic_write_bytes",
    "atomic_write_text",
    "declared_kinds",
    "export_onnx",
    "max_relative_diff",
    "get_metadata",
    "ingest_dir",
    "list_uploads",
    "peek_kind",
    "peek_metadata",
    "quantize_int8",
    "shape_text",
    "read_artifact",
    "read_constant_outputs",
    "set_metadata",
    "timed",
    "validate_metadata",
    "validate_upload",
    "weights_hash",
    "without_weights",
    "write_constant_artifact",
    "write_model_atomic",
]
