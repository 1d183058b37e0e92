"""Fuzzing the upload boundary: N mutated uploads through `exporters.validate_upload` and
`edgefl.artifacts.rebuild`, the two steps `edgefl server fuse` runs on every untrusted file.

Each item is a real upload (one of each kind trained briefly on digits: a cnn classifier, a
CVAE decoder, a cnn's predictions on a 64-sample public set, a FedGH CNN's prototypes; or the
.onnx files of --uploads) mutated by a seeded mutation engine: byte flips, insertions,
deletions and truncations of the file; protobuf edits of tensors (dims, data type, data,
values), initializers (dropped, duplicated, renamed), nodes (op type, inputs, outputs,
attributes, domain, dropped, duplicated), graph inputs/outputs, value_info, opset and IR
version; and edits of the metadata JSON. Half of the protobuf edits re-stamp the weights hash,
so that they reach the checks behind it. Every item runs in a worker process capped in address
space (RLIMIT_AS) and in time, and ends as one of:

    accepted        validate_upload accepted it; rebuild returned a module or a reason; and
                    the downstream stage (below) ran without an exception
    rejected        validate_upload raised UploadRejected, or rebuild raised RebuildRejected
    downstream-failed  accepted, but what the server then does with it raised: ingest beside
                    one honest upload of each kind, the robust screen's verdict on them all,
                    each method's selection and tiny fusion (fedavg, ensemble, fedmho,
                    fedmho-md, fedcvae-ens, feddf and fedol on the tiny public set, fedgh),
                    again on its share of the screen's verdict where that differs, the
                    report's reading of each kept upload, and for a seeded 1 in
                    --pipeline-every the whole `server fuse` pipeline of one method (export
                    and report included)
    crashed         any other exception (which stage, type and message are recorded), or the
                    worker died from a signal (a segfault, an abort)
    hung            it ran past --timeout
    memory-blown    it ran out of its --mem-mb address space

An exception from rebuild that is not RebuildRejected is counted as crashed although ingest's
catch-all turns it into a rejection: the server survives it, but it is not a refusal that the
code meant. Every crash, hang and memory blow-up is grouped by signature and the first
--keep items of each are saved (FILE.onnx + FILE.txt) under OUT_examples/.

    python bench/bench_fuzz.py --jobs 1                      # 100,000 items, ~20-30 min
    python bench/bench_fuzz.py --n 300 --out /tmp/fuzz        # a smoke run
    python bench/bench_fuzz.py --resume                      # go on from OUT.json's checkpoint

Most items are cheap rejections; an accepted one (~6%) runs the downstream stage (0.1-0.3 s
with 1 thread). 600 items took 15 s with 1 worker on 2 shared CPUs, building nothing; the
sources are built once (~7 s) into OUT_sources and kept. bench/results/fuzz.md has the run.

Items are numbered; item i is the same mutation of the same source for a given --seed and
sources, so any saved or reported item can be regenerated (`--only I`). OUT.json is rewritten
at every progress line (every --every items) as a checkpoint that --resume continues from.
"""

from __future__ import annotations

from edgefl.threads import share_cores_politely

# What the edgefl CLI does first: thread settings before numpy and torch load, and MKL's
# fork-safe allocator before this script forks (docs/development.md).
share_cores_politely()

import argparse
import contextlib
import hashlib
import json
import math
import multiprocessing
import os
import platform
import random
import re
import resource
import shlex
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from datetime import UTC, datetime
from multiprocessing.connection import wait
from pathlib import Path

import numpy as np
import onnx

OUTCOMES = ("accepted", "rejected", "downstream-failed", "crashed", "hung", "memory-blown")

# --- the mutation engine ---------------------------------------------------------------------

# Values at the edges of what parsers, shape arithmetic and allocators handle.
INTS = [
    0,
    1,
    -1,
    2,
    3,
    7,
    8,
    64,
    255,
    256,
    1000,
    65536,
    2**31 - 1,
    2**31,
    2**32,
    2**62,
    -(2**63),
    2**63 - 1,
    10**6,
    10**9,
]
FLOATS = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    1e-45,
    1e38,
    3.4e38,
    -3.4e38,
    float("nan"),
    float("inf"),
    float("-inf"),
    1e300,
]
# Ops the validator allows (a renamed node then reaches the checker) and a few it must refuse.
OPS = [
    "Conv",
    "Gemm",
    "MatMul",
    "Relu",
    "Sigmoid",
    "Reshape",
    "Concat",
    "Expand",
    "Resize",
    "Range",
    "Gather",
    "MaxPool",
    "Softmax",
    "Identity",
    "Constant",
    "Add",
    "Transpose",
    "Loop",
    "If",
    "Einsum",
    "RandomNormal",
    "Bogus",
    "",
]


def _pick_int(rng: random.Random) -> int:
    return rng.choice(INTS) if rng.random() < 0.7 else rng.randint(-16, 4096)


def _pick_float(rng: random.Random) -> float:
    return rng.choice(FLOATS) if rng.random() < 0.7 else rng.uniform(-1e6, 1e6)


