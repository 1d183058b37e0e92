"""edgefl on Flower: a one-shot ServerApp and ClientApp over Flower's Message API, for its
simulation engine (`edgefl simulate --engine flower`) and its deployment runtime (a SuperLink
with SuperNodes, `flwr run`). Flower carries the bytes; what arrives goes through the same
validated ingest as `edgefl server fuse`. flwr is an optional extra: `pip install edgefl[flower]`.
"""

from __future__ import annotations

import sys

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


def load_simulation() -> None:
    """Import Flower's simulation package without TensorFlow. The package imports TensorFlow
    whenever it is installed (the deploy extra installs it) for a GPU memory-growth helper that
    edgefl never calls: ~4.5 s of CPU and ~600 MB resident in the driver and in every Ray actor,
    beyond what `resources.PROCESS_BYTES` plans for. TensorFlow stays importable afterwards.
    It is also every Ray actor's setup hook (`engine._ray_init_args`): it runs before the actor
    loads Flower."""
    if "flwr.simulation" in sys.modules:
        return
    hide = "tensorflow" not in sys.modules
    if hide:
        sys.modules["tensorflow"] = None  # `import tensorflow` fails as if it were absent
    try:
        import flwr.simulation  # noqa: F401
    finally:
        if hide and "tensorflow" in sys.modules and sys.modules["tensorflow"] is None:
            del sys.modules["tensorflow"]
