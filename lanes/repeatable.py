"""Inputs sure to read back from the log exactly as they were given, by construction.

The log takes an input only if what is stored decodes back to the same event
(`lanes.codec.Codec.encode_checked`). Checking that by encoding, decoding and comparing costs
about ten times the encoding alone, for every request. A request that validation built from
JSON text (`AgentRequest`, as the edge parses every frame) holds only values that JSON carries
exactly: it is known to read back equal from the types of its parts, without the round trip.
`reads_back` says so for such an input, from its parts alone (their exact types, and the
wire model's rules checked again: lengths, patterns, what a payload needs for its kind), so
it holds however the request was built; and says "not known" for anything else (a subclass,
a value of another type, a string with a lone surrogate, a date-time in a named time zone, a
request built without validation that breaks a rule...), which is then checked by the round
trip as before. The property tests in
``tests/lanes/test_repeatable.py`` hold it to its word: whenever it says yes, the round trip
gives back an equal event.

A request just parsed from JSON text by the wire model (`lanes.parse_request`, as the edge
parses each frame and body) is known to read back without even that look (the property tests
``test_every_request_parsed_from_a_frame_is_known_to_read_back_and_does``, and
``tests/gateway/test_edge_reads_back.py`` through the edge's own parser and frame models):
whoever parsed it, and holds it alone, may say so (``parsed`` of
`gateway.runtime.intake.Intake.take`), and then only the parts its event adds are looked at
(`wrapper_reads_back`).
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any, Final

from pydantic_core import TzInfo

from lanes.events import RequestReceived
from lanes.requests import (
    _SURROGATE,
    IF_BUSY,
    MAX_INT,
    MIN_INT,
    AgentRequest,
    Kind,
    Priority,
    in_range,
    payload_problem,
    plain_json,
)

_TEXTS: Final = ("request_id", "agent_id", "dedupe_key", "message_id", "source")
"""The AgentRequest fields that are strings (or None)."""
KNOWN_FIELDS: Final = frozenset({*_TEXTS, "created_at", "kind", "priority", "payload",
                                 "if_busy"})
"""Every AgentRequest field `request_reads_back` looks at (a test keeps it to the model's)."""


def _limits(name: str) -> tuple[int, int | None, re.Pattern[str] | None]:
    """The shortest and longest value of a string field of the wire model, and its pattern
    (read from the model, so that the two never disagree)."""
    low, high, pattern = 0, None, None
    for rule in AgentRequest.model_fields[name].metadata:
        low = getattr(rule, "min_length", None) or low
        high = getattr(rule, "max_length", None) or high
        given = getattr(rule, "pattern", None)
        if given is not None:
            pattern = re.compile(str(given).removeprefix("^").removesuffix("$"))
    return low, high, pattern


_LIMITS: Final = {name: _limits(name) for name in _TEXTS}


def text_reads_back(value: Any) -> bool:
    """Whether ``value`` is a plain string that JSON carries exactly (no lone surrogate)."""
    return type(value) is str and (value.isascii() or _SURROGATE.search(value) is None)


def _timestamp(value: Any) -> bool:
    """A date-time stored as ISO 8601 and parsed back to an equal one: an aware `datetime`
    (not a subclass) with a fixed offset of whole minutes, from 1970 to 9999 (UTC)."""
    if type(value) is not datetime or type(value.tzinfo) not in (TzInfo, timezone):
        return False
    offset = value.utcoffset()
    if offset is None or offset.seconds % 60 or offset.microseconds:
        return False
    return in_range(value)


def request_reads_back(request: AgentRequest) -> bool:
    """Whether ``request`` is known to be stored and read back equal (False: not known)."""
    if type(request) is not AgentRequest:
        return False
    fields = request.__dict__
    if request.__pydantic_extra__ or request.__pydantic_private__:
        return False
    for name, (low, high, pattern) in _LIMITS.items():
        value = fields[name]
        if value is None:
            continue
        if not text_reads_back(value) or len(value) < low \
                or (high is not None and len(value) > high) \
                or (pattern is not None and pattern.fullmatch(value) is None):
            return False
    if_busy = fields["if_busy"]
    if if_busy is not None and (type(if_busy) is not str or if_busy not in IF_BUSY):
        return False
    kind, payload = fields["kind"], fields["payload"]
    # (the payload is checked whole again: it is the one part that is not immutable)
    return (type(kind) is Kind and type(fields["priority"]) is Priority
            and _timestamp(fields["created_at"]) and type(payload) is dict
            and plain_json(payload, 0) and payload_problem(kind, payload) is None)


def wrapper_reads_back(event: RequestReceived) -> bool:
    """Whether the parts a `RequestReceived` adds to its request (its time, its principal)
    are known to be stored and read back equal."""
    at, principal = event.at, event.principal
    return (type(at) is int and MIN_INT <= at <= MAX_INT
            and (principal is None or text_reads_back(principal)))


def received_reads_back(event: RequestReceived) -> bool:
    """Whether a `RequestReceived` is known to be stored and read back equal."""
    return wrapper_reads_back(event) and request_reads_back(event.request)


READS_BACK: Final = {RequestReceived: received_reads_back}
"""The input types whose events may be known to read back, and how to tell."""


def reads_back(event: Any) -> bool:
    """Whether ``event`` is known to be stored and read back equal, from the types of its
    parts (False: not known; check it by the round trip)."""
    check = READS_BACK.get(type(event))
    return check is not None and check(event)
