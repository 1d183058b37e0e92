"""edgefl's view of `device_profiles`: the same loader, errors mapped into edgefl's hierarchy."""

from __future__ import annotations

from pathlib import Path

from device_profiles import Profile, ProfileError, UnknownProfile, list_profiles, load_profile
from edgefl.errors import ConfigError, UnknownNameError

__all__ = ["Profile", "get_profile", "list_profiles"]


def get_profile(name_or_path: str | Path) -> Profile:
    try:
        return load_profile(name_or_path)
    except UnknownProfile as exc:
        raise UnknownNameError("profile", exc.name, exc.valid) from None
    except ProfileError as exc:
        path = Path(name_or_path)
        if not path.is_file():  # nothing to fix inside: the path is wrong
            what = "is a folder" if path.is_dir() else "does not exist"
            raise ConfigError(
                f"--profile {name_or_path}: {what}",
                hint=f"name a profile TOML file or a built-in ({', '.join(list_profiles())})",
            ) from None
        raise ConfigError(
            str(exc), hint="fix the keys listed above (see device_profiles/*.toml for examples)"
        ) from None
