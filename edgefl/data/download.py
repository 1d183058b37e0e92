"""`--download`: fetch a file-based registered dataset into the data folder through torchvision.

torchvision is optional; nothing else in edgefl downloads. The files land where the format
modules (`idx`, `cifar`, `svhn`) look for them.
"""

from __future__ import annotations

from pathlib import Path

from edgefl.data._common import SPLITS
from edgefl.errors import DataError

_TV_CLASSES = {
    "fmnist": "FashionMNIST",
    "emnist": "EMNIST",
    "cifar10": "CIFAR10",
    "cifar100": "CIFAR100",
    "svhn": "SVHN",
}


def download_with_torchvision(name: str, root: Path) -> None:
    try:
        import torchvision.datasets as tvd
    # torchvision built for another torch raises RuntimeError at import, not ImportError.
    except (ImportError, RuntimeError) as exc:
        raise DataError(
            f"--download needs torchvision, which cannot be imported here ({exc})",
            hint=f"install a torchvision that matches your torch, or place the {name} files in "
            f"{root} by hand (`edgefl data list` says which files)",
        ) from None
    root.mkdir(parents=True, exist_ok=True)
    cls = getattr(tvd, _TV_CLASSES[name])
    for split in SPLITS:
        if name == "svhn":
            cls(root=str(root), split=split, download=True)
        elif name == "emnist":
            cls(root=str(root), split="balanced", train=split == "train", download=True)
        else:
            cls(root=str(root), train=split == "train", download=True)
