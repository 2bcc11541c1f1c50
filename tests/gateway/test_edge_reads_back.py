"""What the edge takes as parsed reads back from the log, by construction: a request that the
edge's own parser (`load_json`, strict) and frame models (`Submit`, `SubmitMany`, the items
of a big `submit_many` one at a time) let through is stored and read back as the same event,
and `lanes.repeatable` knows it. `Intake.take(parsed=True)` skips the doorway's look on this
promise, so it is drawn wide here: every kind, ``ifBusy``, date-times the parser takes in
forms ``isoformat`` never writes, raw UTF-8 or escaped text, number literals JSON allows."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.edge.frames import BATCHES, validate_now
from gateway.edge.protocol import load_json
from gateway.errors import BadFrame
from lanes import InvalidRequest
from lanes.codec import first_difference
from lanes.events import RequestReceived
from lanes.repeatable import reads_back
from lanes.requests import ControlAction, Kind
from tests.lanes.test_repeatable import round_trip

NUMBER = "__number__"
"""A payload value replaced by a raw number literal in the frame's text."""
LITERALS = ("1e-400", "1E5", "-0.0", "0.1e1", "2.5E-3", "1e308", "4.9e-324", "1e400",
            "123456789012345678901234567890.5", "9223372036854775807", "-9223372036854775808",
            "9223372036854775808", "0.30000000000000004", "1.0", "-1", "7e+2")
TEXT = st.text(max_size=10)
"""What JSON text can carry."""


def json_values() -> st.SearchStrategy[Any]:
    """JSON-shaped values, raw number literals among them."""
    return st.recursive(
        st.none() | st.booleans() | st.integers(-(1 << 64), 1 << 64) | st.just(NUMBER)
        | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
        max_leaves=10)


@st.composite
def created_at(draw: st.DrawFn) -> str:
    """A date-time in one of the forms ISO 8601 (and the parser) takes."""
    minutes = draw(st.integers(-(23 * 60 + 59), 23 * 60 + 59))
    moment = draw(st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9998, 12, 31),
                               timezones=st.just(timezone(timedelta(minutes=minutes)))))
    text = moment.isoformat()
    if draw(st.booleans()):
        text = text.replace("T", " ")
    if draw(st.booleans()) and "." in text:  # (more fractional digits than microseconds)
        head, _, tail = text.partition(".")
        text = f"{head}.{tail[:6]}{draw(st.integers(0, 999)):03d}{tail[6:]}"
    sign_at = max(text.rfind("+"), text.rfind("-"))
    offset = text[sign_at:]
    zone = draw(st.sampled_from([offset, offset.replace(":", ""),
                                 "Z" if offset == "+00:00" else offset,
                                 "z" if offset == "+00:00" else offset,
                                 "-00:00" if offset == "+00:00" else offset]))
    return text[:sign_at] + zone


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    """A request's JSON object as any client might send it."""
    kind = draw(st.sampled_from([k.value for k in Kind]))
    payload = draw(st.dictionaries(TEXT, json_values(), max_size=3))
    if kind == Kind.USER_CONTROL and draw(st.booleans()):
        payload["action"] = draw(st.sampled_from([a.value for a in ControlAction]))
        payload.update(draw(st.fixed_dictionaries({}, optional={
            "orderId": TEXT, "approvalId": TEXT, "reason": TEXT})))
    data: dict[str, Any] = {
        "requestId": draw(st.text(min_size=1, max_size=12)),
        "createdAt": draw(created_at()),
        "agentId": draw(st.from_regex(r"\A[A-Za-z0-9_.\-]{1,12}\Z")),
        "kind": kind,
        "payload": payload,
    }
    optional = {"priority": st.sampled_from(["high", "normal", "low"]),
                "dedupeKey": st.text(min_size=1, max_size=12),
                "messageId": st.text(min_size=1, max_size=12), "source": TEXT,
                "ifBusy": st.sampled_from(["followup", "queue", "interrupt", "collect",
                                           "steer", "steer-backlog", "reject"])}
    for key, values in optional.items():
        if draw(st.booleans()):
            data[key] = draw(values)
    return data


def frame_text(frame: dict[str, Any], ascii_only: bool, literal: str) -> str:
    """The frame as a client writes it: escaped or raw UTF-8, the raw number literal in."""
    return json.dumps(frame, ensure_ascii=ascii_only).replace(f'"{NUMBER}"', literal)


def taken(text: str, as_bytes: bool) -> list[Any]:
    """The requests the edge would take from a frame's text (none: refused)."""
    try:
        data = load_json(text.encode() if as_bytes else text)
        frame = validate_now(data)
    except (BadFrame, InvalidRequest):
        return []
    if data["type"] == "submit":
        return [frame.request]
    _, adapter = BATCHES["submit_many"]  # (a big frame's items, one at a time)
    return [*frame.requests, *(adapter.validate_python(item) for item in data["requests"])]


@settings(max_examples=300)
@given(st.lists(requests(), min_size=1, max_size=3), st.booleans(), st.booleans(),
       st.sampled_from(LITERALS), st.integers(0, 1 << 62), st.none() | TEXT)
@example([{"requestId": "r", "createdAt": "1970-01-01T00:00:00z", "agentId": "a",
           "kind": "hook_trigger", "payload": {"x": NUMBER, "é": "ü"}}],
         False, True, "1e-400", 0, None)
def test_whatever_the_edge_lets_through_reads_back_as_the_same_event(
        items: list[dict[str, Any]], ascii_only: bool, as_bytes: bool, literal: str,
        at: int, principal: str | None) -> None:
    frame: dict[str, Any] = ({"type": "submit", "request": items[0]} if len(items) == 1
                             else {"type": "submit_many", "requests": items})
    for request in taken(frame_text(frame, ascii_only, literal), as_bytes):
        event = RequestReceived(at=at, request=request, principal=principal)
        assert reads_back(event)
        again = round_trip(event)
        assert again == event and first_difference(event, again) is None
