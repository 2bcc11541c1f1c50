"""The doorway check's shortcut: an input `lanes.repeatable` knows to read back is stored
without the round trip, so whenever it says so, the round trip must give it back equal."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from enum import IntEnum
from typing import Any

import pydantic_core
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lanes import AgentRequest, InvalidRequest, parse_request
from lanes.codec import AGENT_CODEC, Unrepeatable, first_difference
from lanes.events import RequestReceived
from lanes.repeatable import KNOWN_FIELDS, reads_back
from lanes.requests import Kind, Priority, _json_problem, plain_json


class Small(IntEnum):
    ONE = 1


class Text(str):
    """A string of another type: it reads back as a plain one."""


ANY_TEXT = st.lists(st.characters() | st.characters(categories=["Cs"]), max_size=8).map("".join)
"""Any code points, lone surrogates included."""
WIRE_TEXT = st.text(max_size=8)
"""What JSON text can carry (no lone surrogates)."""
OFFSETS = st.integers(-(23 * 60 + 59), 23 * 60 + 59).map(
    lambda minutes: timezone(timedelta(minutes=minutes)))
"""Fixed UTC offsets of whole minutes, as ISO 8601 writes them."""


def json_values(text: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """JSON-shaped values."""
    return st.recursive(
        st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 63) - 1)
        | st.floats(allow_nan=False, allow_infinity=False) | text,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
        max_leaves=12)


ODD_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT
    | st.just(Small.ONE) | st.builds(Text, ANY_TEXT) | st.just(b"bytes"),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(ANY_TEXT | st.integers(), inner, max_size=3),
    max_leaves=10)
"""Values a Python caller could put in a request without validation."""


@st.composite
def wire_requests(draw: st.DrawFn) -> dict[str, Any]:
    """A request's JSON object as a client would send it."""
    minutes = draw(st.integers(-(23 * 60 + 59), 23 * 60 + 59))
    created = draw(st.datetimes(min_value=datetime(1970, 1, 2),
                                max_value=datetime(9998, 12, 30),
                                timezones=st.just(timezone(timedelta(minutes=minutes)))))
    data: dict[str, Any] = {
        "requestId": draw(st.text(min_size=1, max_size=20)),
        "createdAt": created.isoformat().replace("+00:00", draw(st.sampled_from(["Z",
                                                                                "+00:00"]))),
        "agentId": draw(st.from_regex(r"\A[A-Za-z0-9_.\-]{1,12}\Z")),
        "kind": draw(st.sampled_from(["hook_trigger", "scheduled_audit", "system_alert"])),
        "payload": draw(st.dictionaries(WIRE_TEXT, json_values(WIRE_TEXT), max_size=4)),
    }
    for key, values in (("priority", st.sampled_from(["high", "normal", "low"])),
                        ("dedupeKey", st.text(min_size=1, max_size=20)),
                        ("messageId", st.text(min_size=1, max_size=20)),
                        ("source", WIRE_TEXT)):
        if draw(st.booleans()):
            data[key] = draw(values)
    return data


def round_trip(event: Any) -> Any:
    name, text = AGENT_CODEC.encode(event)
    return AGENT_CODEC.decode(name, text)


@settings(max_examples=300)
@given(wire_requests(), st.integers(0, 1 << 62), st.none() | WIRE_TEXT)
def test_every_request_parsed_from_a_frame_is_known_to_read_back_and_does(
        data: dict[str, Any], at: int, principal: str | None) -> None:
    # As the edge parses a frame: strict JSON text, then validation.
    try:
        request = parse_request(pydantic_core.from_json(json.dumps(data), allow_inf_nan=False))
    except InvalidRequest:
        return  # (a value the wire model refuses: never stored at all)
    event = RequestReceived(at=at, request=request, principal=principal)

    assert reads_back(event)
    again = round_trip(event)
    assert again == event and first_difference(event, again) is None


PARTS = ("kind", "payload", "message", "request_id", "created_at", "agent_id", "priority",
         "dedupe_key", "message_id", "source", "at", "principal")
"""The parts of a built request, in the order `built_requests` draws them."""


