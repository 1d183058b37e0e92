"""The changed copies the screen uses in an upload's place, never the upload itself (other
methods use it as sent): a classifier whose head's rows are permuted, negated or scaled, a
decoder whose labels are routed to the classes they draw; label counts follow."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import torch

from edgefl.artifacts import Upload


def _permutation(k: int, moves: dict[int, int]) -> np.ndarray:
    """perm with perm[a] = c for each output class c moved to a; the other outputs keep their
    place where it is free, the rest fill the free places in order."""
    perm = np.full(k, -1)
    for c, a in moves.items():
        perm[a] = c
    used = set(moves)
    for a in range(k):
        if perm[a] < 0 and a not in used:
            perm[a] = a
            used.add(a)
    rest = iter(c for c in range(k) if c not in used)
    for a in range(k):
        if perm[a] < 0:
            perm[a] = next(rest)
    return perm


def _adjusted(
    u: Upload,
    factor: float = 1.0,
    perm: np.ndarray | None = None,
    sign: int = 1,
    abstain: set[int] = frozenset(),
) -> Upload | None:
    """A copy of the upload whose classifier's logit k is sign x factor x its logit perm[k] (its
    head's rows permuted and scaled; label counts relabelled alike), or None when it has no
    rebuilt head to change (an onnxruntime-only upload)."""
    held = u.module  # once: a parked upload's is read from disk at each access
    head = getattr(held, "head", None)
    if not isinstance(head, torch.nn.Linear):
        return None
    module = copy.deepcopy(held)  # never the shared upload's: other methods use it as sent
    index = torch.as_tensor(perm if perm is not None else np.arange(head.out_features))
    with torch.no_grad():
        module.head.weight.copy_(sign * factor * head.weight[index])
        module.head.bias.copy_(sign * factor * head.bias[index])
        w, b = module.head.weight.mean(0), module.head.bias.mean()
        for a in abstain:  # its logit: the mean of all, so it never stands out
            module.head.weight[a], module.head.bias[a] = w, b
    out = u.with_module(module)
    counts = u.meta.get("label_counts")
    if perm is not None and counts and len(counts) == len(perm):
        meta = dict(u.meta, label_counts=[counts[int(c)] for c in perm])
        out = dataclasses.replace(out, artifact=dataclasses.replace(u.artifact, metadata=meta))
    return out


def _relabelled_decoder(u: Upload, perm: np.ndarray, seen: set[int]) -> Upload:
    """A copy of the decoder upload that, asked for class c, is given label perm[c]; its label
    counts follow, 0 for a class whose label is not known."""
    out = u.with_module(_Relabelled(u.module, perm))
    counts = u.meta.get("label_counts")
    if counts and len(counts) == len(perm):
        relabelled = [counts[int(perm[c])] if c in seen else 0 for c in range(len(perm))]
        meta = dict(u.meta, label_counts=relabelled)
        out = dataclasses.replace(out, artifact=dataclasses.replace(u.artifact, metadata=meta))
    return out


class _Relabelled(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module, perm: np.ndarray):
        super().__init__()
        self.inner = inner  # shared, never changed: the copy only routes its labels
        self.register_buffer("route", torch.eye(len(perm))[torch.as_tensor(perm)])

    def forward(self, z, onehot):
        return self.inner(z, onehot @ self.route.to(onehot.dtype))