def _json_value(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if depth < 2 and roll < 0.15:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if depth < 2 and roll < 0.25:
        return {
            rng.choice(["name", "params", "kind", "x", ""]): _json_value(rng, depth + 1)
            for _ in range(rng.randint(0, 3))
        }
    return rng.choice(
        [
            None,
            True,
            False,
            _pick_int(rng),
            _pick_float(rng),
            "",
            "cnn",
            "mlp",
            "decoder",
            "classifier",
            "x" * rng.randint(1, 5000),
            [1, 8, 8],
            [_pick_int(rng)] * rng.randint(1, 4),
        ]
    )


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    buf = bytearray(data)
    kind = rng.choice(["flip", "insert", "delete", "truncate", "splice", "varint"])
    if not buf:  # an earlier step truncated it all: only an insertion applies
        kind = "insert"
    pos = rng.randrange(len(buf)) if buf else 0
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(len(buf))] ^= rng.randint(1, 255)
    elif kind == "insert":
        buf[pos:pos] = rng.randbytes(rng.randint(1, 64))
    elif kind == "delete":
        del buf[pos : pos + rng.randint(1, 256)]
    elif kind == "truncate":
        del buf[pos:]
    elif kind == "splice":  # a chunk of the file copied over another place
        src, size = rng.randrange(len(buf)), rng.randint(1, 512)
        buf[pos : pos + size] = buf[src : src + size]
    else:  # varints and lengths: 0xff continues a varint, 0x80 too, 0x00 ends it
        buf[pos] = rng.choice([0xFF, 0x80, 0x00, 0x7F])
    return bytes(buf), f"bytes:{kind}@{pos}"


def _some(rng: random.Random, items):
    return rng.choice(list(items)) if len(items) else None


def _edit_tensor(t: onnx.TensorProto, rng: random.Random) -> str:
    what = rng.choice(["dims", "dims", "dtype", "data", "value"])
    if what == "dims":
        dims = list(t.dims)
        op = rng.choice(["set", "append", "drop", "clear"])
        if op == "set" and dims:
            dims[rng.randrange(len(dims))] = _pick_int(rng)
        elif op == "append":
            dims.append(_pick_int(rng))
        elif op == "drop" and dims:
            dims.pop(rng.randrange(len(dims)))
        elif op == "clear":
            dims = []
        try:
            t.dims[:] = dims
        except ValueError:  # outside int64: a file cannot hold it either
            return "tensor:dims(unrepresentable)"
        return f"tensor:dims={dims}"
    if what == "dtype":
        t.data_type = rng.randint(0, 25)
        return f"tensor:dtype={t.data_type}"
    if what == "data":
        op = rng.choice(["truncate", "clear", "float_data", "int64_data"])
        if op == "truncate":
            t.raw_data = t.raw_data[: rng.randint(0, len(t.raw_data))]
        elif op == "clear":
            t.ClearField("raw_data")
        elif op == "float_data":
            t.float_data.extend([_pick_float(rng) for _ in range(rng.randint(0, 8))])
        else:
            t.int64_data.extend([_pick_int(rng) % 2**63 for _ in range(rng.randint(0, 8))])
        return f"tensor:data:{op}"
    if len(t.raw_data) >= 4:  # one float32 element of the raw data
        at = rng.randrange(len(t.raw_data) // 4) * 4
        value = _pick_float(rng)
        with np.errstate(over="ignore"):  # 1e300 becomes inf, as a float32 write would
            packed = np.array([value], dtype=np.float64).astype("<f4").tobytes()
        t.raw_data = t.raw_data[:at] + packed + t.raw_data[at + 4 :]
        return f"tensor:value[{at // 4}]={value}"
    return "tensor:value(no raw data)"


def _edit_attribute(node: onnx.NodeProto, rng: random.Random) -> str:
    if not node.attribute or rng.random() < 0.1:
        node.attribute.add(name=rng.choice(["pads", "axis", "bogus"]), type=2, i=_pick_int(rng))
        return f"attr:add@{node.op_type}"
    attr = rng.choice(list(node.attribute))
    if rng.random() < 0.1:
        node.attribute.remove(attr)
        return f"attr:drop {node.op_type}.{attr.name}"
    if attr.HasField("t"):
        return f"attr:{node.op_type}.{attr.name}.{_edit_tensor(attr.t, rng)}"
    if attr.ints:
        i = rng.randrange(len(attr.ints))
        attr.ints[i] = max(-(2**63), min(2**63 - 1, _pick_int(rng)))
        return f"attr:{node.op_type}.{attr.name}[{i}]={attr.ints[i]}"
    if attr.floats:
        attr.floats[rng.randrange(len(attr.floats))] = _pick_float(rng)
        return f"attr:{node.op_type}.{attr.name}.floats"
    if attr.type == onnx.AttributeProto.INT:
        attr.i = max(-(2**63), min(2**63 - 1, _pick_int(rng)))
        return f"attr:{node.op_type}.{attr.name}={attr.i}"
    if attr.type == onnx.AttributeProto.FLOAT:
        attr.f = _pick_float(rng)
        return f"attr:{node.op_type}.{attr.name}={attr.f}"
    if attr.type == onnx.AttributeProto.STRING:
        attr.s = rng.choice([b"", b"NOTSET", b"SAME_UPPER", b"VALID", rng.randbytes(8)])
        return f"attr:{node.op_type}.{attr.name}={attr.s!r}"
    attr.type = rng.randint(0, 14)
    return f"attr:{node.op_type}.{attr.name}.type={attr.type}"


def _value_names(g: onnx.GraphProto) -> list[str]:
    names = [v.name for v in g.input] + [t.name for t in g.initializer]
    return names + [o for n in g.node for o in n.output]


def mutate_proto(m: onnx.ModelProto, rng: random.Random) -> str:
    """One edit of the parsed model, in place; returns what it did."""
    g = m.graph
    kind = rng.choice(
        [
            "tensor",
            "tensor",
            "drop_init",
            "dup_init",
            "rename_init",
            "op_type",
            "node_input",
            "node_output",
            "attribute",
            "attribute",
            "drop_node",
            "dup_node",
            "swap_nodes",
            "domain",
            "graph_io",
            "value_info",
            "opset",
            "ir",
        ]
    )
    init, node = _some(rng, g.initializer), _some(rng, g.node)
    if kind == "tensor" and init is not None:
        return f"{init.name}:{_edit_tensor(init, rng)}"
    if kind == "drop_init" and init is not None:
        g.initializer.remove(init)
        return f"drop_init:{init.name}"
    if kind == "dup_init" and init is not None:
        g.initializer.add().CopyFrom(init)
        return f"dup_init:{init.name}"
    if kind == "rename_init" and init is not None:
        init.name = rng.choice(["", "x", *_value_names(g)])
        return f"rename_init:{init.name}"
    if kind == "op_type" and node is not None:
        node.op_type = rng.choice(OPS)
        return f"op_type:{node.name}->{node.op_type}"
    if kind == "node_input" and node is not None:
        names = ["", "nope", *_value_names(g)]
        if node.input and rng.random() < 0.7:
            i = rng.randrange(len(node.input))
            node.input[i] = rng.choice(names)
            return f"node_input:{node.op_type}[{i}]={node.input[i]}"
        if node.input and rng.random() < 0.5:
            node.input.pop()
            return f"node_input:{node.op_type} drop last"
        node.input.append(rng.choice(names))
        return f"node_input:{node.op_type} append"
    if kind == "node_output" and node is not None and node.output:
        node.output[0] = rng.choice(["", "dup", *_value_names(g)])
        return f"node_output:{node.op_type}={node.output[0]}"
    if kind == "attribute" and node is not None:
        return _edit_attribute(node, rng)
    if kind == "drop_node" and node is not None:
        g.node.remove(node)
        return f"drop_node:{node.op_type}"
    if kind == "dup_node" and node is not None:
        g.node.add().CopyFrom(node)
        return f"dup_node:{node.op_type}"
    if kind == "swap_nodes" and len(g.node) > 1:
        i, j = rng.sample(range(len(g.node)), 2)
        a, b = onnx.NodeProto(), onnx.NodeProto()
        a.CopyFrom(g.node[i])
        b.CopyFrom(g.node[j])
        g.node[i].CopyFrom(b)
        g.node[j].CopyFrom(a)
        return f"swap_nodes:{i},{j}"
    if kind == "domain" and node is not None:
        node.domain = rng.choice(["ai.onnx.ml", "com.microsoft", "x", "ai.onnx"])
        return f"domain:{node.op_type}={node.domain}"
    if kind == "graph_io":
        values = list(g.input) + list(g.output)
        if not values:  # a constant-output upload (predictions) whose outputs an edit dropped
            return "graph_io:none"
        v = rng.choice(values)
        op = rng.choice(["name", "dim", "elem_type", "no_shape", "drop"])
        if op == "name":
            v.name = rng.choice(["", "z", "label", "input", *_value_names(g)])
        elif op == "dim" and v.type.tensor_type.shape.dim:
            d = rng.choice(list(v.type.tensor_type.shape.dim))
            value = _pick_int(rng)
            d.dim_value = max(-(2**63), min(2**63 - 1, value))
        elif op == "elem_type":
            v.type.tensor_type.elem_type = rng.randint(0, 25)
        elif op == "no_shape":
            v.type.tensor_type.ClearField("shape")
        else:
            (g.input if v in g.input else g.output).remove(v)
        return f"graph_io:{op}:{v.name}"
    if kind == "value_info":
        if g.value_info and rng.random() < 0.5:
            v = rng.choice(list(g.value_info))
            if v.type.tensor_type.shape.dim:
                rng.choice(list(v.type.tensor_type.shape.dim)).dim_value = rng.randint(0, 10**6)
                return f"value_info:dim:{v.name}"
        g.ClearField("value_info")  # shape inference then has nothing to contradict
        return "value_info:clear"
    if kind == "opset":
        m.opset_import[0].version = rng.choice([0, 1, 7, 17, 18, 19, 20, 23, 24, 1000, -1])
        return f"opset={m.opset_import[0].version}"
    if kind == "ir":
        m.ir_version = rng.choice([0, 1, 3, 6, 7, 8, 9, 10, 11, 13, 14, 100, -1])
        return f"ir={m.ir_version}"
    return f"noop:{kind}"


def _meta_paths(value, path=()):
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _meta_paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:4]):
            yield from _meta_paths(v, (*path, i))


