"""Accepted uploads, below every layer that reads them (client, fusion, server): the Upload
type, rebuilding a torch module from an artifact's spec and weights, and the parity check
against onnxruntime. exporters validated the file; this layer knows edgefl's model zoo."""

from edgefl.artifacts.header import read_header
from edgefl.artifacts.upload import (
    PARITY_ATOL,
    RebuildRejected,
    Upload,
    parity,
    park,
    random_inputs,
    rebuild,
)

__all__ = [
    "PARITY_ATOL",
    "RebuildRejected",
    "Upload",
    "park",
    "parity",
    "random_inputs",
    "read_header",
    "rebuild",
]
