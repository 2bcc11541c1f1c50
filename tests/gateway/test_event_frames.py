"""Event frames built from the stored JSON, and `events` frames cut by count and size."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.edge.protocol import EVENTS_PER_FRAME, EventFrame, EventsFrame
from gateway.edge.views import FRAME_TEXT_BUDGET, event_frame_text, events_frames
from store.port import RecordedEvent

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12)


# Stored data is JSON as pydantic writes it (NaN and infinities become null) or as an import
# checked it (refused): never the non-standard NaN or Infinity a browser cannot parse.


def record(position: int, data: str = "{}", stream: str = "btc") -> RecordedEvent:
    return RecordedEvent(position, stream, position, f"e{position}", "RequestReceived", data,
                         1_771_297_800_000 + position)


@given(stream=st.text(min_size=1, max_size=40), kind=st.text(min_size=1, max_size=40),
       data=st.dictionaries(st.text(), JSON, max_size=5), compact=st.booleans())
def test_an_event_frame_text_is_the_model_s_json(stream: str, kind: str,
                                                 data: dict[str, object],
                                                 compact: bool) -> None:
    stored = json.dumps(data, ensure_ascii=False,
                        separators=(",", ":") if compact else None)
    event = RecordedEvent(7, stream, 3, "e7", kind, stored, 1_771_297_800_123)
    text = event_frame_text(event)
    model = EventFrame(position=7, stream=stream, version=3, event_type=kind, data=data,
                       recorded_at=1_771_297_800_123)
    assert json.loads(text) == json.loads(model.model_dump_json())
    assert EventFrame.model_validate_json(text) == model


def strict(text: str) -> object:
    """JSON as a browser reads it: NaN and Infinity are errors."""
    def refuse(constant: str) -> object:
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_nan_and_infinity_stored_by_an_old_import_go_out_as_null() -> None:
    stored = '{"x":NaN,"y":-Infinity,"s":"NaN and Infinity stay text","n":[1,Infinity]}'
    frame = strict(event_frame_text(record(3, stored)))
    assert isinstance(frame, dict)
    assert frame["data"] == {"x": None, "y": None, "s": "NaN and Infinity stay text",
                             "n": [1, None]}
    named = strict(event_frame_text(record(4, '{"s":"Infinity"}')))  # text naming them
    assert isinstance(named, dict) and named["data"] == {"s": "Infinity"}


def test_data_that_is_not_a_json_object_is_refused() -> None:
    for bad in ('{"cut": ', "[1, 2]", "null"):
        with pytest.raises(ValueError, match=r"Expecting value|not a JSON object"):
            event_frame_text(record(5, bad))


def test_events_frames_hold_every_event_in_order_cut_by_count() -> None:
    texts = [event_frame_text(record(n)) for n in range(1, 2 * EVENTS_PER_FRAME + 2)]
    frames = [EventsFrame.model_validate_json(f) for f in events_frames(texts)]
    assert [len(f.events) for f in frames] == [EVENTS_PER_FRAME, EVENTS_PER_FRAME, 1]
    assert [e.position for f in frames for e in f.events] == list(range(1, len(texts) + 1))
    assert list(events_frames([])) == []


def test_events_frames_are_cut_by_size_and_a_big_event_goes_alone() -> None:
    big = json.dumps({"note": "x" * (FRAME_TEXT_BUDGET // 3)})
    huge = json.dumps({"note": "y" * (FRAME_TEXT_BUDGET + 1)})
    texts = [event_frame_text(record(n, big)) for n in range(1, 6)]
    texts.insert(2, event_frame_text(record(99, huge)))
    frames = list(events_frames(texts))
    assert [len(EventsFrame.model_validate_json(f).events) for f in frames] == [2, 1, 2, 1]
    assert all(len(f) < FRAME_TEXT_BUDGET + 100 for f in frames if "yyy" not in f)