def mutate_metadata(m: onnx.ModelProto, rng: random.Random) -> str:
    entry = next((p for p in m.metadata_props if p.key == "edgefl"), None)
    if entry is None:
        return "meta:none"
    kind = rng.choice(["set", "set", "set", "delete", "raw", "duplicate", "rekey"])
    try:
        meta = json.loads(entry.value)
    except ValueError:  # an earlier raw edit broke it: only raw edits apply now
        meta = None
    if kind in ("set", "delete") and not isinstance(meta, dict):
        kind = "raw"
    if kind == "raw":  # the JSON text itself
        text, at = entry.value, rng.randrange(len(entry.value) + 1)
        entry.value = rng.choice(
            [
                text[:at],
                text[:at] + rng.choice('{}[]",:\\0') + text[at:],
                "",
                "null",
                "[]",
                "{" * 100_000,
                "NaN",
                text + text,
            ]
        )
        return "meta:raw"
    if kind == "duplicate":
        m.metadata_props.add(key="edgefl", value=entry.value)
        return "meta:duplicate"
    if kind == "rekey":
        entry.key = rng.choice(["", "Edgefl", "edgefl ", "other"])
        return f"meta:rekey={entry.key!r}"
    path = rng.choice(list(_meta_paths(meta))[1:] or [()])
    parent = meta
    for k in path[:-1]:
        parent = parent[k]
    if kind == "delete" and isinstance(parent, dict) and path:
        del parent[path[-1]]
    elif path:
        parent[path[-1]] = _json_value(rng)
    entry.value = json.dumps(meta)
    return f"meta:{kind}:{'.'.join(map(str, path))}"


