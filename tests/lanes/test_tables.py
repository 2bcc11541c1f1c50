"""The rule tables cover what they rule over: every queue mode, every breaker state."""

from __future__ import annotations

import pytest

from lanes.config import Mode
from lanes.gate.events import CallOutcome, lease_too_short
from lanes.gate.tables import BREAKER_TRANSITIONS, OPENS_BREAKER, Breaker
from lanes.tables import MODES


def test_every_mode_has_a_rule() -> None:
    assert set(MODES) == set(Mode)


@pytest.mark.parametrize("mode", [m for m in Mode if MODES[m].interrupts])
def test_a_mode_that_interrupts_says_why_a_request_follows_up(mode: Mode) -> None:
    assert MODES[mode].follows_up


def test_only_queue_keeps_strict_arrival_order_and_only_collect_batches() -> None:
    assert [m for m in Mode if MODES[m].arrival_order] == [Mode.QUEUE]
    assert [m for m in Mode if MODES[m].collects] == [Mode.COLLECT]


def test_every_breaker_state_can_be_left_and_reached() -> None:
    assert {src for src, _ in BREAKER_TRANSITIONS} == set(Breaker)
    assert set(BREAKER_TRANSITIONS.values()) == set(Breaker)


def test_an_ok_answer_never_opens_the_breaker() -> None:
    assert CallOutcome.OK not in OPENS_BREAKER


def test_a_slot_lease_must_outlive_the_run_timeout() -> None:
    assert lease_too_short(120_001, 120_000, "a", "p") is None
    message = lease_too_short(120_000, 120_000, "a", "p")
    assert message is not None and "run timeout of agent 'a' (120000 ms)" in message
