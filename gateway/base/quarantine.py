"""Events set aside: reading a log around events that cannot be read, and setting them aside.

An event that this code cannot decode (stored by an older version that let it in) would stop
every start, replay and verify of its log. ``gateway quarantine DB --position P`` sets it
aside: it appends one ``EventsQuarantined`` event to the stream `QUARANTINE_STREAM` naming
the positions set aside and what stands in for each, and from then on every reader of the
log (`LogReader`) decodes the stand-in instead. Nothing in the log is changed or deleted:
the original event stays where it was, for anyone who wants to look at it.

What stands in:

- for a ``RequestReceived`` whose payload cannot be read: the same request with a payload
  that keeps only what decides its lane (``action`` and ``orderId``, ``message``, ``depth``,
  ``code``) and says why (``quarantined``), so the decisions recorded for it still follow;
- for anything else: the whole input with every decision made of it, each replaced by a
  `Quarantined` event, which changes nothing but the stream's version.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lanes.codec import decode, encode
from lanes.events import INPUT_TYPES, Event, Quarantined, RequestReceived
from lanes.replay import Entry
from lanes.requests import ControlAction, Kind
from lanes.streams import QUARANTINE_STREAM, is_agent_stream
from store.port import Append, EventStore, NewEvent, RecordedEvent

RECORD_TYPE = "EventsQuarantined"
"""The type of the events of `QUARANTINE_STREAM`."""
_INPUT_NAMES = frozenset(t.__name__ for t in INPUT_TYPES)
_KEPT: Mapping[str, tuple[str, ...]] = {
    Kind.USER_CONTROL.value: ("action", "orderId", "message"),
    Kind.AGENT_CALL.value: ("depth",),
    Kind.SYSTEM_ALERT.value: ("code",),
}
"""The payload keys that decide a request's lane or fate, by kind: a stand-in keeps them."""


class UnreadableEvent(ValueError):
    """An event of the log that this code cannot decode; says where it is and what to do."""

    def __init__(self, record: RecordedEvent, error: Exception) -> None:
        super().__init__(
            f"the event at position {record.position} (stream {record.stream!r}, version "
            f"{record.version}, {record.type}) cannot be read: {error}. Set it aside with "
            f"'gateway quarantine DB --position {record.position}' (docs/operations.md), "
            "with no gateway serving the log")
        self.record = record


@dataclass(frozen=True, slots=True)
class LogReader:
    """Decodes the events of a log, with the stand-ins of the events set aside."""

    replacements: Mapping[int, tuple[str, str]]
    """Position -> (type, JSON data) of what stands in for the event there."""

    def decode(self, record: RecordedEvent) -> Event:
        """The event of an agent stream's record (its stand-in if it was set aside);
        `UnreadableEvent` if it cannot be decoded."""
        found = self.replacements.get(record.position)
        type_name, data = found if found is not None else (record.type, record.data)
        try:
            return decode(type_name, data)
        except (ValueError, RecursionError) as error:
            raise UnreadableEvent(record, error) from None

    def entries(self, records: Iterable[RecordedEvent]) -> list[Entry]:
        """The agents' events of some records, decoded (other streams left out)."""
        return [Entry(r.position, r.stream, self.decode(r)) for r in records
                if is_agent_stream(r.stream)]


PLAIN = LogReader({})
"""A reader for a log with nothing set aside."""


async def log_reader(store: EventStore) -> LogReader:
    """The reader of ``store``'s log, with every event set aside so far."""
    replacements: dict[int, tuple[str, str]] = {}
    for record in await store.read_stream(QUARANTINE_STREAM):
        for item in json.loads(record.data)["events"]:
            replacements[int(item["position"])] = (item["replacementType"],
                                                   item["replacementData"])
    return LogReader(replacements)


@dataclass(frozen=True, slots=True)
class StandIn:
    """One event set aside and what stands in for it."""

    record: RecordedEvent
    event: Event


def stand_ins(stream: Sequence[RecordedEvent], position: int, reason: str) -> list[StandIn]:
    """What to set aside of ``stream`` (one agent's records in order) to get past the event
    at ``position``: a repaired request alone if it is a request that can be repaired, else
    that event's input with all its decisions."""
    index = next(i for i, r in enumerate(stream) if r.position == position)
    record = stream[index]
    if record.type == RequestReceived.__name__:
        repaired = _repaired_request(record, reason)
        if repaired is not None:
            return [StandIn(record, repaired)]
    start = index
    while start > 0 and stream[start].type not in _INPUT_NAMES:
        start -= 1
    end = index + 1
    while end < len(stream) and stream[end].type not in _INPUT_NAMES:
        end += 1
    return [StandIn(r, Quarantined(at=r.recorded_at, original_type=r.type[:128],
                                   reason=reason)) for r in stream[start:end]]


def _repaired_request(record: RecordedEvent, reason: str) -> RequestReceived | None:
    """The request of ``record`` with its payload cut down to what decides its lane, if the
    rest of it reads (None otherwise)."""
    try:
        data = json.loads(record.data)
        request = data["request"]
        payload = request.get("payload")
        kept: dict[str, Any] = {"quarantined": reason}
        if isinstance(payload, dict):
            for key in _KEPT.get(str(request.get("kind")), ()):
                value = payload.get(key)
                if isinstance(value, str | int) and not isinstance(value, bool):
                    kept[key] = value
        if request.get("kind") == Kind.USER_CONTROL.value and (
                kept.get("action") not in {a.value for a in ControlAction}):
            kept.pop("action", None)
            kept.setdefault("message", "")
        text = json.dumps({**data, "request": {**request, "payload": kept}})
        event = decode(record.type, text)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    return event if isinstance(event, RequestReceived) else None


async def set_aside(store: EventStore, stand: Sequence[StandIn], reason: str, principal: str,
                    at: int, event_id: str) -> RecordedEvent:
    """Record ``stand`` in `QUARANTINE_STREAM` (one event); every reader of the log decodes
    the stand-ins from then on."""
    versions = await store.stream_versions()
    items = []
    for item in stand:
        name, data = encode(item.event)
        items.append({"position": item.record.position, "stream": item.record.stream,
                      "version": item.record.version, "eventId": item.record.event_id,
                      "type": item.record.type, "replacementType": name,
                      "replacementData": data})
    text = json.dumps({"at": at, "principal": principal, "reason": reason, "events": items})
    append = Append(QUARANTINE_STREAM, [NewEvent(event_id, RECORD_TYPE, text)],
                    versions.get(QUARANTINE_STREAM, 0))
    recorded = await store.append(append)
    return recorded[0]
