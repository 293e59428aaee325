"""Named registries of variants: `@REGISTRY.register("name")` adds a function (or class), `REGISTRY["name"]`
finds it. A leaf module: it imports nothing from rlx, so every layer (the torch-only algorithms included) may use it.

One small generic type, so that a variant is one decorated definition, never a branch of an if/elif:

    SHAPERS = Registry("reward shaper")

    @SHAPERS.register("laser")
    def laser_shaping(rewards, signals, **knobs): ...

    SHAPERS["laser"](rewards, signals)      # an unknown name raises one line listing the valid choices

An entry may declare what it needs (`@ESTIMATORS.register("median", needs=EstimatorNeeds(extra_samples=1))`): the
registry keeps the object as given and `REGISTRY.needs("name")` returns it, or the registry's `default_needs` for an
entry that declared none; generic code (the config's compatibility check, the builder) reads it instead of
comparing names. A dict is turned into the type of `default_needs` (so a plugin writes `needs={"...": ...}`).

A registry is a read-only Mapping (`in`, iteration, `keys()`, `items()`, `get`, `len`) whose names keep their
registration order, so code that used a dict keeps working; entries are added only through `register`/`add`.
The config checks the names a user gives against the live registry (rlx/config/schema.py), so an entry a
plugin registers (rlx.register, docs/extending/plugins.md) is valid at once. `RegistryView` joins several
registries under one set of names (e.g. the reference-based and reference-free preference losses).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any


class UnknownName(KeyError, ValueError):
    """A name no entry has. A KeyError for Mapping.get and `except KeyError`, a ValueError for the callers that
    validated names with ValueError before registries were Mappings; str() is the one-line message."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _where(definition: Any) -> tuple[str, str] | None:
    """(module, qualified name) of a named function or class; None for other objects and lambdas (two lambdas
    of one scope share a qualified name, so it does not tell a second definition from a re-run of the first)."""
    module, name = getattr(definition, "__module__", None), getattr(definition, "__qualname__", None)
    return (module, name) if module and name and not name.endswith("<lambda>") else None


class Registry(Mapping):
    """name -> entry, filled by the `register` decorator; `kind` names what is registered in messages."""

    def __init__(self, kind: str, default_needs: Any = None):
        self.kind = kind
        self.default_needs = default_needs  # what an entry that declares nothing needs (None: the kind has no needs)
        self._entries: dict[str, Any] = {}
        self._origins: dict[str, tuple[str, str] | None] = {}  # name -> where its definition lives
        self._needs: dict[str, Any] = {}  # name -> its declared needs

    def register(self, name: str, needs: Any = None) -> Callable[[Any], Any]:
        """Decorator adding the decorated function or class under `name` (with its declared `needs`) and
        returning it unchanged."""

        def decorate(entry: Any) -> Any:
            self.add(name, entry, needs=needs)
            return entry

        return decorate

    def add(self, name: str, entry: Any, definition: Any = None, needs: Any = None) -> Any:
        """Add `entry` under `name`. Another definition under a taken name is refused (one line); the same
        definition again (same module and qualified name: a re-run notebook cell, a reloaded module) replaces
        it. definition: the function or class that identifies the entry when the entry is built from it
        (default: the entry itself). needs: what the entry needs (see `needs`)."""
        if needs is not None and self.default_needs is None:
            raise ValueError(f"a {self.kind} declares no needs (got needs={needs!r} for '{name}')")
        if isinstance(needs, dict):
            needs = type(self.default_needs)(**needs)
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a non-empty string name, got {name!r}")
        origin = _where(entry if definition is None else definition)
        if name in self._entries and (origin is None or self._origins[name] != origin):
            taken = self._origins[name]
            raise ValueError(f"{self.kind} '{name}' is registered twice"
                             + (f" (already by {'.'.join(taken)})" if taken else "") + "; pick another name")
        self._entries[name], self._origins[name] = entry, origin
        self._needs[name] = self.default_needs if needs is None else needs
        return entry

    def unregister(self, name: str) -> None:
        """Remove `name` (a test's clean-up; a plugin withdrawing an entry). Unknown names raise UnknownName."""
        if name not in self._entries:
            raise self._unknown(name)
        del self._entries[name], self._origins[name], self._needs[name]

    def needs(self, name: str) -> Any:
        """What entry `name` declared it needs (the registry's default_needs if nothing). Unknown: UnknownName."""
        if name not in self._entries:
            raise self._unknown(name)
        return self._needs[name]

    def __getitem__(self, name: str) -> Any:
        if name not in self._entries:
            raise self._unknown(name)
        return self._entries[name]

    def __setitem__(self, name: str, entry: Any) -> None:
        raise TypeError(f"the {self.kind} registry is read-only: add an entry with its @register({name!r}) "
                        f"decorator, or rlx.register(KIND, {name!r}) (docs/extending/plugins.md)")

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"

    def names(self) -> tuple[str, ...]:
        """The names in registration order (a snapshot)."""
        return tuple(self._entries)

    def _unknown(self, name: object) -> UnknownName:
        return UnknownName(f"unknown {self.kind} '{name}'; valid choices: {', '.join(self._entries)}")


class RegistryView(Mapping):
    """Several registries read as one (live: an entry added to a part appears here): names in the order of
    the parts, then of each part's registration. Read-only; add entries to the part they belong to."""

    def __init__(self, kind: str, *parts: Mapping):
        self.kind, self.parts = kind, parts

    def __getitem__(self, name: str) -> Any:
        for part in self.parts:
            if name in part:
                return part[name]
        raise UnknownName(f"unknown {self.kind} '{name}'; valid choices: {', '.join(self)}")

    def __contains__(self, name: object) -> bool:
        return any(name in part for part in self.parts)

    def __iter__(self) -> Iterator[str]:
        for part in self.parts:
            yield from part

    def __len__(self) -> int:
        return sum(len(part) for part in self.parts)

    def __repr__(self) -> str:
        return f"RegistryView({self.kind!r}: {', '.join(self)})"

    def needs(self, name: str) -> Any:
        """The needs the part holding `name` keeps for it."""
        for part in self.parts:
            if name in part:
                return part.needs(name)
        raise UnknownName(f"unknown {self.kind} '{name}'; valid choices: {', '.join(self)}")

    def names(self) -> tuple[str, ...]:
        return tuple(self)


# ------------------------------------------------------------------------------------------------
# Published registries: how rlx/config/ learns the names of an upper layer's registry without importing it
# ------------------------------------------------------------------------------------------------

_PUBLISHED: dict[str, Mapping] = {}


def publish(key: str, registry: Mapping) -> Mapping:
    """Announce `registry` (a Registry or any name -> entry mapping) under `key` and return it unchanged:
    `VERIFIERS = publish("verifier", Registry("verifier"))`. The config checks names against
    `published(key)`, so that rlx/config/ never imports the layer the registry lives in (tests/test_layers.py)."""
    if _PUBLISHED.get(key, registry) is not registry:
        raise ValueError(f"a registry is already published as '{key}'")
    _PUBLISHED[key] = registry
    return registry


def published(key: str) -> Mapping:
    """The registry published under `key`, live (a plugin's entries included). Its module must have been
    imported: the commands and rlx.api import every registering module first (rlx/cli/registries.py)."""
    try:
        return _PUBLISHED[key]
    except KeyError:
        raise LookupError(f"no registry is published as '{key}': import rlx.cli.registries (every module that "
                          f"registers) before checking a config") from None
