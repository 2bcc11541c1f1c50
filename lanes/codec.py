"""Events to and from JSON text: the type name is the class name, the data its fields."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from pydantic import TypeAdapter, ValidationError

from lanes.events import DECISION_TYPES, INPUT_TYPES, Event

E = TypeVar("E")


class UnknownEventType(ValueError):
    """The log holds an event type this code does not know."""


class CorruptEvent(ValueError):
    """An event's data does not match its type."""


class Codec(Generic[E]):
    """Encodes and decodes one family of event classes (agents', providers')."""

    def __init__(self, classes: Iterable[type[Any]]) -> None:
        self.types: dict[str, type[Any]] = {cls.__name__: cls for cls in classes}
        self._adapters: dict[str, TypeAdapter[Any]] = {
            name: TypeAdapter(cls) for name, cls in self.types.items()
        }
        self._by_class = {cls: self._adapters[name] for name, cls in self.types.items()}

    def encode(self, event: E) -> tuple[str, str]:
        """The type name and JSON text of an event."""
        data = self._by_class[type(event)].dump_json(event, by_alias=True)
        return type(event).__name__, data.decode()

    def decode(self, type_name: str, data: str | bytes) -> E:
        """The event of that type from its JSON text."""
        adapter = self._adapters.get(type_name)
        if adapter is None:
            raise UnknownEventType(f"unknown event type {type_name!r}")
        try:
            event: E = adapter.validate_json(data)
        except ValidationError as error:
            raise CorruptEvent(f"{type_name}: {error}") from None
        return event


AGENT_CODEC: Codec[Event] = Codec(INPUT_TYPES + DECISION_TYPES)
EVENT_TYPES = AGENT_CODEC.types
encode = AGENT_CODEC.encode
decode = AGENT_CODEC.decode
