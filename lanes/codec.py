"""Events to and from JSON text: the type name is the class name, the data its fields.

Data carries the version of its type's shape (see `lanes.upcast`): decoding data of an older
version upcasts it first, and data of a newer version is refused rather than half-read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, NamedTuple, TypeVar

from pydantic import TypeAdapter, ValidationError

from lanes.config import STORED
from lanes.events import DECISION_TYPES, INPUT_TYPES, WRITTEN_WHEN_SET, Event
from lanes.repeatable import reads_back
from lanes.upcast import AGENT_UPCASTERS, VERSION_KEY, UnknownEventVersion, Upcaster, Upcasters

E = TypeVar("E")

_ANY_MARKER = f'{{"{VERSION_KEY}":'


_STORED = {STORED: True}


class UnknownEventType(ValueError):
    """The log holds an event type this code does not know."""


class CorruptEvent(ValueError):
    """An event's data does not match its type."""


class Unrepeatable(ValueError):
    """An event whose JSON text would not read back as the same event: storing it would
    leave the log unreadable (or changed). ``field`` is the dotted path of the first part
    that does not survive, when known."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def first_difference(given: Any, read: Any, path: str = "") -> str | None:
    """The dotted path of the first place where ``read`` differs from ``given`` (camelCase
    for wire models), or None when they are equal."""
    if given == read and type(given) is type(read):
        return None
    if type(given) is not type(read):
        return path or "(event)"
    names: list[tuple[str, str]] = []
    if hasattr(given, "__dataclass_fields__"):
        names = [(name, name) for name in given.__dataclass_fields__]
    elif hasattr(type(given), "model_fields"):
        names = [(name, info.alias or name) for name, info in type(given).model_fields.items()]
    if names:
        for name, shown in names:
            found = first_difference(getattr(given, name), getattr(read, name),
                                     f"{path}.{shown}" if path else shown)
            if found is not None:
                return found
        return path or "(event)"
    if isinstance(given, dict):
        for key in given:
            if key not in read:
                return f"{path}.{key}"
            found = first_difference(given[key], read[key], f"{path}.{key}")
            if found is not None:
                return found
        return path
    if isinstance(given, list | tuple) and len(given) == len(read):
        for index, (a, b) in enumerate(zip(given, read, strict=True)):
            found = first_difference(a, b, f"{path}.{index}")
            if found is not None:
                return found
    return path or "(event)"


class _Writer(NamedTuple):
    """How a codec writes the events of one class (its serializer called directly: the
    adapter's `dump_json` adds a layer of keyword handling to every call)."""

    name: str
    to_json: Callable[..., bytes]
    optional: tuple[tuple[str, Any], ...] | None
    """`Codec`'s ``written_when_set`` for the class."""
    marker: str | None
    """What its data starts with at the current version (None: version 1)."""


class Codec(Generic[E]):
    """Encodes and decodes one family of event classes (agents', providers')."""

    def __init__(self, classes: Iterable[type[Any]], upcasters: Iterable[Upcaster] = (),
                 reads_back: Callable[[Any], bool] | None = None,
                 written_when_set: Mapping[type[Any], tuple[tuple[str, Any], ...]]
                 | None = None) -> None:
        """``reads_back`` tells events known to `decode` back equal by construction
        (`lanes.repeatable`): `encode_checked` spares them the round trip.
        ``written_when_set``: per class, fields added after logs were written with it, left
        out of the stored data while they hold their default (the agents' codec:
        `lanes.events.WRITTEN_WHEN_SET`)."""
        self._reads_back = reads_back
        self._written_when_set = dict(written_when_set or {})
        self.types: dict[str, type[Any]] = {cls.__name__: cls for cls in classes}
        self.upcasters = Upcasters(upcasters)
        unknown = sorted(set(self.upcasters.versions) - set(self.types))
        if unknown:
            raise ValueError(f"upcasters for types that do not exist: {unknown}")
        self._adapters: dict[str, TypeAdapter[Any]] = {
            name: TypeAdapter(cls) for name, cls in self.types.items()
        }
        # Data written at the current version starts with this marker (none at version 1).
        self._markers: dict[str, str] = {
            name: f"{_ANY_MARKER}{version}" for name, version in self.upcasters.versions.items()
        }
        self._writers = {cls: _Writer(name, self._adapters[name].serializer.to_json,
                                      self._written_when_set.get(cls),
                                      self._markers.get(name))
                         for name, cls in self.types.items()}

    def version(self, type_name: str) -> int:
        """The version of ``type_name`` this code writes."""
        return self.upcasters.version(type_name)

    def encode(self, event: E) -> tuple[str, str]:
        """The type name and JSON text of an event (at its type's current version)."""
        name, to_json, optional, marker = self._writers[type(event)]
        if optional is None:
            text = to_json(event, by_alias=True, context=_STORED).decode()
        else:
            unset = {field for field, default in optional if getattr(event, field) == default}
            text = to_json(event, by_alias=True, exclude=unset or None,
                           context=_STORED).decode()
        if marker is not None:
            text = marker + ("}" if text == "{}" else "," + text[1:])
        return name, text

    def encode_checked(self, event: E) -> tuple[str, str]:
        """`encode`, refusing (`Unrepeatable`) an event that would not `decode` back equal:
        the one rule that keeps every stored event readable, applied before it is stored.
        An event the codec's ``reads_back`` knows to read back equal is only encoded (and
        one known to by how it was made, a request the edge just parsed, is not even given
        here: `lanes.repeatable`)."""
        if self._reads_back is not None and self._reads_back(event):
            return self.encode(event)
        try:
            name, text = self.encode(event)
        except ValueError as error:  # surrogates, say: not encodable at all
            raise Unrepeatable(f"it cannot be written as JSON: {error}") from None
        try:
            again = self.decode(name, text)
        except (CorruptEvent, RecursionError) as error:
            raise Unrepeatable(f"it would not read back: {error}") from None
        if again != event:
            field = first_difference(event, again)
            raise Unrepeatable(f"{field} would read back changed", field)
        return name, text

    def decode(self, type_name: str, data: str | bytes) -> E:
        """The event of that type from its JSON text, upcast if it was written by older code.

        Raises `UnknownEventType`, `UnknownEventVersion` (written by newer code) or
        `CorruptEvent`.
        """
        adapter = self._adapters.get(type_name)
        if adapter is None:
            raise UnknownEventType(f"unknown event type {type_name!r}")
        text = data.decode() if isinstance(data, bytes) else data
        marker = self._markers.get(type_name)
        if marker is None:  # the type is at version 1
            if text.startswith(_ANY_MARKER):  # written by newer code at a later version
                return self._decode_other_version(type_name, adapter, text)
            try:
                event: E = adapter.validate_json(text)
            except ValidationError as error:
                raise CorruptEvent(f"{type_name}: {error}") from None
            return event
        end = len(marker)
        follows = text[end:end + 1]
        if text.startswith(marker) and follows in (",", "}"):  # the current version
            try:
                event = adapter.validate_json("{}" if follows == "}" else "{" + text[end + 1:])
            except ValidationError as error:
                raise CorruptEvent(f"{type_name}: {error}") from None
            return event
        return self._decode_other_version(type_name, adapter, text)

    def _decode_other_version(self, type_name: str, adapter: TypeAdapter[Any], text: str) -> E:
        """The slow path: data of another version than the current one."""
        try:
            obj = json.loads(text)
        except ValueError as error:
            raise CorruptEvent(f"{type_name}: not JSON ({error})") from None
        if not isinstance(obj, dict):
            raise CorruptEvent(f"{type_name}: the data is not a JSON object")
        try:
            upcast = self.upcasters.upcast(type_name, obj)
        except UnknownEventVersion:
            raise
        except (ValueError, KeyError, TypeError) as error:
            raise CorruptEvent(f"{type_name}: cannot upcast: {error!r}") from None
        try:
            event: E = adapter.validate_json(json.dumps(upcast, separators=(",", ":")))
        except ValidationError as error:
            raise CorruptEvent(f"{type_name}: {error}") from None
        return event


AGENT_CODEC: Codec[Event] = Codec(INPUT_TYPES + DECISION_TYPES, AGENT_UPCASTERS, reads_back,
                                  WRITTEN_WHEN_SET)
EVENT_TYPES = AGENT_CODEC.types
encode = AGENT_CODEC.encode
encode_checked = AGENT_CODEC.encode_checked
decode = AGENT_CODEC.decode

__all__ = [
    "AGENT_CODEC",
    "EVENT_TYPES",
    "Codec",
    "CorruptEvent",
    "UnknownEventType",
    "UnknownEventVersion",
    "Unrepeatable",
    "decode",
    "encode",
    "encode_checked",
    "first_difference",
]
