"""The group-commit planner on its own: no database, no loop running, just what a batch
writes and what each append resolves to."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from store import Append, ConcurrencyError, DuplicateEventError, Fence, FencedError, NewEvent
from store.batch import (
    LeaseRow,
    Pending,
    fence_failures,
    plan_batch,
    settle_deferred,
    unseen_ids,
)
from store.port import RecordedEvent


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def pending(loop: asyncio.AbstractEventLoop, stream: str, *ids: str,
            expected: int | None = None, fence: Fence | None = None) -> Pending:
    events = tuple(NewEvent(i, "T", "{}") for i in ids)
    return Pending(Append(stream, events, expected, fence=fence), events, loop.create_future())


def test_appends_to_one_stream_see_the_versions_earlier_ones_produce(
        loop: asyncio.AbstractEventLoop) -> None:
    batch = [pending(loop, "a", "1", "2", expected=3), pending(loop, "a", "3", expected=5),
             pending(loop, "b", "4", expected=0)]
    plan = plan_batch(batch, {"a": 3, "b": 0}, {}, {}, now=7, position=10)
    assert [(r.position, r.stream, r.version, r.event_id) for r in plan.rows] == [
        (11, "a", 4, "1"), (12, "a", 5, "2"), (13, "a", 6, "3"), (14, "b", 1, "4")]
    assert plan.versions == {"a": 6, "b": 1} and plan.position == 14
    assert not plan.deferred and all(isinstance(o, list) for o in plan.final())


def test_a_wrong_version_is_set_aside_and_becomes_a_conflict_when_no_id_is_stored(
        loop: asyncio.AbstractEventLoop) -> None:
    batch = [pending(loop, "a", "1", expected=2), pending(loop, "b", "2", expected=0)]
    plan = plan_batch(batch, {"a": 0, "b": 0}, {}, {}, now=0, position=0)
    assert [r.event_id for r in plan.rows] == ["2"]
    assert unseen_ids(batch, plan) == ["1"]
    settle_deferred(batch, plan, {})
    outcome = plan.final()[0]
    assert isinstance(outcome, ConcurrencyError)


def test_a_retry_of_stored_events_resolves_to_them_and_a_partial_one_is_a_duplicate(
        loop: asyncio.AbstractEventLoop) -> None:
    stored = {"1": RecordedEvent(1, "a", 1, "1", "T", "{}", 0)}
    batch = [pending(loop, "a", "1", expected=0), pending(loop, "a", "1", "9", expected=0)]
    plan = plan_batch(batch, {"a": 1}, {}, {}, now=0, position=1)
    settle_deferred(batch, plan, stored)
    retried, partial = plan.final()
    assert retried == [stored["1"]]
    assert isinstance(partial, DuplicateEventError)
    assert plan.rows == []


def test_a_fence_holds_only_for_its_owner_at_its_epoch_while_its_member_lease_lives() -> None:
    rows = {"s": LeaseRow("s", "m1", 2, 0), "member:m1": LeaseRow("member:m1", "m1", 0, 100)}
    fences = [(0, "s", Fence("m1", 2)), (1, "s", Fence("m1", 1)), (2, "s", Fence("m2", 2))]
    failed = fence_failures(fences, 50, rows)
    assert sorted(failed) == [1, 2] and all(isinstance(f, FencedError) for f in failed.values())
    assert sorted(fence_failures(fences, 100, rows)) == [0, 1, 2]  # m1's lease ran out
