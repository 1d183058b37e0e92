"""What an accepted upload is: a validated artifact (exporters did the checks) with, where its
spec allows, a differentiable torch module rebuilt from the spec and weights and checked against
onnxruntime. The server ingests uploads into these; fusion methods and clients read them."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

import exporters
from edgefl.errors import EdgeflError
from edgefl.models.spec import ModelSpec
from edgefl.models.zoo import ZOO, build_model, spec_label

PARITY_ATOL = 1e-4
MAX_SPEC_CHARS = 4096


@dataclass
class Upload:
    """One accepted artifact. `resident` is the rebuilt torch module (the classifier, or the
    CVAE's decoder) held in memory; `parked` is where its verified weights wait on the server's
    own disk instead (`park`), loaded each time a method reads `module`. Neither: it can only be
    run through onnxruntime (`forward_only` says why)."""

    artifact: exporters.Artifact
    resident: nn.Module | None = None
    forward_only: str | None = None
    parked: Path | None = None
    # A parked module loaded for the span of `loaded()`: read once, not at every `module`.
    _pinned: nn.Module | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def rebuilt(self) -> bool:
        """Whether it has a torch module (held or parked), without loading a parked one."""
        return self.resident is not None or self.parked is not None

    @property
    def module(self) -> nn.Module | None:
        """The torch module, or None (onnxruntime only). A parked upload's is read from the
        server's disk at each access unless inside `loaded()`: hold it in a name, not here."""
        if self.resident is not None or self.parked is None:
            return self.resident
        return self._pinned if self._pinned is not None else _unparked(self)

    @contextlib.contextmanager
    def loaded(self):
        """`module` read once for the block (a no-op for a held upload)."""
        if self.parked is None or self._pinned is not None:
            yield self
            return
        self._pinned = _unparked(self)
        try:
            yield self
        finally:
            self._pinned = None

    def with_module(self, module: nn.Module, **changes) -> Upload:
        """A copy holding `module` (a repaired or relabelled one) in memory."""
        return dataclasses.replace(self, resident=module, parked=None, **changes)

    @property
    def name(self) -> str:
        # its path in the upload folder ("phones/client-000.onnx" when read recursively)
        return self.artifact.name or Path(self.artifact.path).name

    @property
    def meta(self) -> dict:
        return self.artifact.metadata

    @property
    def kind(self) -> str:
        return self.meta["kind"]

    @property
    def client_id(self) -> str:
        return self.meta.get("client_id") or self.name

    @property
    def label_counts(self) -> np.ndarray:
        return np.asarray(self.meta.get("label_counts") or [], dtype=np.int64)

    @property
    def spec(self) -> ModelSpec | None:
        return ModelSpec.from_dict(self.meta["spec"]) if self.meta.get("spec") else None

    @property
    def latent_dim(self) -> int:
        return int(self.meta["latent_dim"])


class RebuildRejected(EdgeflError, ValueError):
    pass


def rebuild(
    art: exporters.Artifact, *, timings: dict[str, float] | None = None
) -> tuple[nn.Module | None, str | None]:
    """Torch module for an artifact, or (None, reason) if it can only be used through ORT.
    Raises RebuildRejected when the artifact claims a spec that contradicts its own weights.
    `timings`, if given, receives the seconds of the rebuild and the parity check.

    A rebuilt module holds the weights from then on: the artifact's in-memory copies are
    released (`release_weights`; a 264 MiB VGG-9 would otherwise be held three times)."""
    try:
        with exporters.timed(timings, "rebuild"):
            module, why = _rebuild(art)
        if module is None:
            if art.kind in ("classifier", "decoder"):
                # Methods run it through onnxruntime on batches of any size: it must run now.
                with exporters.timed(timings, "parity"):
                    probe(art)
            return None, why
        with exporters.timed(timings, "parity"):
            diff = parity(module, art)
    except RebuildRejected:
        raise
    except Exception as exc:  # torch or onnxruntime on a hostile spec or graph: a refusal
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise RebuildRejected(f"cannot rebuild and run it: {type(exc).__name__}: {first}") from None
    if diff > PARITY_ATOL:
        raise RebuildRejected(f"rebuilt module differs from the ONNX graph (max diff {diff:.2e})")
    release_weights(art)
    return module, None


def release_weights(art: exporters.Artifact) -> None:
    """Drop the artifact's copies of the weights (file bytes, onnxruntime session, initializer
    data) once a verified module holds them: metadata and graph structure stay. Running the
    artifact through onnxruntime afterwards fails loudly (missing initializers), never silently."""
    art._sessions.clear()
    art._data = b""
    # A fresh proto without the weights, not cleared fields: protobuf frees a message's memory
    # only with the whole message (measured: clearing the fields of a VGG-9 freed nothing).
    art.model = exporters.without_weights(art.model, keep_shapes=False)


def park(upload: Upload, folder: Path) -> Upload:
    """The upload with its verified module's weights written to `folder` (the server's own, not
    the upload folder: a client cannot change what was checked) and not held in memory; each
    read of `module` then maps them back from there. Unchanged when it holds no module."""
    if upload.resident is None:
        return upload
    fd, name = tempfile.mkstemp(suffix=".pt", dir=folder)  # unique among the ingest's threads
    with os.fdopen(fd, "wb") as f:
        torch.save(upload.resident.state_dict(), f)
    return dataclasses.replace(upload, resident=None, parked=Path(name))


def _unparked(upload: Upload) -> nn.Module:
    """A parked upload's module: its spec's shell given the weights mapped from the file (no
    copy; pages are read as the module is run)."""
    _, shell = _checked_spec(upload.artifact)
    tensors = torch.load(upload.parked, map_location="cpu", mmap=True, weights_only=True)
    return _load_weights(shell, tensors).eval()


def _rebuild(art: exporters.Artifact) -> tuple[nn.Module | None, str | None]:
    why = _not_rebuilt(art)
    if why:
        return None, why
    # Checked before the int8 shortcut: every method and report reads a kept upload's spec
    # (Upload.spec), whether or not its weights can be rebuilt from it.
    spec, shell = _checked_spec(art)
    if art.metadata.get("quantized"):
        return None, "int8-quantized weights: usable through onnxruntime only"
    weights = art.state_dict()
    _check_shapes(shell, weights, spec)
    tensors = {k: torch.from_numpy(v) for k, v in weights.items()}  # the same memory
    return _load_weights(shell, tensors).eval(), None


def _not_rebuilt(art: exporters.Artifact) -> str | None:
    """Why an artifact has no torch module whatever its weights, or None."""
    if art.kind == "global":
        if art.metadata.get("spec"):
            _checked_spec(art)  # a report names every accepted upload's model by its spec
        return "a global model, not a client upload"
    if art.kind in ("predictions", "prototypes"):
        return "a data artifact (predictions/prototypes): nothing to rebuild"
    if not art.metadata.get("spec"):
        return "no edgefl spec (exported by another tool): usable through onnxruntime only"
    return None


def _weight_names(shell: nn.Module) -> list[str]:
    # BatchNorm's num_batches_tracked is an unused buffer the exporter drops.
    return [k for k in shell.state_dict() if not k.endswith("num_batches_tracked")]


def _check_shapes(shell: nn.Module, weights: dict, spec: ModelSpec) -> None:
    """RebuildRejected unless the file's weights have the names and shapes of the weights the
    spec's module holds."""
    held = shell.state_dict()
    expected = {k: tuple(held[k].shape) for k in _weight_names(shell)}
    got = {k: tuple(v.shape) for k, v in weights.items() if k in expected}
    if got != expected:
        missing = sorted(set(expected) - set(got))[:3]
        raise RebuildRejected(
            f"weights do not match spec {spec_label(spec)} (e.g. missing {missing})"
        )


def _load_weights(shell: nn.Module, tensors: dict[str, torch.Tensor]) -> nn.Module:
    """The shell, holding the tensors of its weights' names (checked by `_check_shapes`)."""
    # The shell becomes the module: assign=True makes its parameters the arrays just read, so
    # no random initialisation is computed only to be overwritten (0.6 s for a VGG-9) and no
    # second copy of the weights is made.
    module = shell
    missing, _ = module.load_state_dict(
        {k: tensors[k] for k in _weight_names(shell)}, strict=False, assign=True
    )
    if any(not k.endswith("num_batches_tracked") for k in missing):  # pragma: no cover
        raise RebuildRejected(f"weights missing for {missing[:3]}")
    for name, buf in list(module.named_buffers()):
        if not buf.is_meta:
            continue
        if not name.endswith("num_batches_tracked"):  # pragma: no cover (no zoo model has one)
            raise RebuildRejected(f"buffer {name} is not in the file and cannot be rebuilt")
        # BatchNorm's step counter: not exported, unused in eval.
        owner, _, attr = name.rpartition(".")
        setattr(module.get_submodule(owner), attr, torch.zeros_like(buf, device="cpu"))
    return module


def _checked_spec(art: exporters.Artifact) -> tuple[ModelSpec, nn.Module]:
    """The artifact's spec, parsed, agreeing with its metadata, and built on the meta device
    (a hostile spec, e.g. huge widths, costs no memory there): the shell of the module it names.
    RebuildRejected otherwise, so that reading an accepted upload's spec never raises."""
    meta = art.metadata
    # A legitimate spec is ~100 characters. Without a cap, a small upload whose spec lists a
    # million layer widths (mlp hidden=[4, 4, ...]) ties the server up for minutes building
    # modules, even on the meta device.
    spec_chars = len(json.dumps(meta["spec"]))
    if spec_chars > MAX_SPEC_CHARS:
        raise RebuildRejected(
            f"spec in metadata is implausibly large ({spec_chars} characters, limit "
            f"{MAX_SPEC_CHARS})"
        )
    try:
        spec = ModelSpec.from_dict(meta["spec"])
        entry = ZOO.get(spec.name)
    except EdgeflError as exc:
        raise RebuildRejected(f"invalid spec in metadata: {exc.message}") from None
    except (TypeError, ValueError, OverflowError) as exc:  # e.g. a dimension that is no number
        raise RebuildRejected(f"invalid spec in metadata: {_first_line(exc)}") from None
    if (
        list(spec.input_shape) != list(meta["input_shape"])
        or spec.num_classes != meta["num_classes"]
    ):
        raise RebuildRejected("spec disagrees with the metadata's input shape / class count")
    wanted_role = "generator" if art.kind == "decoder" else "classifier"
    if entry.role != wanted_role:
        raise RebuildRejected(f"spec {spec.name!r} is a {entry.role}, artifact kind is {art.kind}")
    try:
        with torch.device("meta"):
            shell = _exported_part(build_model(spec), art.kind)
        spec_label(spec)  # reports name the model by it: it must not raise later
    except EdgeflError as exc:
        raise RebuildRejected(f"cannot build spec: {exc.message}") from None
    return spec, shell


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: " + (str(exc).strip().splitlines() or [""])[0][:200]


def _exported_part(model: nn.Module, kind: str) -> nn.Module:
    return model.decoder if kind == "decoder" else model


@torch.no_grad()
def parity(module: nn.Module, art: exporters.Artifact, batch: int = 4, seed: int = 0) -> float:
    """Max |torch - onnxruntime| over random valid inputs, relative to each sample's largest
    output above 1 (`exporters.max_relative_diff`). Outputs that are not finite, there or
    at the extremes of the valid range, are refused outright: NaN - NaN is NaN, which no
    tolerance comparison catches, and finite weights can still overflow (a model that yields
    NaN poisons every fusion it enters)."""
    inputs = random_inputs(art.metadata, batch, seed)
    ort_out = np.asarray(art.run(*[t.numpy() for t in inputs]))
    ours = module(*inputs).numpy()
    edges = edge_inputs(art.metadata)
    outputs = (
        ort_out,
        ours,
        np.asarray(art.run(*[t.numpy() for t in edges])),
        module(*edges).numpy(),
    )
    for got, n in ((outputs[0], batch), (outputs[2], len(edges[0]))):
        if got.shape != output_shape(art.metadata, n):  # broadcasting would hide a mismatch
            raise RebuildRejected(
                f"its output has shape {list(got.shape)} for {n} sample(s), its metadata "
                f"promises {list(output_shape(art.metadata, n))}"
            )
    if not all(np.isfinite(o).all() for o in outputs):
        raise RebuildRejected("its outputs are not finite on valid inputs (NaN or infinity)")
    return exporters.max_relative_diff(ours, ort_out)  # NaN was refused above


def output_shape(meta: dict, batch: int) -> tuple[int, ...]:
    """What the contract says a model upload returns for `batch` samples."""
    tail = meta["input_shape"] if meta["kind"] == "decoder" else [meta["num_classes"]]
    return (batch, *tail)


@torch.no_grad()
def probe(art: exporters.Artifact) -> None:
    """An upload used through onnxruntime alone (int8, or from another tool) runs as the methods
    will run it: one sample, a batch, and the extremes of the valid range, each giving finite
    outputs of the shape its metadata promises. RebuildRejected otherwise: a graph that fails
    here would fail inside a method, naming no upload."""
    for inputs in (
        random_inputs(art.metadata, 1, 1),
        random_inputs(art.metadata, 5, 0),
        edge_inputs(art.metadata),
    ):
        try:
            out = np.asarray(art.run(*[t.numpy() for t in inputs]))
        except Exception as exc:  # onnxruntime on a graph that only works for some batches
            raise RebuildRejected(f"onnxruntime cannot run it: {_first_line(exc)}") from None
        want = output_shape(art.metadata, len(inputs[0]))
        if out.shape != want:
            raise RebuildRejected(
                f"its output has shape {list(out.shape)} for {len(inputs[0])} sample(s), its "
                f"metadata promises {list(want)}"
            )
        if not np.isfinite(out).all():
            raise RebuildRejected("its outputs are not finite on valid inputs (NaN or infinity)")


def random_inputs(meta: dict, batch: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    if meta["kind"] == "decoder":
        labels = torch.randint(0, meta["num_classes"], (batch,), generator=gen)
        z = torch.randn(batch, meta["latent_dim"], generator=gen)
        return z, torch.nn.functional.one_hot(labels, meta["num_classes"]).float()
    return (torch.rand(batch, *meta["input_shape"], generator=gen),)


def edge_inputs(meta: dict) -> tuple[torch.Tensor, ...]:
    """The extremes of the valid range, where overflow shows first: all-0 and all-1 images; a
    latent at 0 and at +-3 standard deviations, for the first and the last class."""
    if meta["kind"] == "decoder":
        d, c = meta["latent_dim"], meta["num_classes"]
        z = torch.stack([torch.zeros(d), torch.full((d,), 3.0), torch.full((d,), -3.0)])
        labels = torch.tensor([0, c - 1, c - 1])
        return z, torch.nn.functional.one_hot(labels, c).float()
    shape = list(meta["input_shape"])
    return (torch.stack([torch.zeros(shape), torch.ones(shape)]),)