def restamp(m: onnx.ModelProto) -> bool:
    """Recompute the metadata's weights hash, so that an edit of the weights reaches the checks
    behind the hash; False if the model has no readable hash to restamp."""
    from exporters import weights_hash

    entry = next((p for p in m.metadata_props if p.key == "edgefl"), None)
    try:
        meta = json.loads(entry.value) if entry is not None else None
        if not isinstance(meta, dict):
            return False
        meta["weights_sha256"] = weights_hash(m)
    except Exception:  # the hash of a broken tensor cannot be computed: leave it
        return False
    entry.value = json.dumps(meta)
    return True


def make_item(sources: dict[str, bytes], seed: int, index: int) -> tuple[bytes, str, str]:
    """Item `index`: (mutated bytes, its source's name, what was done), the same every time."""
    rng = random.Random(f"{seed}:{index}")
    name = rng.choice(sorted(sources))
    data = sources[name]
    family = rng.choices(["bytes", "proto", "metadata"], weights=[3, 5, 2])[0]
    if family == "bytes":
        steps = [mutate_bytes(data, rng)]
        for _ in range(rng.randint(0, 2)):
            steps.append(mutate_bytes(steps[-1][0], rng))
        return steps[-1][0], name, " | ".join(s for _, s in steps)
    m = onnx.ModelProto()
    m.ParseFromString(data)
    edit = mutate_proto if family == "proto" else mutate_metadata
    done = [edit(m, rng) for _ in range(rng.randint(1, 3))]
    if family == "proto" and rng.random() < 0.5 and restamp(m):
        done.append("restamped")
    return m.SerializeToString(), name, " | ".join(done)


def family_of(what: str) -> str:
    first = what.split(" | ")[0]
    return first.split(":")[0] if first.startswith(("bytes", "meta")) else "proto"


# --- one item, in a worker -------------------------------------------------------------------


def check(path: Path) -> tuple[str, str, str, str]:
    """(outcome, stage, detail, traceback) of one file through validation and rebuild."""
    import exporters
    from edgefl.artifacts import RebuildRejected, rebuild

    stage = "validate"
    try:
        art = exporters.validate_upload(path)
        stage = "rebuild"
        module, why = rebuild(art)
    except exporters.UploadRejected as exc:
        return "rejected", stage, exc.reason, ""
    except RebuildRejected as exc:
        return "rejected", stage, str(exc), ""
    except BaseException as exc:  # what the property forbids: record all of it
        blown = isinstance(exc, MemoryError) or _MEMORY.search(str(exc))
        detail = f"{type(exc).__name__}: {str(exc)[:500]}"
        return ("memory-blown" if blown else "crashed"), stage, detail, traceback.format_exc()
    return "accepted", stage, "module" if module is not None else f"no module: {why}", ""


# --- downstream: what the fusion methods read from a kept upload -----------------------------

# The tiny public set FedDF distils on and FedOL's predictions answer (carved from digits'
# train split, as the predictions source's client carved it).
PUBLIC = {"public": "digits:public", "public_size": 64}
# Each method's cheapest budget: what it reads from its uploads does not depend on the budget.
TINY = {
    "fedavg": {},
    "ensemble": {},
    "fedmho": {"synthetic": 20, "epochs": 1},
    "fedmho-md": {"synthetic": 20, "epochs": 1},
    "fedcvae-ens": {"synthetic": 20, "epochs": 1},
    "feddf": {"epochs": 1, **PUBLIC},
    "fedol": {"rounds": 1, "epochs": 1, **PUBLIC},
    "fedgh": {"epochs": 1},
}
ITEM = "item.onnx"


def companions(sources: dict[str, bytes]) -> dict[str, bytes]:
    """One honest upload of each kind among the sources, under client ids of their own (the
    item keeps its source's id, and ingest refuses a client's second upload of one kind)."""
    import exporters

    out = {}
    for data in sources.values():
        m = onnx.load_model_from_string(data)
        meta = exporters.get_metadata(m)
        name = f"honest-{meta['kind']}"
        if f"{name}.onnx" not in out:
            exporters.set_metadata(m, dict(meta, client_id=name))
            out[f"{name}.onnx"] = m.SerializeToString()
    return out


