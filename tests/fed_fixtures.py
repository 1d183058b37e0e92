"""Tiny federations on `digits` (sklearn 8x8, 10 classes), built through the real client path
(`run_client` with a `ClientJob`, exactly what `edgefl client train` does) and cached for the
whole test session.

Plain functions, not fixtures: each test module declares its own session-scoped fixture, e.g.

    @pytest.fixture(scope="session")
    def federation(tmp_path_factory):
        return build_federation(tmp_path_factory.mktemp("fed"))

The first call builds into the root it is given; later calls (from any module) return that same
directory. Treat every returned directory as read-only: copy it (`copy_uploads`) to modify it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

from hypothesis import HealthCheck

from edgefl.client.run import ClientJob, run_client

DATASET = "digits"
NUM_CLIENTS = 4
# Dirichlet(1.0) over 4 clients leaves every classifier with most classes (checked: 9-10 of 10)
# while still being non-IID; iid would hide label-skew bugs in the fusion methods.
PARTITION = "dirichlet:1.0"
CLASSIFIERS = ("client-000", "client-001")  # profile smartphone, model cnn
DECODERS = ("client-002", "client-003")  # profile wristband, role generator (planner's CVAE)

_cache: dict[str, Path] = {}


def _job(out: Path, index: int, **kw) -> ClientJob:
    base = dict(
        dataset=DATASET,
        out_dir=str(out),
        partition=PARTITION,
        num_clients=NUM_CLIENTS,
        client_index=index,
        batch_size=64,
    )
    return ClientJob(**(base | kw))


def _classifier(out: Path, index: int, model: str = "cnn", **kw):
    # lr 0.05 (SGD-momentum, the smartphone optimizer): 15 epochs reach ~0.9 local val accuracy.
    return run_client(_job(out, index, profile="smartphone", model=model, epochs=15, lr=0.05, **kw))


def _generator(out: Path, index: int, **kw):
    # 30 epochs of the planner's small MLP CVAE cost well under a second and give decoders good
    # enough for a classifier trained on their samples alone to beat chance clearly.
    return run_client(_job(out, index, profile="wristband", role="generator", epochs=30, **kw))


def build_federation(root: Path) -> Path:
    """4 clients: client-000/001 cnn classifiers, client-002/003 CVAE decoders."""
    if "main" not in _cache:
        out = Path(root) / "uploads"
        for i in range(NUM_CLIENTS):
            (_classifier if i < 2 else _generator)(out, i)
        _cache["main"] = out
    return _cache["main"]


def build_mixed_federation(root: Path) -> Path:
    """One scnn and one cnn classifier (different architectures), plus both decoders."""
    if "mixed" not in _cache:
        main = build_federation(root)
        out = Path(root) / "mixed"
        copy_uploads(main, out, ["client-000.onnx", *(f"{d}.onnx" for d in DECODERS)])
        _classifier(out, 1, model="scnn:width=4", client_id="client-scnn")
        _cache["mixed"] = out
    return _cache["mixed"]


def build_decoder_only(root: Path) -> Path:
    """Just the two decoders of the main federation."""
    if "decoders" not in _cache:
        out = Path(root) / "decoders"
        copy_uploads(build_federation(root), out, [f"{d}.onnx" for d in DECODERS])
        _cache["decoders"] = out
    return _cache["decoders"]


def build_classifier_only(root: Path) -> Path:
    """Just the two classifiers of the main federation."""
    if "classifiers" not in _cache:
        out = Path(root) / "classifiers"
        copy_uploads(build_federation(root), out, [f"{c}.onnx" for c in CLASSIFIERS])
        _cache["classifiers"] = out
    return _cache["classifiers"]


def copy_uploads(src: Path, dst: Path, names: list[str] | None = None) -> Path:
    """Copy (some of) the uploads of `src` into `dst` (created), keeping their bytes exactly."""
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for name in names if names is not None else sorted(os.listdir(src)):
        shutil.copyfile(Path(src) / name, dst / name)
    return dst


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry of `root`: mode, size, mtime and content hash (a symlink: its target)."""
    state = {}
    for name in sorted(os.listdir(root)):
        info = os.lstat(Path(root) / name)
        if stat.S_ISLNK(info.st_mode):
            content = os.readlink(Path(root) / name)
        elif stat.S_ISREG(info.st_mode):
            content = hashlib.sha256((Path(root) / name).read_bytes()).hexdigest()
        else:
            content = "dir"
        state[name] = (info.st_mode, info.st_size, info.st_mtime_ns, content)
    return state


def fuse_digits(federation: Path, out_dir: Path, method: str, **options):
    """`run_fuse` of one method on a federation, on the CPU, evaluated on digits: its report."""
    from edgefl.server.fuse import FuseJob, run_fuse

    job = FuseJob(
        uploads=str(federation),
        method=method,
        options=options,
        out=str(out_dir / f"{method}.onnx"),
        device="cpu",
        eval="digits",
    )
    return run_fuse(job)


# Hypothesis settings of the hostile-bytes property tests: reproducible examples, no stored
# database, no per-example deadline (a slow CI core is not a failure), big inputs allowed.
HOSTILE_SETTINGS = dict(
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# Metadata of the data kinds (predictions, prototypes) as a client writes it, on digits' 8x8
# images: the tests that write such files by hand start from these.
def base_meta(kind: str, client: str, n_classes: int = 10) -> dict:
    return {
        "kind": kind,
        "input_shape": [1, 8, 8],
        "num_classes": n_classes,
        "class_names": [str(i) for i in range(n_classes)],
        "edgefl_version": "0.1.0",
        "spec": None,
        "client_id": client,
    }


def pred_meta(client: str, n: int, fingerprint: str = "a" * 64, n_classes: int = 10) -> dict:
    return base_meta("predictions", client, n_classes) | {
        "label_counts": [5] * n_classes,
        "public_fingerprint": fingerprint,
        "public_size": n,
    }


def proto_meta(client: str, classes=(0, 1, 2), rep: int = 6) -> dict:
    """Prototypes of the held `classes` (their indices), `rep` numbers each."""
    return base_meta("prototypes", client) | {
        "representation_size": rep,
        "classes": list(classes),
        "counts": [4] * len(classes),
    }
