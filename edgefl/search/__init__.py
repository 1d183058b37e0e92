"""Architecture search on the device: PSO-FedNAS (pFedZKD) under the device's hard budget.

The zoo registers `nas-cnn` from `edgefl.search.nas_model` and `pso` needs the zoo, so this
package imports `pso` only when called.
"""

from __future__ import annotations

from typing import Any


def run_search(method: str, **kwargs: Any):
    """The hook `edgefl.client.run.choose_model` calls: the best spec found by `method`."""
    from edgefl.search.pso import run_search as _run

    return _run(method, **kwargs)


def search_client(job, config=None, *, on_status=None):
    """Search on exactly the shard and train/validation split `run_client` would use for `job`
    (a ClientJob). Returns a pso.SearchResult."""
    from edgefl.client.run import client_shard, dataset_info_for
    from edgefl.data import load_dataset, train_val_split
    from edgefl.profiles import get_profile
    from edgefl.search.pso import search_architecture

    profile = get_profile(job.profile)
    data = load_dataset(job.dataset, "train", data_dir=job.data_dir)
    info = dataset_info_for(job.dataset, data)
    shard = client_shard(job, data)
    train_idx, val_idx = train_val_split(shard, 0.1, seed=job.seed + job.client_index)
    local = (data.x[train_idx], data.y[train_idx], data.x[val_idx], data.y[val_idx])
    return search_architecture(
        profile, info, local, samples=len(train_idx), batch_size=job.batch_size, seed=job.seed,
        config=config, on_status=on_status,
    )  # fmt: skip


def __getattr__(name: str):
    # PSOConfig, SearchResult, search_architecture, ... come from pso on first use.
    from edgefl.search import pso

    try:
        return getattr(pso, name)
    except AttributeError:
        raise AttributeError(f"module 'edgefl.search' has no attribute {name!r}") from None


__all__ = ["run_search", "search_client"]
