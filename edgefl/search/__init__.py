"""Architecture search on the device: PSO-FedNAS (pFedZKD) under the device's hard budget.

The search space (`nas-cnn`) lives with the other models in `edgefl.models.nas`; the client calls
`run_search` (`client train --search pso`) or `edgefl.client.run.search_client` (`edgefl search`).
This package never imports the client.
"""

from edgefl.search.pso import (
    METHODS,
    Candidate,
    SearchResult,
    run_search,
    search_architecture,
)
from edgefl.search.pso_config import PSOConfig

__all__ = [
    "METHODS",
    "Candidate",
    "PSOConfig",
    "SearchResult",
    "run_search",
    "search_architecture",
]
