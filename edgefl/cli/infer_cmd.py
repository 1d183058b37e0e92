"""`edgefl infer`: run one artifact (classifier, global model or decoder) on a .npy file.

Everything goes through onnxruntime, exactly as on a device or the server; torch is never loaded.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import typer
from rich.markup import escape

from edgefl.bounds import SEED
from edgefl.cli.common import MAKES_FOLDERS, applies_only_with, console, print_json, upload_text
from edgefl.data.datasets import as_int_labels
from edgefl.errors import ArtifactError, ConfigError, DataError
from edgefl.evaluate import require_classifier
from edgefl.outputs import check_writable

# Rows per onnxruntime call: bounds the activation memory of a large --input file.
_CHUNK = 256


def register(root: typer.Typer) -> None:
    root.command("infer")(infer_cmd)


def infer_cmd(
    ctx: typer.Context,
    artifact: str = typer.Argument(..., help="An edgefl artifact (.onnx)."),
    input_path: str = typer.Option(
        ...,
        "--input",
        help="Classifier: images .npy (N, C, H, W) or one (C, H, W), float 0..1 or uint8. "
        "Decoder: integer labels .npy (N,).",
    ),
    out: str | None = typer.Option(
        None,
        "--out",
        help="Decoder: .npy for the generated images (default <input>.generated.npy)."
        + MAKES_FOLDERS,
    ),
    seed: int = typer.Option(0, help="Decoder: seed of the latent draws."),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Decoder: replace an existing file at --out."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Predict classes with a classifier, or generate images from labels with a decoder."""
    SEED.check("--seed", seed, hint="e.g. --seed 0")
    if out:
        _check_out(Path(out), artifact, input_path, overwrite)  # before any file is read
    art = load_artifact(artifact)
    data = load_npy(input_path)
    if art.metadata["kind"] == "decoder":
        target = Path(out) if out else default_out(Path(input_path))
        if not out:  # the default beside the input (--out itself was checked above)
            _check_out(target, artifact, input_path, overwrite)
        images = generate(art, data, input_path, seed)
        save_npy(target, images)
        if json_out:
            print_json({"shape": list(images.shape), "path": str(target)})
        else:
            console.print(f"generated {images.shape[0]} images of shape {tuple(images.shape[1:])}")
            console.print(f"wrote {escape(str(target))}")
        return
    if out:
        raise ConfigError(
            "--out applies to decoder artifacts only",
            hint="drop --out; use --json to capture a classifier's predictions",
        )
    # A classifier draws nothing: --seed and --overwrite were passed over without a word.
    for name in ("seed", "overwrite"):
        hint = f"drop --{name}: a classifier's predictions draw nothing and write no file"
        applies_only_with(ctx, name, "a decoder artifact", False, hint=hint)
    probs = classify(art, data, input_path)
    names = art.metadata["class_names"]
    top = probs.argmax(1)
    predictions = [names[i] for i in top]
    if json_out:
        print_json({"predictions": predictions, "probabilities": probs.tolist()})
        return
    for i, (name, k) in enumerate(zip(predictions, top, strict=True)):
        console.print(f"{i}: {upload_text(name)} (p={probs[i, k]:.3f})")  # names are data


def _check_out(target: Path, artifact: str, input_path: str, overwrite: bool) -> None:
    """The generated images' file: a .npy that is neither the decoder nor its input, and not
    an existing file unless --overwrite (a .npy records nothing to tell a rerun's own from the
    user's; an upload named as --out became 896 bytes of images)."""
    check_writable(target, "--out", "generated.npy")
    if target.suffix != ".npy":
        raise ConfigError(
            f"--out {target}: the generated images are written as .npy; its name should end "
            "in .npy",
            hint=f"e.g. --out {target.with_suffix('.npy').name}",
        )
    for what, path in (("the decoder", artifact), ("the --input labels", input_path)):
        if Path(path).exists() and target.exists() and target.samefile(path):
            raise ConfigError(f"--out {target} is {what} itself", hint="e.g. --out generated.npy")
    if target.exists() and not overwrite:
        raise ConfigError(
            f"{target} already exists; this run would replace it",
            hint="write the images elsewhere (another --out), or pass --overwrite to replace it",
        )


def load_artifact(path: str):
    """A trusted artifact (the user's own file), with errors a person can act on."""
    from google.protobuf.message import DecodeError

    import exporters

    p = Path(path)
    if not p.is_file():
        raise ArtifactError(
            f"artifact {path!r} {'is a folder' if p.is_dir() else 'does not exist'}",
            hint="pass the .onnx file a client or server wrote",
        )
    try:
        art = exporters.read_artifact(p)
    except (OSError, ValueError, DecodeError) as exc:
        raise ArtifactError(
            f"{path} is not a readable edgefl artifact: {_first_line(exc)}",
            hint="pass an .onnx written by `edgefl client train` or the server",
        ) from None
    problems = exporters.validate_metadata(art.metadata)
    if problems:
        raise ArtifactError(
            f"{path} has invalid edgefl metadata: " + "; ".join(problems[:3]),
            hint="re-export the model with edgefl",
        )
    require_classifier(art, path, "run", decoder_ok=True)
    if art.metadata["kind"] == "decoder" and art.input_names != ["z", "label"]:
        raise ArtifactError(
            f"{path}: a decoder must have inputs ['z', 'label'], got {art.input_names}",
            hint="pass a decoder upload edgefl wrote (a generator device's `client train`)",
        )
    return art


