"""edgefl: one-shot federated learning for real edge devices.

Importing it changes nothing in the process; the `edgefl` command sets its thread settings
explicitly at start (edgefl.threads)."""

__version__ = "0.1.0"
