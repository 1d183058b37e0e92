"""What a fuse run is asked, checked before any upload is read (the pipeline's first stages,
edgefl.server.fuse): each method's request planned (`Planned`: its validated config and where
its outputs go), the outputs it may replace, the datasets the run reads besides the uploads;
and what every method of one run shares once the uploads are ingested (`FuseRun`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import exporters
from edgefl.errors import ConfigError, EdgeflError
from edgefl.fusion import METHODS
from edgefl.fusion.base import Method
from edgefl.fusion.config import FusionConfig
from edgefl.outputs import check_replace, check_writable
from edgefl.progress import printable
from edgefl.server import classes as device_classes
from edgefl.server.ingest import Ingest
from exporters import shape_text


@dataclass(frozen=True)
class Planned:
    """A method ready to run: its validated config and where its outputs go."""

    method: Method
    config: FusionConfig
    out: Path
    report: Path
    # --for: what to distil per device class, and where each class's model goes.
    classes: device_classes.ClassRequest | None = None
    class_outs: tuple[tuple[Any, Path], ...] = ()  # (profile, <out stem>.<profile>.onnx)
    overwrite: bool = False  # replace outputs another command made (check_replacing)
    flags: tuple[str, ...] = ("--out", "--report")  # the flag naming each of `targets`

    @property
    def targets(self) -> list[Path]:
        """Every file this method's run writes (locked together, published together)."""
        return [self.out, self.report, *(path for _, path in self.class_outs)]


@dataclass(frozen=True)
class FuseRun:
    """What every planned method of one `fuse_methods` call shares: the one ingest, the device,
    the evaluation split, how many methods the ingest serves, and where lines and steps go
    (in a forked worker: back to the parent)."""

    found: Ingest
    device: torch.device
    eval_ref: str | None
    data_dir: str | None
    shared: int
    log: Callable[[str], None]
    progress: Callable[..., None]


def resolve_device(name: str, flag: str = "--device") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"{flag} cuda: no CUDA device is available", hint=f"use {flag} auto or cpu"
        )
    if name not in ("cpu", "cuda"):
        raise ConfigError(
            f"{flag} must be auto, cpu or cuda, got {name!r}",
            hint=f"{flag} auto (a GPU where torch sees one, else the CPU)",
        )
    return torch.device(name)


# --- stage: plan ----------------------------------------------------------------------------


def plan(
    name: str,
    options: dict[str, Any] | None,
    out: str | Path,
    uploads: str | Path,
    report: str | Path | None = None,
    out_flag: str = "--out",
    classes: device_classes.ClassRequest | None = None,
    overwrite: bool = False,
) -> Planned:
    """Everything that can be wrong with a method's request, checked before any upload is read.
    An existing output is replaced only when this method made it (a rerun of the same fuse,
    whatever its options) or with `overwrite`: never an upload, another method's global model,
    a deployed or personalized model, or a file edgefl did not write."""
    method = METHODS.get(name)
    cfg = method.make_config(dict(options or {}))
    out = Path(out)
    if out.suffix != ".onnx":
        name = (out.name.split(".")[0] if out.name not in ("", ".", "..") else "") or "global"
        raise ConfigError(
            f"{out_flag} must end in .onnx, got {out}",
            hint=f"e.g. {out_flag} {out.parent / (name + '.onnx')}",
        )
    report_path = Path(report) if report else out.with_suffix(".json")
    if report_path.resolve() == out.resolve():
        raise ConfigError(
            f"--report {report_path} is the global model's own path",
            hint="leave --report out (it defaults to <out>.json)",
        )
    class_outs = tuple(classes.targets(out)) if classes else ()
    if report_path.resolve() in {path.resolve() for _, path in class_outs}:
        raise ConfigError(
            f"--report {report_path} is a device class's model path",
            hint="leave --report out (it defaults to <out>.json)",
        )
    root = Path(uploads).resolve()
    named = [(out_flag, out), ("--report", report_path)]
    for flag_name, path in named + [("--for", path) for _, path in class_outs]:
        if root in path.resolve().parents:  # uploads are only ever read
            raise ConfigError(
                f"{flag_name} {path} is inside the upload directory {uploads}",
                hint="the server never writes among the uploads: write the global model and "
                "its report elsewhere, e.g. --out global.onnx",
            )
        check_writable(path, flag_name, _example(flag_name, path, name))
    flags = (out_flag, "--report") + ("--for",) * len(class_outs)
    return Planned(method, cfg, out, report_path, classes, class_outs, overwrite, flags)


