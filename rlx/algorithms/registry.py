"""A named registry of variants: `@REGISTRY.register("name")` adds a function, `REGISTRY["name"]` finds it.

One small generic helper so that a variant is one decorated function, never a branch of an if/elif:

    SHAPERS = Registry("reward shaper")

    @SHAPERS.register("laser")
    def laser_shaping(rewards, signals, **knobs): ...

    SHAPERS["laser"](rewards, signals)      # an unknown name raises one line listing the valid choices

Names keep their registration order (`names()`), so a config schema can list them as its choices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator


class Registry:
    """name -> function, filled by the `register` decorator. `kind` names what is registered in errors."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Callable] = {}

    def register(self, name: str) -> Callable[[Callable], Callable]:
        """Decorator adding the function under `name`; a second function under the same name is refused."""

        def add(fn: Callable) -> Callable:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._entries[name] = fn
            return fn

        return add

    def __getitem__(self, name: str) -> Callable:
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} '{name}'; valid choices: {', '.join(self._entries)}")
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)
