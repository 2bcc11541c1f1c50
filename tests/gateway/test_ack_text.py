"""An ack's text on the wire: written out for a plain ack, the model's text whatever the ack."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from gateway.edge.answers import ack_frame, ack_text, acks_text, market_ack_text
from gateway.edge.protocol import AckFrame, AcksFrame, ErrorFrame, MarketAck
from gateway.runtime.acks import Ack
from gateway.runtime.effects import ControlEffect
from lanes.vocabulary import TradingState

TEXTS = st.text() | st.sampled_from(["r-1", 'a"b', "a\\b", "é", "tab\there", "\x7f", "😀"])
STATES = st.sampled_from(TradingState)
EFFECTS = st.none() | st.builds(
    lambda before, after, changed: ControlEffect.model_validate(
        {"fromState": before, "toState": after, "changed": changed}),
    STATES, STATES, st.booleans())


def _said(make: Any) -> tuple[str, str]:
    try:
        return "text", make()
    except Exception as error:  # (both ways refuse the same acks: a lone surrogate, say)
        return "error", type(error).__name__


@given(request_id=TEXTS, decision=st.sampled_from(["accepted", "deduped", "dropped",
                                                   "rejected", "other"]),
       position=st.integers(), reason=st.none() | TEXTS, repeated=st.booleans(),
       effect=EFFECTS, id=st.none() | TEXTS)
@example(request_id="r1", decision="accepted", position=7, reason=None, repeated=False,
         effect=None, id=None)
@example(request_id="r1", decision="accepted", position=7, reason=None, repeated=True,
         effect=None, id="f 1")
def test_an_acks_text_is_its_frames_text(request_id: str, decision: str, position: int,
                                         reason: str | None, repeated: bool,
                                         effect: ControlEffect | None, id: str | None) -> None:
    ack = Ack(request_id, decision, position, reason, repeated, effect)
    assert _said(lambda: ack_text(ack, id)) == _said(
        lambda: ack_frame(ack, id).model_dump_json(exclude_none=True))


ACKS = st.builds(Ack, TEXTS, st.sampled_from(["accepted", "deduped", "dropped", "rejected"]),
                 st.integers(), st.none() | TEXTS, st.booleans(), EFFECTS)
ERRORS = st.builds(ErrorFrame, code=TEXTS, message=TEXTS, request_id=st.none() | TEXTS,
                   field=st.none() | TEXTS)


def _frame_of(result: Ack | ErrorFrame) -> AckFrame | ErrorFrame:
    return ack_frame(result) if isinstance(result, Ack) else result


@given(results=st.lists(ACKS | ERRORS, max_size=5), id=st.none() | TEXTS)
@example(results=[], id=None)
def test_a_frame_of_acks_is_written_as_its_model_writes_it(
        results: list[Ack | ErrorFrame], id: str | None) -> None:
    """A `SubmitMany`'s answer (`acks_text`) and a market frame's (`market_ack_text`)."""
    assert _said(lambda: acks_text(results, id)) == _said(
        lambda: AcksFrame(id=id, results=[_frame_of(r) for r in results]).model_dump_json(
            exclude_none=True))
    assert _said(lambda: market_ack_text(len(results) * 3, results, id)) == _said(
        lambda: MarketAck(id=id, events=len(results) * 3,
                          triggered=[_frame_of(r) for r in results]).model_dump_json(
            exclude_none=True))