def downstream(folder: Path, data: bytes, pipeline: str | None) -> tuple[str, str, str, str]:
    """The item beside one honest upload of each kind, through what `server fuse` runs on it:
    ingest (validation, rebuild and the set's cross-checks), then every method of TINY: its
    selection (the uploads it uses, the others set aside by name), its fusion on a tiny budget
    (without the export, which reads only the server's own module), and the report's reading
    of each kept upload. `pipeline` names a method to run through the whole `server fuse`
    pipeline (export and report included): a seeded sample, the export being the slow part.
    Any exception is a downstream failure: an accepted upload must never sink a method."""
    import torch

    import exporters
    from edgefl.data.public import load_public
    from edgefl.errors import FusionError
    from edgefl.fusion import METHODS
    from edgefl.fusion.base import FusionContext
    from edgefl.fusion.screen import apply as apply_screen
    from edgefl.fusion.screen import judge as judge_screen
    from edgefl.models.zoo import spec_label
    from edgefl.server.fuse import FuseJob, run_fuse
    from edgefl.server.ingest import ingest
    from edgefl.server.selection import select

    stage = "ingest"
    (folder / ITEM).write_bytes(data)
    cpu = torch.device("cpu")
    try:
        found = ingest(folder, max_upload_bytes=exporters.DEFAULT_MAX_UPLOAD_BYTES, jobs=1)
        kept = any(u.name == ITEM for u in found.uploads)
        named = kept or any(n == ITEM for n, _ in found.rejected)
        if not named:
            return "downstream-failed", stage, "the item is neither kept nor rejected", ""
        stage = "report"
        json.dumps(
            [
                (
                    u.name,
                    u.client_id,
                    u.kind,
                    spec_label(u.spec) if u.spec else None,
                    u.label_counts.tolist(),
                    u.meta.get("training"),
                )
                for u in found.uploads
            ],
            default=str,
        )
        # The robust screen (--robust screen) judges every upload once for all the methods;
        # each method then fuses its share of the verdict too where that differs.
        stage = "robust screen"
        verdict = judge_screen(
            found.uploads,
            cpu,
            0,
            public=lambda: load_public(PUBLIC["public"], public_size=PUBLIC["public_size"], seed=0),
        )
        names = {u.name for u in found.uploads}
        # The options in effect for the set's input and dataset, as `server fuse` runs them
        # (some default by input kind: FedMHO's lr is unset until then).
        task = found.uploads[0].meta
        shape, dataset = task["input_shape"], task.get("dataset")
        if not set(verdict.out) | set(verdict.swap) <= names:
            return "downstream-failed", stage, "the screen names an upload not in the set", ""
        for name, options in TINY.items():
            stage = name
            method = METHODS.get(name)
            usable, skipped = select(method, found)
            if names != {u.name for u in usable} | {n for n, _ in skipped}:
                return "downstream-failed", stage, "an upload set aside without its name", ""
            kept, screened, _ = apply_screen(verdict, usable)
            same = [id(u) for u in kept] == [id(u) for u in usable]
            runs = [usable] if same else [usable, kept]
            for i, share in enumerate(runs):
                stage = f"{name}{' (screened)' if i else ''}"
                if not share:  # every upload screened out: the pipeline refuses by name
                    if not screened:
                        return "downstream-failed", stage, "uploads lost by the screen", ""
                    continue
                ctx = FusionContext(share, device=cpu, seed=0, federation=found.uploads)
                try:
                    method.fuse(ctx, method.effective_config(options, shape, dataset))
                except FusionError:
                    if not i:
                        raise
                    # The screen left too few of a kind for the method: `server fuse` reports
                    # that as the method's refusal, a result of the run (not a crash).
                    continue
                aside = {u.name for u, _ in ctx.aside + ctx.partly}
                if not aside <= {u.name for u in share}:
                    return "downstream-failed", stage, "set aside an upload it was not given", ""
        if pipeline is not None:
            stage = f"pipeline {pipeline}"
            # A fresh folder per item: the server refuses to write over another method's model.
            out = folder.parent / f"{folder.name}-out" / f"{pipeline}.onnx"
            report = run_fuse(
                FuseJob(
                    uploads=str(folder),
                    method=pipeline,
                    out=str(out),
                    options=TINY[pipeline],
                    device="cpu",
                    jobs=1,
                )
            )
            shown = [x["file"] for x in report["rejected"] + report["skipped"]]
            if ITEM not in shown and not kept:
                return "downstream-failed", stage, "the report does not name the item", ""
    except BaseException as exc:
        blown = isinstance(exc, MemoryError) or _MEMORY.search(str(exc))
        detail = f"{type(exc).__name__}: {str(exc)[:500]}"
        outcome = "memory-blown" if blown else "downstream-failed"
        return outcome, f"downstream {stage}", detail, traceback.format_exc()
    finally:
        (folder / ITEM).unlink(missing_ok=True)
        shutil.rmtree(folder.parent / f"{folder.name}-out", ignore_errors=True)
    where = "kept" if kept else "rejected in the set"
    return "accepted", f"downstream ({where}{', pipeline' if pipeline else ''})", "", ""


_MEMORY = re.compile(r"bad_alloc|Failed to allocate|Cannot allocate memory|out of memory", re.I)


def _worker(
    conn, sources: dict[str, bytes], seed: int, mem_mb: int, scratch: str, sample: int
) -> None:
    # The cap is on top of what the worker has mapped already (torch and onnxruntime's
    # libraries reserve GBs of address space that they never touch).
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and ends us
    base = _vm_size()
    limit = base + mem_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import torch

    torch.set_num_threads(1)
    # The item's folder: the honest companions stay, the item comes and goes.
    folder = _companions_folder(sources, scratch)
    while (index := conn.recv()) is not None:
        try:
            data, _, what = make_item(sources, seed, index)
        except Exception:  # a bug of this script, not of the code under test: stop the run
            conn.send((index, None, "engine-error", "engine", "", traceback.format_exc(), 0, 0))
            continue
        path = Path(scratch, f"{os.getpid()}-{index}.onnx")
        start = time.perf_counter()
        path.write_bytes(data)
        try:
            outcome, stage, detail, tb = check(path)
        finally:
            path.unlink(missing_ok=True)
        if outcome == "accepted" and sample >= 0:
            outcome, stage, more, tb = downstream(folder, data, _pipeline(seed, index, sample))
            detail = f"{detail}; {more}" if more else detail
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        conn.send((index, what, outcome, stage, detail, tb, time.perf_counter() - start, rss))


def _companions_folder(sources: dict[str, bytes], scratch: str) -> Path:
    folder = Path(scratch, f"downstream-{os.getpid()}")
    folder.mkdir(exist_ok=True)
    for name, data in companions(sources).items():
        Path(folder, name).write_bytes(data)
    return folder


def _pipeline(seed: int, index: int, sample: int) -> str | None:
    """The method whose whole pipeline item `index` runs, for 1 item in `sample` (seeded)."""
    rng = random.Random(f"pipeline:{seed}:{index}")
    if sample <= 0 or rng.randrange(sample) != 0:
        return None
    return rng.choice(sorted(TINY))


def _vm_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


# --- the pool --------------------------------------------------------------------------------


