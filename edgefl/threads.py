"""Thread settings for cores shared with other processes, set explicitly by a program that
runs edgefl's work (the `edgefl` command, Flower's app, a simulation's workers) before torch is
imported. Importing edgefl never sets them: a library must not change the process it is
imported into. A script of your own that imports torch and then forks (`server fuse` does, one
worker per method) calls `share_cores_politely()` first."""

import os
import time


def _free_cpus() -> int:
    """CPUs not taken by other runnable tasks right now (/proc/loadavg's running count, the
    least of 3 looks 5 ms apart so that a passing task is not counted); os.cpu_count() if the
    count cannot be read."""
    cpus = os.cpu_count() or 1
    running = []
    for attempt in range(3):
        try:
            with open("/proc/loadavg") as f:
                running.append(int(f.read().split()[3].split("/")[0]))
        except (OSError, ValueError, IndexError):
            return cpus
        if attempt < 2:
            time.sleep(0.005)
    return max(1, cpus - (min(running) - 1))  # -1: this process is one of them


def share_cores_politely() -> None:
    """Thread settings for cores shared with other processes; a value the user set wins.

    Call it before `import torch` (and numpy): libgomp (torch's OpenMP pool, MKL, oneDNN) and
    OpenBLAS read them once, when they load; processes started afterwards inherit them.
    Measured with bench/bench_load.py on 2 cores beside two busy processes, `server fuse` (6 s
    quiet): libgomp's default, spinning ~3 ms per wait, took 12-145 s (the spinners take the
    CPU the working thread needs); PASSIVE, sleeping at once, 13-17 s (a shorter spin still had
    28-53 s tails); PASSIVE and one thread 10 s: a 2-thread region waits for its slower thread,
    which on a busy core waits for a time slice. So: never spin, and no more threads than cores
    free when the command starts.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if "OMP_NUM_THREADS" not in os.environ:
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        free = _free_cpus()
        if free < usable:
            os.environ["OMP_NUM_THREADS"] = str(free)
    # `server fuse` forks a worker per method after the ingest has run torch (MKL) in threads.
    # MKL's own buffer cache can then spin forever in the child (seen 2026-11-27: a forked
    # FedMHO worker at 100% CPU for 8 minutes inside mkl_serv_allocate, in the suite's
    # piped-progress test); without the cache MKL allocates with malloc, which is fork-safe.
    # Read when MKL starts: set before torch.
    os.environ.setdefault("MKL_DISABLE_FAST_MM", "1")