def _example(flag_name: str, path: Path, method: str) -> str:
    """The fix's example for an output path that cannot be written: the same name in the
    current folder, a file inside the folder named (not that folder's name again), a fresh
    folder for --out-dir."""
    try:  # a name too long to stat is check_writable's to refuse
        is_dir, parent_exists = path.is_dir(), path.parent.exists()
    except OSError:
        is_dir = parent_exists = False
    if flag_name == "--out-dir":
        return "global" if parent_exists else path.parent.name
    if is_dir:
        return str(path / f"{method}{'.json' if flag_name == '--report' else '.onnx'}")
    return path.name


def check_replacing(p: Planned) -> None:
    """Each existing output is this method's own result (a rerun of the same fuse, whatever
    its options, replaces it) unless the run said --overwrite: checked under the run's lock,
    after every other check and before any upload is read."""
    for flag_name, path in zip(p.flags, p.targets, strict=True):
        check_replace(path, flag_name, p.overwrite, lambda made: _fused_by(made, p.method.name))


def _fused_by(made: dict[str, Any], method: str) -> bool:
    """A global model (or its report) this method made: a rerun of it may replace it."""
    kind = made.get("kind", "global")  # a report records no kind
    return made.get("method") == method and kind == "global" and not made.get("deployed")


# --- stage: claim --------------------------------------------------------------------------


def check_inputs(
    plans: list[Planned], eval_ref: str | None, data_dir: str | None = None, what: str = "--eval"
) -> None:
    """What the run reads besides the uploads: the --eval dataset and split, the public sets
    the methods' options name, and that a dataset read from files has them (on the search path
    or in --data-dir) and reads (a registered one is loaded now). A typo, a missing or a
    corrupt file found after the fusion cost the whole fusion."""
    if eval_ref:
        _check_dataset_ref(eval_ref, what, "test", splits=("train", "test"), data_dir=data_dir)
    for p in plans:
        public = p.config.public_args() if p.method.public_data else None
        if public:
            _check_dataset_ref(
                public["ref"],
                f"{p.method.name} --public",
                "train",
                splits=("train", "test", "public"),
                data_dir=data_dir,
            )


def check_eval_fits(uploads, eval_ref: str | None) -> None:
    """After the ingest, before any method runs: the --eval dataset's samples are what the
    uploads' models take (a mismatch was found only when the fused model was evaluated)."""
    models = [u.meta for u in uploads if u.kind in ("classifier", "decoder")]
    if eval_ref and models:  # data uploads (predictions, prototypes) say nothing of an input
        # The accepted share one task; the dataset they name is the most common (one upload
        # naming another cannot refuse --eval, nor choose it).
        named = Counter(m.get("dataset") for m in models if isinstance(m.get("dataset"), str))
        meta = models[0] | {"dataset": named.most_common(1)[0][0] if named else None}
        mismatch = _eval_mismatch(eval_ref, _eval_task(eval_ref), meta)
        if mismatch is not None:
            raise mismatch


def check_eval_declared(uploads: str | Path, eval_ref: str | None, **listing) -> None:
    """Before the ingest: --eval refused when not one model upload declares a task its samples
    fit (read from their unchecked metadata, so a hostile file can never refuse the run, only
    fail to; `check_eval_fits` decides on the accepted uploads). `listing`: recursive and
    max_bytes as the ingest lists the folder."""
    if not eval_ref or not Path(uploads).is_dir():  # a missing folder: the ingest says it
        return
    want, first = _eval_task(eval_ref), None  # a dataset from files is read once, not per upload
    for name in exporters.list_uploads(uploads, listing["recursive"]):
        meta = exporters.peek_metadata(Path(uploads, name), max_bytes=listing["max_bytes"])
        if not isinstance(meta, dict) or meta.get("kind") not in ("classifier", "decoder"):
            continue
        try:
            mismatch = _eval_mismatch(eval_ref, want, meta)
        except (KeyError, TypeError, ValueError, OverflowError):  # it declares no task
            continue
        if mismatch is None:
            return
        first = first or mismatch
    if first is not None:
        raise first