def load_npy(path: str) -> np.ndarray:
    from edgefl.data.npz import check_numpy_file

    p = Path(path)
    if not p.is_file():
        raise DataError(
            f"input file {path!r} does not exist", hint="pass a .npy saved with np.save"
        )
    check_numpy_file(p, ".npy", "save the input with np.save(path, array)")
    try:
        arr = np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        pickled = "Object arrays" in str(exc)  # Python objects: never unpickled here
        raise DataError(
            f"{path} holds Python objects (an object array), not numbers"
            if pickled
            else f"cannot read {path} as .npy: {_first_line(exc)}",
            hint="save a numeric array: np.save(path, np.asarray(array, dtype=np.float32))"
            if pickled
            else "save the input with np.save(path, array)",
        ) from None
    if not isinstance(arr, np.ndarray):  # an .npz archive loads as NpzFile
        arr.close()
        raise DataError(
            f"{path} is an .npz archive; expected a single array (.npy)",
            hint="np.save(path, array) one array",
        )
    return arr


def classify(art, x: np.ndarray, where: str) -> np.ndarray:
    """(N, num_classes) softmax probabilities for images `x`."""
    meta = art.metadata
    shape = tuple(meta["input_shape"])
    if x.shape == shape:
        x = x[None]  # one sample
    if x.ndim != len(shape) + 1 or x.shape[1:] != shape or len(x) == 0:
        raise DataError(
            f"{where}: expected images of shape (N, {', '.join(map(str, shape))}) or one sample "
            f"{shape}, got {x.shape}",
            hint=f"this model takes images of {shape} (channels, height, width)",
        )
    x = _unit_float(x, where)
    logits = np.concatenate([_run(art, x[i : i + _CHUNK]) for i in range(0, len(x), _CHUNK)])
    c = meta["num_classes"]
    if logits.ndim != 2 or logits.shape[1] != c:
        raise ArtifactError(
            f"{art.path}: output of shape {logits.shape[1:]} per sample, expected ({c},) logits",
            hint=f"pass a classifier with one output of {c} logits, e.g. a global model",
        )
    z = logits.astype(np.float64) - logits.max(1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(1, keepdims=True)


def generate(art, labels: np.ndarray, where: str, seed: int) -> np.ndarray:
    """(N, *input_shape) images from a decoder, one per integer label."""
    meta = art.metadata
    c = meta["num_classes"]
    labels = as_int_labels(
        labels,
        where,
        num_classes=c,
        shape_hint=f"e.g. np.save(path, np.arange({c})) for one image per class",
        range_hint=f"this decoder has {c} classes: {', '.join(meta['class_names'][:10])}",
    )
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((len(labels), meta["latent_dim"])).astype(np.float32)
    onehot = np.eye(c, dtype=np.float32)[labels]
    parts = [_run(art, z[i : i + _CHUNK], onehot[i : i + _CHUNK]) for i in range(0, len(z), _CHUNK)]
    return np.concatenate(parts).reshape(len(labels), *meta["input_shape"])


def default_out(input_path: Path) -> Path:
    # labels.npy -> labels.generated.npy, next to the input.
    return input_path.with_suffix(".generated.npy")


def save_npy(path: Path, array: np.ndarray) -> None:
    from exporters import atomic_write_bytes

    buf = io.BytesIO()
    np.save(buf, array)
    try:
        atomic_write_bytes(path, buf.getvalue())
    except OSError as exc:
        raise DataError(
            f"cannot write {path}: {exc.strerror or exc}",
            hint="write to a folder you can write with room left, e.g. --out samples.npy",
        ) from None


def _unit_float(x: np.ndarray, where: str) -> np.ndarray:
    if x.dtype == np.uint8:
        return x.astype(np.float32) / 255.0
    if not np.issubdtype(x.dtype, np.floating):
        raise DataError(
            f"{where}: expected float pixels in [0, 1] or uint8 0..255, got dtype {x.dtype}",
            hint="convert with x.astype(np.float32) / 255 or x.astype(np.uint8)",
        )
    from edgefl.data._common import check_unit_range

    x = x.astype(np.float32)
    check_unit_range(x, where)
    return x


def _run(art, *arrays: np.ndarray) -> np.ndarray:
    try:
        return art.run(*arrays)
    # onnxruntime's pybind exceptions share no base class below Exception.
    except Exception as exc:
        raise ArtifactError(
            f"onnxruntime could not run {art.path}: {_first_line(exc)}",
            hint="check that the file is an unmodified edgefl export",
        ) from None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    line = lines[0] if lines else type(exc).__name__
    return line if len(line) <= 240 else line[:237] + "..."
