"""The gate's doorway shortcut: an input `gate_input_reads_back` knows to read back is stored
without the round trip, so whenever it says so, the round trip must give it back equal."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lanes.codec import Unrepeatable
from lanes.gate import GATE_CODEC
from lanes.gate.events import (
    CallOutcome,
    GateInput,
    GateTimer,
    SlotCancelled,
    SlotReleased,
    SlotRequested,
)
from lanes.gate.repeatable import gate_input_reads_back
from lanes.requests import MAX_INT, MIN_INT, Priority


def _mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]
            ) -> st.SearchStrategy[Any]:
    """Usually a good value, now and then a bad one: most events then have at most one
    field the round trip may change, which is what the shortcut must notice."""
    return st.one_of(good, good, good, good, good, bad)


TEXTS = _mostly(st.text(max_size=6), st.lists(
    st.characters() | st.characters(categories=["Cs"]), max_size=6).map("".join))
"""Any code points, now and then lone surrogates."""
INTS = _mostly(st.integers(MIN_INT, MAX_INT),
               st.integers(-(1 << 70), 1 << 70) | st.booleans() | st.floats(allow_nan=False))
"""Numbers the round trip may or may not give back: huge ones, bools, floats."""
COUNTS = _mostly(st.integers(0, MAX_INT), st.integers(-5, -1) | st.integers(MAX_INT, 1 << 65)
                 | st.booleans() | st.floats(0, 10))


def _maybe(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | values


# (Built unvalidated, as code could: the dataclasses take any value.)
INPUTS: st.SearchStrategy[Any] = st.one_of(
    st.builds(SlotRequested, at=INTS, slot_id=TEXTS, agent_id=TEXTS, run_id=TEXTS,
              priority=_mostly(st.sampled_from(Priority), st.sampled_from(["normal", 1])),
              input_tokens=COUNTS, output_tokens=COUNTS,
              weight=_mostly(st.integers(1, 1_000), st.integers(-1, 0)
                             | st.integers(1_001, 1_002) | st.booleans())),
    st.builds(SlotReleased, at=INTS, slot_id=TEXTS,
              outcome=_mostly(st.sampled_from(CallOutcome), st.sampled_from(["ok", "nope"])),
              input_tokens=_maybe(COUNTS), output_tokens=_maybe(COUNTS),
              retry_after_ms=_maybe(COUNTS), remaining_requests=_maybe(COUNTS),
              remaining_tokens=_maybe(COUNTS), reset_at=_maybe(INTS)),
    st.builds(GateTimer, at=INTS),
    st.builds(SlotCancelled, at=INTS, slot_id=TEXTS),
)


def round_trip(event: Any) -> Any:
    return GATE_CODEC.decode(*GATE_CODEC.encode(event))


@settings(max_examples=1000)
@given(INPUTS)
@example(SlotRequested(at=1 << 63, slot_id="s1", agent_id="a", run_id="r"))
@example(SlotRequested(at=1, slot_id="s1", agent_id="a", run_id="r", weight=True))
@example(SlotReleased(at=1, slot_id="s1", outcome=CallOutcome.OK, input_tokens=-1))
@example(SlotRequested(at=1, slot_id="s1", agent_id="a", run_id="r", output_tokens=-1))
def test_whatever_it_says_reads_back_does_read_back_equal(event: GateInput) -> None:
    if not gate_input_reads_back(event):
        return  # not known: the round trip decides, as before
    again = round_trip(event)
    assert again == event and type(again) is type(event)


@pytest.mark.parametrize("event", [
    SlotRequested(at=1_771_297_800_000, slot_id="s-1", agent_id="btc", run_id="btc-r1",
                  priority=Priority.HIGH, input_tokens=2_050, output_tokens=982, weight=2),
    SlotReleased(at=1_771_297_801_546, slot_id="s-1", outcome=CallOutcome.RATE_LIMITED,
                 input_tokens=2_602, output_tokens=0, retry_after_ms=1_000,
                 remaining_requests=0, remaining_tokens=None, reset_at=1_771_297_860_000),
    GateTimer(at=1_771_297_860_000),
    SlotCancelled(at=1_771_297_860_000, slot_id="s-1"),
])
def test_the_live_gates_inputs_are_only_encoded(event: GateInput) -> None:
    assert gate_input_reads_back(event)
    assert GATE_CODEC.encode_checked(event) == GATE_CODEC.encode(event)


def test_what_is_not_known_still_takes_the_round_trip_and_is_refused_if_it_changes() -> None:
    event = SlotRequested(at=1, slot_id="s1", agent_id="a", run_id="r", input_tokens=-1)
    assert not gate_input_reads_back(event)
    with pytest.raises(Unrepeatable, match="would not read back"):
        GATE_CODEC.encode_checked(event)
    lone = SlotCancelled(at=1, slot_id="s\ud800")
    assert not gate_input_reads_back(lone)
    with pytest.raises(Unrepeatable, match="cannot be written"):
        GATE_CODEC.encode_checked(lone)