@st.composite
def built_requests(draw: st.DrawFn) -> RequestReceived:
    """A request built without validation, as any Python caller could: each part is most
    often what a frame gives, else something odd (another type, a named time zone, NaN, a
    lone surrogate, a number or a date out of range, a broken rule of the wire model)."""

    odd_one = draw(st.sampled_from([None, *PARTS]))  # one odd part: the rest is usual

    def part(usual: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> Any:
        name = PARTS[len(drawn)]
        drawn.append(name)
        return draw(odd if name == odd_one else usual)

    drawn: list[str] = []

    kind = part(st.sampled_from([Kind.HOOK_TRIGGER, Kind.SYSTEM_ALERT]),
                st.sampled_from([*Kind, "hook_trigger"]))
    payload = part(st.dictionaries(WIRE_TEXT, json_values(WIRE_TEXT), max_size=4),
                   st.dictionaries(ANY_TEXT | st.integers(), ODD_VALUES, max_size=4)
                   | st.builds(type("Payload", (dict,), {}),
                               st.dictionaries(WIRE_TEXT, json_values(WIRE_TEXT),
                                               max_size=2)))
    message = part(st.just("hi"), st.just(7))
    if kind == Kind.USER_CONTROL and isinstance(payload, dict):
        payload = {**payload, "message": message}
    request = AgentRequest.model_construct(
        request_id=part(st.text(min_size=1, max_size=8),
                        ANY_TEXT | st.builds(Text, ANY_TEXT)
                        | st.text(min_size=127, max_size=129)),
        created_at=part(
            st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(9998, 12, 30),
                         timezones=OFFSETS),
            st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                         timezones=st.one_of(
                             st.none(), st.timezones(), st.builds(timezone, st.timedeltas(
                                 min_value=-timedelta(hours=23),
                                 max_value=timedelta(hours=23)))))),
        agent_id=part(st.from_regex(r"\A[A-Za-z0-9_.\-]{1,12}\Z"),
                      st.sampled_from(["a b", "a1\n", "x" * 64, "x" * 65, ""])),
        kind=kind,
        priority=part(st.sampled_from(Priority), st.just("low")),
        dedupe_key=part(st.none() | st.text(min_size=1, max_size=8), ANY_TEXT),
        message_id=part(st.none(), st.just("") | ANY_TEXT),
        source=part(st.none() | WIRE_TEXT, ANY_TEXT | st.text(min_size=256, max_size=257)),
        payload=payload)
    return RequestReceived(at=part(st.integers(0, 1 << 62), st.integers() | st.booleans()),
                           request=request, principal=part(st.none() | WIRE_TEXT, ANY_TEXT))


@settings(max_examples=1000)
@given(built_requests())
def test_whatever_it_says_reads_back_does_read_back_equal(event: RequestReceived) -> None:
    if not reads_back(event):
        return  # not known: the round trip decides, as before
    again = round_trip(event)
    assert again == event and first_difference(event, again) is None


def test_what_is_not_known_still_takes_the_round_trip_and_is_refused_if_it_changes() -> None:
    request = AgentRequest.model_construct(
        request_id="r1", created_at=datetime(2026, 2, 17, tzinfo=UTC), agent_id="a1",
        kind=Kind.HOOK_TRIGGER, priority=Priority.NORMAL, dedupe_key=None, message_id=None,
        source=None, payload={"pair": ("BTC", "USD")})  # a tuple reads back as a list
    event = RequestReceived(at=1, request=request)

    assert not reads_back(event)
    with pytest.raises(Unrepeatable) as refused:
        AGENT_CODEC.encode_checked(event)
    assert refused.value.field == "request.payload.pair"


def test_a_request_from_a_frame_is_only_encoded() -> None:
    request = parse_request({"requestId": "r1", "createdAt": "2026-02-17T03:10:00Z",
                             "agentId": "a1", "kind": "hook_trigger",
                             "payload": {"symbol": "BTCUSD", "n": [1, 2.5, None, True]}})
    event = RequestReceived(at=1, request=request, principal="feed")

    assert reads_back(event)
    assert AGENT_CODEC.encode_checked(event) == AGENT_CODEC.encode(event)