def _eval_task(eval_ref: str) -> tuple[tuple[int, ...], int]:
    """(input shape, classes) of the --eval dataset, without loading a registered one."""
    from edgefl.data import dataset_shape

    shape, classes, _ = dataset_shape(eval_ref)
    return tuple(shape), classes


def _eval_mismatch(eval_ref: str, want, meta: dict) -> ConfigError | None:
    """The refusal of --eval (of task `want`) for models that take what `meta` declares, None
    if it fits."""
    theirs = (tuple(int(d) for d in meta["input_shape"]), int(meta["num_classes"]))
    name = meta.get("dataset")
    if theirs == want:
        return _other_data(eval_ref, name)
    return ConfigError(
        f"--eval {printable(eval_ref)}: its samples are {shape_text(want[0])} of {want[1]} "
        f"classes; the uploads' models take {shape_text(theirs[0])} of {theirs[1]}",
        hint="evaluate on the dataset the federation trained on"
        + (f", e.g. --eval {printable(name)}:test" if isinstance(name, str) else ""),
    )


def _other_data(eval_ref: str, name) -> ConfigError | None:
    """Another registered dataset of the same shape (Fashion's models on MNIST digits): every
    shape check passes and the accuracy is chance, blamed on the method (seen 2026-12-06)."""
    from edgefl.data import parse_dataset_ref
    from edgefl.evaluate import other_registered

    ref = parse_dataset_ref(eval_ref)[0]
    if other_registered(name, ref) is None:
        return None
    return ConfigError(
        f"--eval {printable(eval_ref)}: the uploads' models were trained on {name}, not {ref} "
        "(the same shape, other data: its accuracy would say nothing of the fusion)",
        hint=f"evaluate on the federation's own data, e.g. --eval {name}:test (`edgefl eval "
        "MODEL --dataset ...` scores a global model on any data afterwards)",
    )


def _check_dataset_ref(
    ref: str, what: str, default_split: str, splits: tuple[str, ...], data_dir: str | None
) -> None:
    from edgefl.data import DATASETS, load_dataset, parse_dataset_ref
    from edgefl.data.datasets import looks_like_path
    from edgefl.data.locate import file_based, require

    name, split = parse_dataset_ref(ref)
    example = f"e.g. {what} digits:{default_split}, or a .npz file or image folder of your own"
    if not name:
        raise ConfigError(f"{what} {ref!r} names no dataset", hint=example)
    if split == "":  # "digits:" was read as the default split
        raise ConfigError(
            f"{what} {ref!r} names no split after ':'",
            hint=f"valid splits: {', '.join(splits)}, e.g. {name}:{default_split}",
        )
    split = split or default_split
    if looks_like_path(name) and not Path(name).exists():  # not "unknown dataset"
        raise ConfigError(f"{what} {ref!r}: no such file or folder", hint=example)
    if name not in DATASETS and not Path(name).exists():  # neither a name nor a user's file
        try:
            DATASETS.get(name)  # raises UnknownNameError, with the nearest name
        except EdgeflError as exc:
            raise ConfigError(f"{what} {ref!r}: {exc.message}", hint=exc.hint) from None
    if split not in splits:
        raise ConfigError(
            f"{what} {ref!r}: unknown split {split!r}",
            hint=f"valid splits: {', '.join(splits)}, e.g. {name}:{default_split}",
        )
    if name in DATASETS and file_based(name):
        require(name, data_dir)  # the files, found now: a DataError naming where it looked
        # and read now (kept in the process's cache; a public set is carved from train): a
        # truncated or corrupt file was said only after the whole fusion
        load_dataset(name, "train" if split == "public" else split, data_dir=data_dir)
