"""edgefl: one-shot federated learning for real edge devices."""

__version__ = "0.1.0"
