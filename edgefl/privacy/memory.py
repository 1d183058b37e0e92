"""A memory probe for training steps: the peak of torch's CPU allocations while a function runs.

A process's resident set cannot check a 845 KiB budget (the interpreter and torch alone hold
hundreds of MiB), so the probe counts tensors: torch's profiler records every CPU allocation and
free of the run (`profile_memory`), and the peak is the largest running sum of them. Tensors that
exist before the run (the model's weights, an optimizer's state from an earlier step) are not
counted: build them inside `fn` to count them. The profiler's first use in a process takes ~2 s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def peak_bytes(fn: Callable[[], Any]) -> int:
    """The most bytes of CPU tensors allocated during `fn()` and alive at once."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    )
    live = peak = 0
    for _, nbytes in events:  # frees are negative
        live += nbytes
        peak = max(peak, live)
    return peak
