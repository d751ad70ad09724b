"""One registry helper: named factories of one kind (policies, forecasters, point models).

Each registry names the modules that register its built-in members; they are imported on the first lookup,
so importing the interface does not import every implementation.

>>> shapes = Registry("shape")
>>> @shapes.register("unit")
... def unit(scale: float = 1.0) -> float:
...     return scale
>>> shapes.create("unit", scale=2.0), shapes.names()
(2.0, ['unit'])
>>> shapes.create("square")
Traceback (most recent call last):
ValueError: unknown shape 'square'; known: ['unit']
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Factories of one kind by name.

    Parameters
    ----------
    kind : what is registered, for error messages ("policy", "forecaster").
    builtins : dotted module names whose import registers the built-in members.
    """

    def __init__(self, kind: str, builtins: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.builtins = builtins
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: register a factory under `name`; an empty or duplicate name is an error."""

        def deco(factory: Callable[..., T]) -> Callable[..., T]:
            if not name or name in self._factories:
                raise ValueError(f"{self.kind} name {name!r} is empty or already registered")
            self._factories[name] = factory
            return factory

        return deco

    def create(self, name: str, **kwargs: Any) -> T:
        """Build the member registered under `name` (keyword arguments are its configuration)."""
        self._load_builtins()
        try:
            factory = self._factories[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {sorted(self._factories)}") from None
        return factory(**kwargs)

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        self._load_builtins()
        return sorted(self._factories)

    def _load_builtins(self) -> None:
        for module in self.builtins:
            importlib.import_module(module)
