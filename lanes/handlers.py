"""Handlers by event class: the one registry that ``evolve`` and ``decide`` use, on the
agent side and on the provider gate's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

H = TypeVar("H", bound=Callable[..., None])
F = TypeVar("F", bound=Callable[..., None])


class IllegalTransition(Exception):
    """An event that cannot apply to the current state (a corrupt or foreign log)."""


class Registry(Generic[H]):
    """Event class -> its handler. ``@registry.on(Cls, ...)`` registers a function;
    `handler` finds one or raises `IllegalTransition`; hot paths may read ``table``."""

    def __init__(self, what: str) -> None:
        self.what = what
        """What the events are, for the error of an unknown one ("event", "gate event")."""
        self.table: dict[type[Any], H] = {}

    def on(self, *classes: type[Any]) -> Callable[[F], F]:
        """Register the decorated function for each of ``classes`` (once per class)."""

        def register(fn: F) -> F:
            for cls in classes:
                if cls in self.table:
                    raise ValueError(f"{cls.__name__} has a {self.what} handler already")
                self.table[cls] = fn  # type: ignore[assignment]
            return fn

        return register

    def handler(self, event: object) -> H:
        """The handler of ``event``'s class."""
        handler = self.table.get(type(event))
        if handler is None:
            raise IllegalTransition(f"unknown {self.what} type {type(event).__name__}")
        return handler
