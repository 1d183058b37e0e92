"""What each simulated client needs of the host, from its device profile, and how many of each
kind Flower's simulation engine may run at once.

A device trains single-threaded, so a client asks for one core. Its memory on the host is the
process (torch, onnxruntime, the exporter), the decoded dataset it partitions, and the exact
training footprint of the model its profile trains (`Costs.train_bytes`: weights, gradients,
optimizer state, one batch of activations), doubled for what autograd and the allocator add
beyond that count. Flower's engine gives every virtual client of one run the same resources,
so clients whose kinds may run equally many at a time share a run; a kind that needs more
memory gets its own run with fewer at once, instead of slowing every other kind to its pace.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from edgefl.client.job import job_optimizer
from edgefl.client.run import ClientJob
from edgefl.data.registry import DATASETS
from edgefl.models.cost import costs
from edgefl.models.parse import parse_model_arg
from edgefl.profiles import get_profile

# A client process before its data and model: torch, onnxruntime, the ONNX exporter (measured
# around 500 MiB resident on these machines; rounded up).
PROCESS_BYTES = 640 << 20
ALLOCATOR_FACTOR = 2  # autograd's saved tensors and the allocator's slack beyond `train_bytes`


@dataclass(frozen=True)
class ClientResources:
    profile: str
    model: str
    num_cpus: int
    num_gpus: float
    memory_bytes: int  # estimated resident memory of one client on the host

    def as_dict(self) -> dict:
        return {
            "profile": self.profile,
            "model": self.model,
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "memory_bytes": self.memory_bytes,
        }


@dataclass(frozen=True)
class Group:
    """Clients that run in one Flower simulation with the same resources each."""

    clients: tuple[int, ...]  # client indices
    num_cpus: int
    num_gpus: float
    at_once: int  # how many of them Ray runs at a time


def client_resources(cjob: ClientJob, gpu: bool) -> ClientResources:
    info = DATASETS.get(cjob.dataset)
    profile = get_profile(cjob.profile)
    spec = parse_model_arg(cjob.model, info.input_shape, info.num_classes)
    train = costs(spec).train_bytes(
        cjob.batch_size or profile.batch_size, job_optimizer(cjob, profile)
    )
    data = (cjob.subset or info.train_size) * math.prod(info.input_shape) * 4
    return ClientResources(
        cjob.profile,
        cjob.model,
        1,
        0.0 if not gpu else 1.0,
        PROCESS_BYTES + data + ALLOCATOR_FACTOR * train,
    )


def available_memory() -> int:
    """Memory the host can give without swapping: MemAvailable where Linux says it."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def plan_groups(needs: list[ClientResources], jobs: int, memory: int) -> list[Group]:
    """One group per distinct number-at-once (at most --jobs, at least one, as many as the
    memory holds), in client order of first appearance; on a GPU the clients of a run share it
    in equal parts."""
    at_once = [max(1, min(jobs, memory // max(1, r.memory_bytes))) for r in needs]
    groups: dict[tuple[int, bool], list[int]] = {}
    for i, (n, r) in enumerate(zip(at_once, needs, strict=True)):
        groups.setdefault((n, r.num_gpus > 0), []).append(i)
    return [Group(tuple(ix), 1, (1.0 / n) if gpu else 0.0, n) for (n, gpu), ix in groups.items()]
