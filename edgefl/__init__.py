"""edgefl: one-shot federated learning for real edge devices."""

import os

# Idle OpenMP workers (torch's intra-op pool, MKL, oneDNN: all libgomp here) sleep instead of
# spinning. Spinning costs nothing on an idle machine, but when other processes share the cores
# the spinners steal the CPU the working thread needs: `server fuse` measured 3-14x slower under
# load with the default policy, ~1.3x with PASSIVE. libgomp reads this when it is loaded (at
# `import torch`), so it must be set here, before any edgefl module imports torch; spawned
# worker processes (`simulate --jobs`) inherit it. A value the user set explicitly wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
