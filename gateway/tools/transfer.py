"""Moving an event log between machines: JSON Lines, a header then one event a line.

    {"format":"gateway-event-log","formatVersion":1,"events":3,"lastPosition":3}
    {"position":1,"stream":"agent_btc_5m","version":1,"eventId":"...","type":"ConfigChanged",
     "recordedAt":1771297800000,"data":{...}}

Every row of the log goes out as it is (provider gate streams too; snapshots do not: they
are a cache). ``data`` is the event's JSON object, so the file reads well and ``jq`` works on
it; on import it is written back compactly (same values; a float may change notation).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from gateway.runtime.desk import read_kill
from lanes.codec import decode
from lanes.gate import decode_gate_event
from lanes.streams import DESK_STREAM, is_agent_stream
from store.port import RecordedEvent

FORMAT = "gateway-event-log"
FORMAT_VERSION = 1
_KEYS = ("position", "stream", "version", "eventId", "type", "recordedAt", "data")


class BadExport(ValueError):
    """A file that is not an export this gateway can import (line and reason)."""


def header(events: int, last_position: int) -> str:
    """The first line of an export."""
    return json.dumps({"format": FORMAT, "formatVersion": FORMAT_VERSION, "events": events,
                       "lastPosition": last_position}, separators=(",", ":"))


def event_line(record: RecordedEvent) -> str:
    """One event as a line (without its newline)."""
    return json.dumps({
        "position": record.position, "stream": record.stream, "version": record.version,
        "eventId": record.event_id, "type": record.type, "recordedAt": record.recorded_at,
        "data": json.loads(record.data),
    }, ensure_ascii=False, separators=(",", ":"))


def parse(lines: Iterable[str]) -> Iterator[RecordedEvent]:
    """The events of an export, each checked to decode as its stream's kind of event (so a
    log that imports is a log this gateway can read); `BadExport` names the line."""
    numbered = enumerate(lines, start=1)
    first = next(((n, line) for n, line in numbered if line.strip()), None)
    if first is None:
        raise BadExport("the file is empty: no header line")
    announced = _header(*first)
    count = 0
    for number, line in numbered:
        if not line.strip():
            continue
        yield _event(number, line)
        count += 1
    if count != announced:
        raise BadExport(f"the header announces {announced} events, the file holds {count} "
                        "(truncated?)")


def _header(number: int, line: str) -> int:
    obj = _object(number, line)
    if obj.get("format") != FORMAT:
        raise BadExport(f"line {number}: not a {FORMAT} export (no header)")
    if obj.get("formatVersion") != FORMAT_VERSION:
        raise BadExport(f"line {number}: format version {obj.get('formatVersion')!r}; this "
                        f"gateway reads version {FORMAT_VERSION}")
    events = obj.get("events")
    if not isinstance(events, int) or events < 0:
        raise BadExport(f"line {number}: the header has no event count")
    return events


def _event(number: int, line: str) -> RecordedEvent:
    obj = _object(number, line)
    missing = [key for key in _KEYS if key not in obj]
    if missing:
        raise BadExport(f"line {number}: missing {', '.join(missing)}")
    ints = [obj["position"], obj["version"], obj["recordedAt"]]
    texts = [obj["stream"], obj["eventId"], obj["type"]]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints):
        raise BadExport(f"line {number}: position, version and recordedAt must be integers")
    if not all(isinstance(v, str) for v in texts) or not isinstance(obj["data"], dict):
        raise BadExport(f"line {number}: stream, eventId and type must be strings and data "
                        "an object")
    try:
        data = json.dumps(obj["data"], ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False)
    except ValueError:
        raise BadExport(f"line {number}: data holds NaN or Infinity, which JSON does not "
                        "allow") from None
    try:
        if is_agent_stream(obj["stream"]):
            decode(obj["type"], data)
        elif obj["stream"] == DESK_STREAM:
            read_kill(data)
        else:
            decode_gate_event(obj["type"], data)
    except ValueError as error:
        raise BadExport(f"line {number}: {error}") from None
    return RecordedEvent(obj["position"], obj["stream"], obj["version"], obj["eventId"],
                         obj["type"], data, obj["recordedAt"])


def _object(number: int, line: str) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except ValueError as error:
        raise BadExport(f"line {number}: not JSON ({error})") from None
    if not isinstance(obj, dict):
        raise BadExport(f"line {number}: not a JSON object")
    return obj
