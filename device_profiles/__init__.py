"""Device budget profiles: one TOML file per device class, and a tiny validating loader.

Works from an installed wheel (the TOML files are package data read through importlib.resources).
A bad file raises ProfileError listing every problem with its file and key.
"""

from __future__ import annotations

import difflib
import math
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

OPTIMIZERS = ("sgd", "sgd-momentum", "adam")

# key -> (type, description); every key is required, no other key is allowed.
_TOP = {
    "name": (str, "profile name"),
    "description": (str, "one line"),
    "ram_bytes": (int, "device RAM in bytes"),
    "ram_available_fraction": (float, "share of RAM a learning app may use, in (0, 1]"),
    "storage_bytes": (int, "non-volatile storage in bytes"),
    "macs_per_second": (float, "sustained fp32 multiply-accumulates per second"),
}
_TRAINING = {
    "optimizer": (str, f"one of {', '.join(OPTIMIZERS)}"),
    "batch_size": (int, "local batch size"),
    "epochs": (int, "local epochs by default"),
    "max_epoch_seconds": (float, "longest the owner lets one local epoch run"),
}
# Optional keys: absent means off.
_TRAINING_OPTIONAL = {
    "min_steps": (
        int,
        "fewest optimiser steps of local training (under --dp, DP-SGD's Poisson "
        "batches): a small shard trains more epochs (up to MAX_EPOCHS_FACTOR x epochs) "
        "so that it gets them",
    ),
}
# How far min_steps may stretch the profile's epochs (FedMHO's phones train 200 local epochs).
MAX_EPOCHS_FACTOR = 20


class ProfileError(ValueError):
    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"invalid device profile {source}:\n  - " + "\n  - ".join(problems))


class UnknownProfile(KeyError):
    def __init__(self, name: str, valid: list[str]):
        self.name = name
        self.valid = valid
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
        self.suggestion = close[0] if close else None
        super().__init__(name)


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    ram_bytes: int
    ram_available_fraction: float
    storage_bytes: int
    macs_per_second: float
    optimizer: str
    batch_size: int
    epochs: int
    max_epoch_seconds: float
    source: str
    min_steps: int = 0

    def local_epochs(self, samples: int, batch_size: int | None = None) -> int:
        """Epochs a client with `samples` training samples runs by default: the profile's, or
        more where they would be fewer than min_steps optimiser steps (a user's 400 sensor
        windows are 7 steps an epoch at batch 64: 10 epochs would barely start training)."""
        if not self.min_steps or samples < 1:
            return self.epochs
        per_epoch = -(-samples // (batch_size or self.batch_size))
        wanted = -(-self.min_steps // per_epoch)
        return max(self.epochs, min(wanted, MAX_EPOCHS_FACTOR * self.epochs))

    @property
    def ram_budget_bytes(self) -> int:
        """RAM a learning app may use: the budget training and inference are checked against."""
        return int(self.ram_bytes * self.ram_available_fraction)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "ram_bytes": self.ram_bytes,
            "ram_available_fraction": self.ram_available_fraction,
            "ram_budget_bytes": self.ram_budget_bytes,
            "storage_bytes": self.storage_bytes,
            "macs_per_second": self.macs_per_second,
            "training": {
                "optimizer": self.optimizer,
                "batch_size": self.batch_size,
                "epochs": self.epochs,
                "max_epoch_seconds": self.max_epoch_seconds,
                "min_steps": self.min_steps,
            },
            "source": self.source,
        }


def _check_table(
    table: dict, spec: dict, prefix: str, problems: list[str], optional: dict | None = None
) -> None:
    optional = optional or {}
    for key, (typ, desc) in (spec | optional).items():
        where = f"{prefix}{key}"
        if key not in table:
            if key not in optional:
                problems.append(f"{where}: missing ({desc})")
            continue
        value = table[key]
        ok = isinstance(value, typ) and not isinstance(value, bool)
        if typ is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True  # TOML writes 1e9 as float but 1000 as int: both are numbers
        if not ok:
            problems.append(f"{where}: expected {typ.__name__}, got {type(value).__name__}")
        elif typ in (int, float) and not math.isfinite(value):
            problems.append(f"{where}: must be a finite positive number, got {value}")
        elif typ in (int, float) and value <= 0:
            problems.append(f"{where}: must be positive, got {value}: raise it")
    for key in table:
        if key not in spec and key not in optional and not (prefix == "" and key == "training"):
            problems.append(f"{prefix}{key}: unknown key (valid: {', '.join(spec | optional)})")


MIN_BUDGET_BYTES = 1024  # smaller than any model, optimizer state or batch it could hold


def parse_profile(data: dict, source: str) -> Profile:
    problems: list[str] = []
    _check_table(data, _TOP, "", problems)
    training = data.get("training")
    if not isinstance(training, dict):
        problems.append(
            "[training]: missing table (optimizer, batch_size, epochs, max_epoch_seconds)"
        )
        training = {}
    else:
        _check_table(training, _TRAINING, "training.", problems, _TRAINING_OPTIONAL)
    frac = data.get("ram_available_fraction")
    if isinstance(frac, int | float) and not isinstance(frac, bool) and frac > 1:
        problems.append(f"ram_available_fraction: must be in (0, 1], got {frac}: lower it")
    ram = data.get("ram_bytes")
    if (
        not problems
        and isinstance(ram, int)
        and int(ram * float(frac)) < MIN_BUDGET_BYTES  # a budget of 0 bytes fits nothing
    ):
        problems.append(
            f"ram_bytes x ram_available_fraction: a learning budget of {int(ram * float(frac))} "
            f"bytes, under {MIN_BUDGET_BYTES}: raise either"
        )
    opt = training.get("optimizer")
    if isinstance(opt, str) and opt not in OPTIMIZERS:
        problems.append(f"training.optimizer: {opt!r} is not one of {', '.join(OPTIMIZERS)}")
    if problems:
        raise ProfileError(source, problems)
    return Profile(
        name=data["name"],
        description=data["description"],
        ram_bytes=data["ram_bytes"],
        ram_available_fraction=float(data["ram_available_fraction"]),
        storage_bytes=data["storage_bytes"],
        macs_per_second=float(data["macs_per_second"]),
        optimizer=training["optimizer"],
        batch_size=training["batch_size"],
        epochs=training["epochs"],
        max_epoch_seconds=float(training["max_epoch_seconds"]),
        source=source,
        min_steps=training.get("min_steps", 0),
    )


def list_profiles() -> list[str]:
    return sorted(
        p.name[: -len(".toml")]
        for p in resources.files(__package__).iterdir()
        if p.name.endswith(".toml")
    )


def load_profile(name_or_path: str | Path) -> Profile:
    """A built-in profile by name, or a user's TOML file by path."""
    text_path = str(name_or_path)
    path = Path(text_path)
    if text_path.endswith(".toml") or path.exists():
        if not path.is_file():
            raise ProfileError(text_path, ["file not found"])
        raw, source = path.read_bytes(), str(path)
    else:
        if text_path not in list_profiles():
            raise UnknownProfile(text_path, list_profiles())
        ref = resources.files(__package__) / f"{text_path}.toml"
        raw, source = ref.read_bytes(), f"built-in {text_path}.toml"
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(source, [f"not valid TOML: {exc}"]) from None
    return parse_profile(data, source)
