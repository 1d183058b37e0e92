"""A worker forked after the server ran torch in several threads must not hang (libgomp's pool
belongs to the thread that started it and fork does not copy its helpers): `server fuse
--method ensemble,fedavg --robust screen` waited forever on an idle 2-core machine."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import torch
from edgefl.server.workers import run_forked

torch.set_num_threads(2)
conv = torch.nn.Conv2d(8, 16, 3)
x = torch.randn(64, 8, 32, 32)
with torch.no_grad():
    conv(x)  # a 2-thread region here: this thread now holds a pool of helper threads

def work(task, log, progress):
    with torch.no_grad():
        return float(conv(x).abs().sum())

done = run_forked([0, 1], work, 1, lambda *a: None, lambda *a: None)  # one worker, 2 threads
print("done", sorted(done))
"""


@pytest.mark.slow
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="a worker gets one thread on one core")
def test_a_worker_with_threads_forked_after_parallel_work_finishes():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done [0, 1]" in proc.stdout