class Pool:
    """Workers that each run one item at a time; a worker that hangs, dies or runs out of
    memory is replaced, and its item is recorded as such."""

    def __init__(
        self,
        jobs: int,
        sources,
        seed: int,
        mem_mb: int,
        timeout: float,
        scratch,
        sample: int,
        recycle: int = 2000,
    ):
        self.ctx = multiprocessing.get_context("fork")  # the parent has imported everything
        self.args = (sources, seed, mem_mb, scratch, sample)
        self.timeout, self.recycle = timeout, recycle
        self.workers = [self._spawn() for _ in range(jobs)]

    def _spawn(self) -> dict:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child, *self.args), daemon=True)
        proc.start()
        child.close()
        return {"proc": proc, "conn": parent, "index": None, "since": 0.0, "done": 0}

    def _replace(self, w: dict) -> None:
        w["proc"].kill()
        w["proc"].join()
        w["conn"].close()
        w.update(self._spawn())

    def run(self, indices):
        """Yield (index, what, outcome, stage, detail, traceback, seconds, worker max RSS MiB);
        `what` is None where the worker could not say (it died or hung)."""
        todo = iter(indices)
        busy = 0
        for w in self.workers:
            busy += self._give(w, todo)
        while busy:
            ready = wait([w["conn"] for w in self.workers if w["index"] is not None], timeout=0.5)
            now = time.monotonic()
            for w in self.workers:
                if w["index"] is None:
                    continue
                result = None
                if w["conn"] in ready:
                    try:
                        result = w["conn"].recv()
                    except (EOFError, OSError):
                        w["proc"].join()
                        code = w["proc"].exitcode
                        why = f"signal {signal.Signals(-code).name}" if code and code < 0 else code
                        result = (
                            w["index"],
                            None,
                            "crashed",
                            "worker",
                            f"worker died: {why}",
                            "",
                            now - w["since"],
                            0,
                        )
                        self._replace(w)
                elif now - w["since"] > self.timeout:
                    result = (
                        w["index"],
                        None,
                        "hung",
                        "?",
                        f"over {self.timeout:g} s",
                        "",
                        now - w["since"],
                        0,
                    )
                    self._replace(w)
                if result is None:
                    continue
                w["index"] = None
                busy -= 1
                # A worker that ran out of memory may hold a broken heap, and one that ran many
                # items may have grown (allocator fragmentation): start a fresh one.
                w["done"] += 1
                if result[2] == "memory-blown" or w["done"] >= self.recycle:
                    self._replace(w)
                yield result
                busy += self._give(w, todo)

    def _give(self, w: dict, todo) -> int:
        index = next(todo, None)
        if index is None:
            return 0
        w["index"], w["since"] = index, time.monotonic()
        w["conn"].send(index)
        return 1

    def close(self) -> None:
        for w in self.workers:
            if w["proc"].is_alive():
                with contextlib.suppress(OSError):
                    w["conn"].send(None)
            w["proc"].join(timeout=5)
            if w["proc"].is_alive():
                w["proc"].kill()


# --- sources, results ------------------------------------------------------------------------


SOURCE_KINDS = ("classifier", "decoder", "predictions", "prototypes")


def build_sources(out: Path) -> list[Path]:
    """One upload of each kind, trained for a few epochs on a digits shard: a cnn classifier,
    a CVAE decoder, a cnn's predictions on the tiny public set (FedOL) and a FedGH CNN's
    prototypes. Only the kinds the folder lacks are built: the others keep their exact bytes
    (an item is a mutation of its source's bytes)."""
    import exporters
    from edgefl.client.run import ClientJob, run_client

    have = {exporters.get_metadata(onnx.load(str(p))).get("kind") for p in out.glob("*.onnx")}
    base = dict(
        dataset="digits",
        out_dir=str(out),
        partition="dirichlet:1.0",
        num_clients=4,
        batch_size=64,
        epochs=2,
    )
    jobs = {
        "classifier": dict(profile="smartphone", model="cnn", client_index=0),
        "decoder": dict(profile="wristband", role="generator", client_index=2),
        "predictions": dict(
            profile="smartphone",
            model="cnn",
            client_index=1,
            kind="predictions",
            public=PUBLIC["public"],
            public_size=PUBLIC["public_size"],
        ),
        "prototypes": dict(
            profile="smartphone",
            model="fedgh-cnn1:fc1=64,representation=32",
            client_index=3,
            kind="prototypes",
        ),
    }
    for kind in SOURCE_KINDS:
        if kind not in have:
            run_client(ClientJob(**(base | jobs[kind])))
    return sorted(out.glob("*.onnx"))


def signature(outcome: str, stage: str, detail: str) -> str:
    # Numbers vary between items of one bug (sizes, addresses, node names with counters).
    return (
        f"{outcome} in {stage}: "
        + re.sub(r"\d+", "N", detail.splitlines()[0] if detail else "")[:160]
    )


def _commit() -> str | None:
    """The checkout's commit (and "+ uncommitted edits" where it has some), None outside git."""
    import subprocess

    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=here,
            text=True,
            capture_output=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            text=True,
            capture_output=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + (" + uncommitted edits" if dirty else "")


def machine() -> dict:
    import numpy
    import onnxruntime
    import torch

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "numpy": numpy.__version__,
        "load_avg_at_start": list(os.getloadavg()),
    }


