"""The machine's own peak, measured in the run that reports against it (issue 59): the dense fp32
matmul rate (multiply-adds per second) and the copy bandwidth (bytes per second) of this process's
torch, at a given thread count. A bench measures them before its work and again after it (the
machine is shared and noisy) and reports each stage's achieved rate as a fraction of them.

    from _peak import machine_peak  # bench/ is on sys.path when run as a script
"""

from __future__ import annotations

import contextlib
import time

import torch


def timed(fn, device="cpu"):
    """(seconds, value) of one call of `fn`, an accelerator's queued work included."""
    start = time.perf_counter()
    value = fn()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, value


def matmul_peak(n: int = 2048, repeats: int = 5, device="cpu") -> float:
    """Best multiply-adds per second of an n x n fp32 matmul on `device` (on a GPU, as torch's
    matmul precision is set: strict fp32 unless the caller allows TF32)."""
    a, b = torch.rand(n, n, device=device), torch.rand(n, n, device=device)
    timed(lambda: torch.mm(a, b), device)
    best = min(timed(lambda: torch.mm(a, b), device)[0] for _ in range(repeats))
    return n**3 / best


def copy_bandwidth(mib: int = 256, repeats: int = 5, device="cpu") -> float:
    """Best bytes per second moved (read + write) by copying a `mib` MiB fp32 tensor."""
    src = torch.rand(mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    timed(lambda: dst.copy_(src), device)
    best = min(timed(lambda: dst.copy_(src), device)[0] for _ in range(repeats))
    return 2 * src.numel() * 4 / best


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """torch at `threads` threads for the block (None: as it is), restored after."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def machine_peak(
    threads: int | None = None, n: int = 2048, mib: int = 256, repeats: int = 5
) -> dict:
    """{"threads", "matmul_gmacs", "copy_gbs"}: `matmul_peak` (GMAC/s) and `copy_bandwidth`
    (GB/s, 1e9 bytes) measured now at `threads` torch threads (None: torch's current count)."""
    with torch_threads(threads) as used:
        matmul = matmul_peak(n, repeats)
        copy = copy_bandwidth(mib, repeats)
    return {
        "threads": used,
        "matmul_gmacs": round(matmul / 1e9, 2),
        "copy_gbs": round(copy / 1e9, 2),
    }


def gpu_peaks(device, repeats: int = 10, mib: int = 2048) -> dict:
    """The GPU's matmul rate, strict fp32 and TF32 (GMAC/s), and its copy bandwidth (GB/s)."""
    cuda = torch.backends.cuda.matmul
    before = cuda.allow_tf32
    try:
        cuda.allow_tf32 = False
        strict = matmul_peak(8192, repeats, device)
        cuda.allow_tf32 = True
        tf32 = matmul_peak(8192, repeats, device)
    finally:
        cuda.allow_tf32 = before
    return {
        "gpu": torch.cuda.get_device_name(device),
        "matmul_gmacs_fp32": round(strict / 1e9, 1),
        "matmul_gmacs_tf32": round(tf32 / 1e9, 1),
        "copy_gbs": round(copy_bandwidth(mib, repeats, device) / 1e9, 1),
        "conv_tf32": torch.backends.cudnn.allow_tf32,
    }
