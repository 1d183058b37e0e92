"""The objects `flwr run` loads (the app's pyproject.toml names them): edgefl's one-shot
ServerApp and ClientApp."""

from __future__ import annotations

from edgefl.flower.client_app import make_client_app
from edgefl.flower.server_app import make_server_app

client = make_client_app()
server = make_server_app()
