"""The gate's inputs sure to read back from its stream exactly as they were given, by
construction (as `lanes.repeatable` for an agent's): `gate_input_reads_back` spares the live
gate the encode-decode-compare round trip of every slot request, release, cancel and timer
(about 2.5 us each, three inputs a slot) when the types and ranges of their fields alone say
that the round trip gives them back equal. Anything else ("not known": another type, a bool
for an int, a string with a lone surrogate, a number JSON or the model would not take back)
is checked by the round trip as before. ``tests/lanes/test_gate_repeatable.py`` holds it to
its word."""

from __future__ import annotations

from typing import Any

from lanes.config import MAX_GATE_WEIGHT
from lanes.gate.events import (
    CallOutcome,
    GateTimer,
    SlotCancelled,
    SlotReleased,
    SlotRequested,
)
from lanes.repeatable import text_reads_back as _text
from lanes.requests import MAX_INT, MIN_INT, Priority


def _int(value: Any) -> bool:
    return type(value) is int and MIN_INT <= value <= MAX_INT


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_INT


def _count_or_none(value: Any) -> bool:
    return value is None or _count(value)


def gate_input_reads_back(event: Any) -> bool:
    """Whether a gate input is known to be stored and read back equal (False: not known)."""
    kind = type(event)
    if kind is SlotRequested:
        return (_int(event.at) and _text(event.slot_id) and _text(event.agent_id)
                and _text(event.run_id) and type(event.priority) is Priority
                and _count(event.input_tokens) and _count(event.output_tokens)
                and type(event.weight) is int and 1 <= event.weight <= MAX_GATE_WEIGHT)
    if kind is SlotReleased:
        return (_int(event.at) and _text(event.slot_id) and type(event.outcome) is CallOutcome
                and _count_or_none(event.input_tokens) and _count_or_none(event.output_tokens)
                and _count_or_none(event.retry_after_ms)
                and _count_or_none(event.remaining_requests)
                and _count_or_none(event.remaining_tokens)
                and (event.reset_at is None or _int(event.reset_at)))
    if kind is GateTimer:
        return _int(event.at)
    if kind is SlotCancelled:
        return _int(event.at) and _text(event.slot_id)
    return False
