"""edgefl on Flower: a one-shot ServerApp and ClientApp over Flower's Message API, for its
simulation engine (`edgefl simulate --engine flower`) and its deployment runtime (a SuperLink
with SuperNodes, `flwr run`). Flower carries the bytes; what arrives goes through the same
validated ingest as `edgefl server fuse`. flwr is an optional extra: `pip install edgefl[flower]`.
"""

from __future__ import annotations

from edgefl.errors import ConfigError


def require_flower() -> None:
    """One clear message, before any work, when the extra is not installed."""
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise ConfigError(
            "the Flower engine needs the flower extra (flwr with its Ray simulation engine)",
            hint='pip install "edgefl[flower]"',
        ) from None
