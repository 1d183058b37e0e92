"""A registry of named entries (zoo models, datasets, fusion methods), timm-style.

Entries are registered by explicit calls in each package's `__init__`, never by import side effect
of `from x import *`. An unknown name raises `UnknownNameError` with the valid names and the nearest.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from edgefl.errors import ConfigError, UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._broken: dict[str, str] = {}  # name -> why its plugin did not load

    def add(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> T:
        """Unregister (a plugin's or a test's entry); unknown names raise like `get`."""
        entry = self.get(name)
        del self._entries[name]
        return entry

    def mark_broken(self, name: str, why: str) -> None:
        """`name` is an installed plugin's that failed to load: asking for it says so."""
        self._broken[name] = why

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            if name in self._broken:
                raise ConfigError(
                    f"{self.kind} {name!r} comes from an installed plugin that did not load: "
                    f"{self._broken[name]}",
                    hint="reinstall or upgrade the package that provides it, or uninstall it",
                ) from None
            raise UnknownNameError(self.kind, name, self._entries) from None

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[T]:
        return iter(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)
