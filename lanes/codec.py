"""Events to and from JSON text: the type name is the class name, the data its fields."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

from lanes.events import DECISION_TYPES, INPUT_TYPES, Event

EVENT_TYPES: dict[str, type[Any]] = {cls.__name__: cls for cls in INPUT_TYPES + DECISION_TYPES}
_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    name: TypeAdapter(cls) for name, cls in EVENT_TYPES.items()
}
_BY_CLASS: dict[type[Any], TypeAdapter[Any]] = {
    cls: _ADAPTERS[name] for name, cls in EVENT_TYPES.items()
}


class UnknownEventType(ValueError):
    """The log holds an event type this code does not know."""


class CorruptEvent(ValueError):
    """An event's data does not match its type."""


def encode(event: Event) -> tuple[str, str]:
    """The type name and JSON text of an event."""
    data = _BY_CLASS[type(event)].dump_json(event, by_alias=True)
    return type(event).__name__, data.decode()


def decode(type_name: str, data: str | bytes) -> Event:
    """The event of that type from its JSON text."""
    adapter = _ADAPTERS.get(type_name)
    if adapter is None:
        raise UnknownEventType(f"unknown event type {type_name!r}")
    try:
        event: Event = adapter.validate_json(data)
    except ValidationError as error:
        raise CorruptEvent(f"{type_name}: {error}") from None
    return event
