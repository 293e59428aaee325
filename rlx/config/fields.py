"""How a schema field declares what its knob holds (rlx/config/schema.py checks a config against them).

  num(low, high, ...), positive(), fraction()   a number's range, as the field's metadata
  choices("Name", names)                       a fixed set of names, as an Enum (values as they appear in YAML)
  registry_names("Name", lambda: REGISTRY)     the names of a registry, read when the config is CHECKED, not
                                               when this module is imported: an entry a plugin registered
                                               (rlx.register, plugins=[...]) is valid at once
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import field
from typing import ClassVar


def num(low: float | None = None, high: float | None = None, low_open: bool = False, high_open: bool = False,
        length: int | None = None):
    """A numeric field's range: [low, high], ends open when `*_open`; None: unbounded on that side.
    length: a list of exactly this many numbers (each in the range)."""
    return field(metadata={"low": low, "high": high, "low_open": low_open, "high_open": high_open, "length": length})


def positive():  # a number > 0
    return num(0, low_open=True)


def fraction(low_open: bool = False, high_open: bool = False):  # in [0, 1], ends optionally open
    return num(0, 1, low_open, high_open)


def choices(name: str, names) -> type[enum.Enum]:
    """A fixed set of names as an Enum (values are the names as they appear in YAML)."""
    return enum.Enum(name, [(str(n), n) for n in names], type=str)


class RegistryNames:
    """A field holding one name of a live set: `names()` asks the source each time a config is checked."""

    source: ClassVar[Callable[[], Iterable[str]]]

    @classmethod
    def names(cls) -> list[str]:
        return [str(name) for name in cls.source()]


def registry_names(name: str, source: Callable[[], Iterable[str]]) -> type[RegistryNames]:
    """A field type whose valid values are the names `source()` returns when the config is checked, e.g.
    `registry_names("Advantage", lambda: ESTIMATORS)` (a registry iterates its names)."""
    return type(name, (RegistryNames,), {"source": staticmethod(source), "__module__": __name__,
                                         "__doc__": f"a name of a live registry ({name})"})


def names_of(kind) -> list[str] | None:
    """The valid names of a choice type (an Enum or a RegistryNames type); None for any other type."""
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return [member.value for member in kind]
    if isinstance(kind, type) and issubclass(kind, RegistryNames):
        return kind.names()
    return None