def write_results(out: Path, state: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(out.with_suffix(".json"))  # a checkpoint is never half-written
    out.with_suffix(".md").write_text(markdown(state))


def markdown(s: dict) -> str:
    done, counts = s["done"], s["counts"]
    rate = done / s["seconds"] if s["seconds"] else 0.0
    lines = [
        "# Upload fuzzing: validate_upload + rebuild"
        + (
            " + downstream (ingest beside honest uploads, the fusion methods)"
            if s.get("downstream")
            else ""
        ),
        "",
        f"`{s['command']}`",
        "",
        *(
            [f"Code: commit {s['commit']}" + (f", {s['code']}" if s.get("code") else "") + ".", ""]
            if s.get("commit")
            else []
        ),
        f"{s['date_utc']} UTC, {s['machine']['platform']}, {s['machine']['cpus']} CPUs, "
        f"Python {s['machine']['python']}, torch {s['machine']['torch']}, onnx "
        f"{s['machine']['onnx']}, onnxruntime {s['machine']['onnxruntime']}; load average at "
        f"start {s['machine']['load_avg_at_start'][0]:.2f}.",
        "",
        f"{done:,} of {s['n']:,} items{' (partial: resume with --resume)' if done < s['n'] else ''}"
        f" in {s['seconds']:.1f} s ({rate:.1f} items/s with {s['jobs']} workers; per-item "
        f"timeout {s['timeout']:g} s, address space cap {s['mem_mb']} MiB over each worker's "
        f"start). Sources: {', '.join(s['sources'])}; seed {s['seed']}.",
        "",
        *(
            [
                "Downstream: every accepted item is ingested (`edgefl.server.ingest`) beside one "
                "honest upload of each kind"
                + (
                    ", the robust screen (`edgefl.fusion.screen.judge`) judges them all"
                    if s.get("screen")
                    else ""
                )
                + ", then every method of "
                + ", ".join(f"{m} {s['methods'][m] or '(no options)'}" for m in s["methods"])
                + " selects its uploads (those set aside must be named) and fuses them on that "
                "budget"
                + (
                    ", and again on its share of the screen's verdict where that differs "
                    "(uploads screened out, repaired or tempered)"
                    if s.get("screen")
                    else ""
                )
                + " (the export, which reads only the server's own module, skipped), and "
                "the report's reading of each kept upload runs; 1 item in "
                f"{s['pipeline_every']} (seeded) also runs one method through the whole `server "
                "fuse` pipeline (`run_fuse`: ingest, fuse, export, report). Any exception there "
                "is `downstream-failed`.",
                "",
            ]
            if s.get("downstream")
            else []
        ),
        "| outcome | items | share |",
        "|---|--:|--:|",
    ]
    lines += [
        f"| {o} | {counts.get(o, 0):,} | {100 * counts.get(o, 0) / max(done, 1):.1f}% |"
        for o in OUTCOMES
    ]
    families = sorted(s["by_family"])
    lines += [
        "",
        "| mutation family | " + " | ".join(OUTCOMES) + " |",
        "|---|" + "--:|" * len(OUTCOMES),
    ]
    lines += [
        f"| {f} | " + " | ".join(f"{s['by_family'][f].get(o, 0):,}" for o in OUTCOMES) + " |"
        for f in families
    ]
    bad = {k: v for k, v in s["signatures"].items() if not k.startswith(("accepted", "rejected"))}
    lines += ["", "## Crashes, hangs and memory blow-ups by signature", ""]
    if not bad:
        lines.append("None.")
    else:
        lines += ["| signature | items | saved examples |", "|---|--:|---|"]
        for sig, v in sorted(bad.items(), key=lambda kv: -kv[1]["count"]):
            shown = sig.replace("|", "\\|")
            lines.append(f"| {shown} | {v['count']:,} | {', '.join(v['examples'][:3])} |")
    if s.get("notes"):  # added by hand after a run: what else was measured about it
        lines += ["", "## Notes", ""] + [f"- {n}" for n in s["notes"]]
    slow = s["slowest"]
    lines += [
        "",
        f"Slowest item: {slow['seconds']:.2f} s (item {slow['index']}, "
        f"{slow['outcome']}); largest worker peak RSS: {s['max_rss_mib']} MiB.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    # One thread per worker (each runs one item at a time); set before torch is imported.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="items (default 100,000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per item")
    ap.add_argument("--mem-mb", type=int, default=1024, help="address space per worker, MiB")
    ap.add_argument(
        "--uploads",
        help="folder of .onnx uploads to mutate (default: OUT_sources, built there once: a "
        "cnn classifier, a CVAE decoder, predictions and prototypes)",
    )
    ap.add_argument("--out", default="bench/results/fuzz", help="writes OUT.json, OUT.md")
    ap.add_argument("--every", type=int, default=1000, help="progress line + checkpoint")
    ap.add_argument("--keep", type=int, default=5, help="examples saved per signature")
    ap.add_argument("--resume", action="store_true", help="continue OUT.json's checkpoint")
    ap.add_argument("--only", type=int, help="run item I alone, in this process, and print it")
    ap.add_argument(
        "--no-downstream",
        action="store_true",
        help="stop at validate + rebuild (no ingest beside honest uploads, no methods)",
    )
    ap.add_argument(
        "--pipeline-every",
        type=int,
        default=100,
        help="1 accepted item in N (seeded) also runs one method's whole `server "
        "fuse` pipeline, export and report included (0: none)",
    )
    args = ap.parse_args(argv)
    out = Path(args.out)
    examples = Path(f"{out}_examples")

    with tempfile.TemporaryDirectory(prefix="fuzz-") as scratch:
        # Built once and kept: an item is a mutation of its source's exact bytes, and training
        # stamps its own duration into the metadata, so a rebuild would change every item.
        folder = Path(args.uploads or f"{out}_sources")
        paths = sorted(folder.glob("*.onnx"))
        if len(paths) < len(SOURCE_KINDS) and not args.uploads:
            print(
                f"building the sources missing in {folder} (one upload of each kind: "
                f"{', '.join(SOURCE_KINDS)})",
                flush=True,
            )
            paths = build_sources(folder)
        if not paths:
            sys.exit(f"no .onnx files in {folder}")
        sources = {p.name: p.read_bytes() for p in paths}
        ids = {n: hashlib.sha256(d).hexdigest()[:12] for n, d in sources.items()}
        if args.only is not None:
            data, name, what = make_item(sources, args.seed, args.only)
            path = Path(scratch, "item.onnx")
            path.write_bytes(data)
            print(f"item {args.only}: {name}: {what}")
            result = check(path)
            print(result)
            if result[0] == "accepted" and not args.no_downstream:
                folder = _companions_folder(sources, scratch)
                print(downstream(folder, data, _pipeline(args.seed, args.only, 1)))
            return

        state = {
            "command": shlex.join([Path(sys.executable).name, *sys.argv]),
            "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
            "machine": machine(),
            "n": args.n,
            "seed": args.seed,
            "jobs": args.jobs,
            "timeout": args.timeout,
            "mem_mb": args.mem_mb,
            "sources": [f"{n} ({ids[n]})" for n in sorted(ids)],
            "downstream": not args.no_downstream,
            "pipeline_every": args.pipeline_every,
            "methods": {m: TINY[m] for m in sorted(TINY)},
            "screen": True,
            "commit": _commit(),
            "done": 0,
            "seconds": 0.0,
            "counts": {},
            "by_family": {},
            "signatures": {},
            "slowest": {"seconds": 0.0, "index": None, "outcome": None},
            "max_rss_mib": 0,
        }
        if args.resume:
            old = json.loads(out.with_suffix(".json").read_text())
            same = (
                "seed",
                "sources",
                "timeout",
                "mem_mb",
                "downstream",
                "pipeline_every",
                "methods",
            )
            if any(old.get(k) != state[k] for k in same):
                sys.exit(f"--resume: {out}.json was made with other {', '.join(same)}")
            state |= {
                k: old[k]
                for k in (
                    "done",
                    "seconds",
                    "counts",
                    "by_family",
                    "signatures",
                    "slowest",
                    "max_rss_mib",
                )
            }
            print(f"resuming at item {state['done']:,}", flush=True)
        run(state, sources, args, out, examples, scratch)


def run(state: dict, sources, args, out: Path, examples: Path, scratch: str) -> None:
    import edgefl.artifacts  # noqa: F401  (imported once here, not in every forked worker)
    import exporters  # noqa: F401

    # Warm up here, once: the workers fork with torch and onnxruntime initialised (the first
    # rebuild in a cold process takes ~2 s).
    warm = Path(scratch, "warm.onnx")
    warm.write_bytes(next(iter(sources.values())))
    check(warm)
    if not args.no_downstream:  # and the stage itself: an honest item must pass it
        folder = _companions_folder(sources, scratch)
        result = downstream(folder, warm.read_bytes(), None)
        if result[0] != "accepted":
            sys.exit(f"the downstream stage fails on an unmutated source: {result}")
    counts, by_family = Counter(state["counts"]), state["by_family"]
    pool = Pool(
        args.jobs,
        sources,
        args.seed,
        args.mem_mb,
        args.timeout,
        scratch,
        -1 if args.no_downstream else args.pipeline_every,
    )
    start, first = time.monotonic() - state["seconds"], state["done"]
    held: dict[int, tuple] = {}  # results ahead of the first unfinished item

    def fold(r: tuple) -> None:
        index, what, outcome, stage, detail, tb, seconds, rss = r
        if what is None:
            what = make_item(sources, args.seed, index)[2]
        counts[outcome] += 1
        fam = by_family.setdefault(family_of(what), {})
        fam[outcome] = fam.get(outcome, 0) + 1
        sig = signature(outcome, stage, detail)
        entry = state["signatures"].setdefault(sig, {"count": 0, "examples": []})
        entry["count"] += 1
        if outcome not in ("accepted", "rejected") and len(entry["examples"]) < args.keep:
            examples.mkdir(parents=True, exist_ok=True)
            name = f"{outcome}-{index:07d}"
            data, source, _ = make_item(sources, args.seed, index)
            (examples / f"{name}.onnx").write_bytes(data)
            (examples / f"{name}.txt").write_text(
                f"item {index} (seed {args.seed}) from {source}: {what}\n{sig}\n{detail}\n\n{tb}"
            )
            entry["examples"].append(str(examples / f"{name}.onnx"))
        if seconds > state["slowest"]["seconds"]:
            state["slowest"] = {"seconds": seconds, "index": index, "outcome": outcome}
        state["max_rss_mib"] = max(state["max_rss_mib"], rss)

    try:
        for r in pool.run(range(first, args.n)):
            if r[2] == "engine-error":
                sys.exit(f"the mutation engine failed on item {r[0]}:\n{r[5]}")
            held[r[0]] = r
            while state["done"] in held:  # the checkpoint counts a prefix of the items only
                fold(held.pop(state["done"]))
                state["done"] += 1
                if state["done"] % args.every == 0 or state["done"] == args.n:
                    state["seconds"] = time.monotonic() - start
                    state["counts"] = dict(counts)
                    write_results(out, state)
                    _progress(state)
    except KeyboardInterrupt:
        print(f"interrupted: {out}.json holds the first {state['done']:,} items (--resume)")
    finally:
        pool.close()
    state["seconds"] = time.monotonic() - start
    state["counts"] = dict(counts)
    write_results(out, state)
    print(f"wrote {out}.json and {out}.md")


def _progress(s: dict) -> None:
    done, n = s["done"], s["n"]
    rate = done / max(s["seconds"], 1e-9)  # seconds add up over resumed runs, like done
    eta = (n - done) / rate if rate else math.inf
    c = s["counts"]
    print(
        f"fuzz {done:,}/{n:,} ({rate:.1f}/s, about {eta / 60:.0f} min left): "
        + ", ".join(f"{o} {c.get(o, 0):,}" for o in OUTCOMES),
        flush=True,
    )


if __name__ == "__main__":
    main()
