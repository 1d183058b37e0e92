"""User data as a folder of images with one sub-folder per class, read with Pillow.

The folder is the user's own, passed by path: `DIR/<class>/*.png` (train only) or
`DIR/train/<class>/...` and `DIR/test/<class>/...`. Class names are the sub-folder names, sorted;
all images share one size; one colour image makes the whole dataset RGB.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgefl.data._common import to_unit_float
from edgefl.errors import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


def _class_folders(root: Path) -> list[Path]:
    return sorted(
        (d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")),
        key=lambda d: d.name,
    )


def load_image_folder(root: Path, split: str) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    root = _split_root(root, split)
    classes = _class_folders(root)
    if not classes:
        raise DataError(
            f"{root} has no class sub-folders",
            hint="put the images of each class in their own folder: DIR/<class>/*.png",
        )
    files = _labelled_files(classes)
    x = _stack(_read_images([p for p, _ in files]))
    y = np.array([label for _, label in files], dtype=np.int64)
    return to_unit_float(x), y, tuple(d.name for d in classes)


def _split_root(root: Path, split: str) -> Path:
    """The folder that holds `split`'s class folders (`root` itself without a split layout)."""
    top = {d.name for d in _class_folders(root)}
    if top and top <= {"train", "test"} and "train" in top:
        root = root / split  # split layout: root/train/<class>/..., root/test/<class>/...
        if not root.is_dir():
            raise DataError(
                f"{root.parent} has no '{split}' folder",
                hint=f"add {root} with one sub-folder per class",
            )
    elif split == "test":
        raise DataError(
            f"{root} has no test split: expected sub-folders train/ and test/ with class folders",
            hint="arrange the images as DIR/train/<class>/*.png and DIR/test/<class>/*.png",
        )
    return root


def _labelled_files(classes: list[Path]) -> list[tuple[Path, int]]:
    """Every image of every class folder with its label (the folder's index), in order."""
    files: list[tuple[Path, int]] = []
    for label, d in enumerate(classes):
        imgs = sorted(p for p in d.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not imgs:
            raise DataError(
                f"class folder {d} holds no images ({', '.join(IMAGE_SUFFIXES)})",
                hint="remove the empty folder or add its images",
            )
        files += [(p, label) for p in imgs]
    return files


def _read_images(paths: list[Path]) -> list[np.ndarray]:
    """Each image as uint8 (H, W) if grey, else (H, W, 3); all must share one size."""
    from PIL import Image, UnidentifiedImageError

    gray_modes = {"1", "L", "LA", "I", "I;16", "F"}
    arrays, size = [], None
    for p in paths:
        try:
            with Image.open(p) as im:
                if size is None:
                    size = im.size
                elif im.size != size:
                    raise DataError(
                        f"image {p} is {im.size[0]}x{im.size[1]} but {paths[0]} is "
                        f"{size[0]}x{size[1]}; all images must share one size",
                        hint="resize the images to one size first",
                    )
                gray = im.mode in gray_modes
                arrays.append(np.asarray(im.convert("L" if gray else "RGB"), dtype=np.uint8))
        except (OSError, UnidentifiedImageError) as exc:
            raise DataError(f"cannot read image {p}: {exc}", hint="fix or remove it") from None
    return arrays


def _stack(arrays: list[np.ndarray]) -> np.ndarray:
    """(N, C, H, W) uint8."""
    # One colour image makes the whole dataset RGB (grey repeated); otherwise keep one channel.
    if any(a.ndim == 3 for a in arrays):
        x = np.stack([a if a.ndim == 3 else np.repeat(a[:, :, None], 3, axis=2) for a in arrays])
        return x.transpose(0, 3, 1, 2)
    return np.stack(arrays)[:, None, :, :]
