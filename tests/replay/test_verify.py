"""Verify: the first divergence, found in log order or stream by stream, is the same."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lanes.events import RequestQueued
from lanes.replay import Divergence, Entry, Verifier, first, verify
from tests.replay.test_golden import NAMES, golden


def by_stream(log: list[Entry]) -> Divergence | None:
    streams: dict[str, list[Entry]] = {}
    for entry in log:
        streams.setdefault(entry.stream, []).append(entry)
    found = []
    for entries in streams.values():
        verifier = Verifier()
        verifier.feed(entries)
        found.append(verifier.finish())
    return first(found)


def tamperings(log: list[Entry]) -> list[list[Entry]]:
    """The log spoiled in a few ways: a decision changed, one lost, a stream cut short."""
    queued = [i for i, e in enumerate(log) if isinstance(e.event, RequestQueued)]
    spoiled = []
    for index in queued[:: max(1, len(queued) // 4)]:
        event = log[index].event
        assert isinstance(event, RequestQueued)
        changed = RequestQueued(request_id=event.request_id + "x", mode=event.mode)
        spoiled.append([*log[:index], replace(log[index], event=changed), *log[index + 1:]])
        spoiled.append([*log[:index], *log[index + 1:]])
        spoiled.append(log[:index])
    return spoiled


@pytest.mark.parametrize("name", NAMES)
def test_stream_by_stream_and_in_order_find_the_same_first_divergence(name: str) -> None:
    log = golden(name)
    assert verify(log) is None and by_stream(log) is None
    for spoiled in tamperings(log):
        in_order = verify(spoiled)
        assert in_order is not None
        assert by_stream(spoiled) == in_order


def test_a_decision_missing_at_the_end_is_reported_where_it_should_be() -> None:
    log = golden("desk")
    last_input = max(i for i, e in enumerate(log) if hasattr(e.event, "at"))
    cut = log[: last_input + 1]  # the last input, without its decisions
    divergence = verify(cut)
    assert divergence is not None
    assert divergence.recorded is None and divergence.redecided is not None
    assert divergence.position == cut[-1].position + 1
    assert divergence.input_position == cut[-1].position