def test_it_looks_at_every_field_of_the_wire_model_and_of_the_input() -> None:
    # A field added to either must be taught to `lanes.repeatable` (or it is not known).
    assert set(AgentRequest.model_fields) == KNOWN_FIELDS
    assert set(RequestReceived.__dataclass_fields__) == {"at", "request", "principal"}


def a_request(**changes: Any) -> RequestReceived:
    fields: dict[str, Any] = {
        "request_id": "r1", "created_at": datetime(2026, 2, 17, tzinfo=UTC), "agent_id": "a1",
        "kind": Kind.HOOK_TRIGGER, "priority": Priority.NORMAL, "dedupe_key": None,
        "message_id": None, "source": None, "payload": {"n": 1}}
    at = changes.pop("at", 1)
    fields.update(changes)
    return RequestReceived(at=at, request=AgentRequest.model_construct(**fields))


@pytest.mark.parametrize("changes", [
    {"payload": {"n": float("nan")}}, {"payload": {"n": float("inf")}},
    {"payload": {"n": 1 << 63}}, {"payload": {"n": ("a", "b")}}, {"payload": {1: "a"}},
    {"payload": {"n": "\ud800"}}, {"payload": {"n": Small.ONE}}, {"payload": {"n": b"x"}},
    {"request_id": "r\udfff"}, {"request_id": ""}, {"request_id": "r" * 129},
    {"agent_id": "a b"}, {"agent_id": "a1\n"}, {"kind": "hook_trigger"},
    {"kind": Kind.USER_CONTROL}, {"created_at": datetime(2026, 2, 17)},
    {"created_at": datetime(1969, 12, 31, tzinfo=UTC)},
    {"created_at": datetime(2026, 2, 17, tzinfo=timezone(timedelta(seconds=30)))},
    {"at": True}, {"at": 1 << 64},
], ids=repr)
def test_what_a_person_would_try_first_is_not_known(changes: dict[str, Any]) -> None:
    assert reads_back(a_request())
    assert not reads_back(a_request(**changes))


@given(st.one_of(json_values(ANY_TEXT), ODD_VALUES))
def test_what_the_fast_json_check_takes_the_detailed_one_finds_nothing_wrong_with(
        value: Any) -> None:
    # Validation asks `plain_json` first and looks for a problem only when it says no: so
    # whatever it says yes to must have none (its no may be a subclass the detailed
    # check accepts; that case still goes through the detailed check).
    if plain_json(value):
        assert _json_problem(value, "payload", 0) is None


@pytest.mark.parametrize("depth", [31, 32, 33])
def test_both_json_checks_draw_the_depth_line_at_the_same_place(depth: int) -> None:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    value = {"a": value}
    assert plain_json(value) is (_json_problem(value, "payload", 0) is None)


def _near(edge: datetime, days: int) -> st.SearchStrategy[datetime]:
    return st.datetimes(min_value=edge - timedelta(days=days),
                        max_value=edge + timedelta(days=days), timezones=OFFSETS)


@given(_near(datetime(1970, 1, 1), 2) | _near(datetime(9999, 1, 1), 2)
       | _near(datetime(1971, 1, 1), 2) | _near(datetime(9998, 1, 1), 2)
       | st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 30),
                      timezones=OFFSETS))
@example(datetime(1970, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1))))  # 1969 in UTC
@example(datetime(9998, 12, 31, 23, 30, tzinfo=timezone(-timedelta(hours=1))))  # 9999
def test_a_created_at_is_taken_exactly_from_1970_to_9999_utc_whatever_its_offset(
        created: datetime) -> None:
    # The range check looks at the year alone away from the first and last years.
    data = {"requestId": "r1", "createdAt": created.isoformat(), "agentId": "a1",
            "kind": "hook_trigger"}
    inside = datetime(1970, 1, 1, tzinfo=UTC) <= created < datetime(9999, 1, 1, tzinfo=UTC)
    if inside:
        assert parse_request(data).created_at == created
    else:
        with pytest.raises(InvalidRequest):
            parse_request(data)
