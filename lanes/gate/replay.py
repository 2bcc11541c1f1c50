"""The provider gate's stream: its codec, and `verify_gate`, which re-decides a recorded
stream."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from lanes.codec import Codec
from lanes.gate.decide import decide_gate
from lanes.gate.events import (
    GATE_DECISION_TYPES,
    GATE_INPUT_TYPES,
    GateDecision,
    GateEvent,
    SlotQueued,
    SlotRequested,
)
from lanes.gate.repeatable import gate_input_reads_back
from lanes.gate.state import GateState

GATE_CODEC: Codec[GateEvent] = Codec(
    GATE_INPUT_TYPES + GATE_DECISION_TYPES, reads_back=gate_input_reads_back,
    written_when_set={SlotRequested: (("weight", 1),), SlotQueued: (("weight", 1),)})
"""The gate's codec; an agent's weight is stored only when it is not 1 (logs written before
weights existed read and re-record as they were). Inputs known to read back equal
(`gate_input_reads_back`) are spared the round trip of `Codec.encode_checked`."""
GATE_EVENT_TYPES = GATE_CODEC.types
encode_gate_event = GATE_CODEC.encode
decode_gate_event = GATE_CODEC.decode


@dataclass(frozen=True, slots=True)
class GateDivergence:
    """The first place where re-deciding a gate's recorded inputs disagrees with its log."""

    index: int
    """Index of the event in the stream (0-based)."""
    input: GateEvent | None
    recorded: GateEvent | None
    redecided: GateDecision | None


def verify_gate(provider: str, events: Iterable[GateEvent]) -> GateDivergence | None:
    """Re-run `decide_gate` over a gate stream's recorded inputs; the first disagreement."""
    state = GateState(provider=provider)
    expected: deque[GateDecision] = deque()
    last_input: GateEvent | None = None
    index = -1
    for index, event in enumerate(events):
        if isinstance(event, GATE_INPUT_TYPES):
            if expected:
                return GateDivergence(index, last_input, event, expected[0])
            last_input = event
            expected.extend(decide_gate(state, event))
            continue
        redecided = expected.popleft() if expected else None
        if redecided != event:
            return GateDivergence(index, last_input, event, redecided)
    if expected:
        return GateDivergence(index + 1, last_input, None, expected[0])
    return None
