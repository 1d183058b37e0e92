"""The objects `flwr run` loads (the app's pyproject.toml names them): edgefl's one-shot
ServerApp and ClientApp."""

from __future__ import annotations

from edgefl.threads import share_cores_politely

# The process Flower starts for the app (a SuperNode's ClientApp, the SuperLink's ServerApp,
# which forks a worker per method) sets edgefl's thread settings before the apps load torch.
share_cores_politely()

from edgefl.flower.client_app import make_client_app  # noqa: E402
from edgefl.flower.server_app import make_server_app  # noqa: E402

client = make_client_app()
server = make_server_app()
