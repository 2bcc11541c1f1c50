"""The group-commit writer's planning, pure: what a batch of appends writes and what each
append resolves to, given the versions and ids the writer looked up (see `store.writer`
for the I/O around it and the steps of a batch)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from .port import (
    MEMBER_PREFIX,
    Append,
    ConcurrencyError,
    DuplicateEventError,
    Fence,
    FencedError,
    NewEvent,
    RecordedEvent,
    RestoreError,
    StoreError,
)
from .schema import EVENT_ID_MAX, STREAM_MAX, TYPE_MAX


class LeaseRow(NamedTuple):
    """A row of the ``leases`` table."""

    resource: str
    owner: str | None
    epoch: int
    expires_at: int


Outcome = list[RecordedEvent] | StoreError
"""What an append resolves to: its recorded events, or why it was not written."""


class Pending:
    """One enqueued append with its validated events and its future."""

    __slots__ = ("append", "events", "future")

    def __init__(
        self,
        append: Append,
        events: tuple[NewEvent, ...],
        future: asyncio.Future[list[RecordedEvent]],
    ) -> None:
        self.append = append
        self.events = events
        self.future = future


class Deferred:
    """An append set aside during planning, decided once its ids are looked up."""

    __slots__ = ("index", "seen", "version")

    def __init__(self, index: int, version: int, seen: dict[str, RecordedEvent]) -> None:
        self.index = index
        self.version = version
        self.seen = seen


class Plan:
    """What one batch writes and what each of its appends resolves to (None: set aside in
    ``deferred``, decided by `settle_deferred`)."""

    __slots__ = ("deferred", "outcomes", "position", "rows", "versions")

    def __init__(
        self,
        rows: list[RecordedEvent],
        outcomes: list[Outcome | None],
        versions: dict[str, int],
        position: int,
        deferred: list[Deferred],
    ) -> None:
        self.rows = rows
        self.outcomes = outcomes
        self.versions = versions
        self.position = position
        self.deferred = deferred

    def final(self) -> list[Outcome]:
        """Each append's outcome (once the deferred ones are settled)."""
        return [o if o is not None else StoreError("append left undecided")
                for o in self.outcomes]


def plan_batch(
    batch: Sequence[Pending],
    cache: Mapping[str, int],
    known: dict[str, RecordedEvent],
    fenced: Mapping[int, FencedError],
    now: int,
    position: int,
) -> Plan:
    """Plan ``batch`` in order against the stream versions in ``cache`` (later appends to a
    stream see the versions earlier ones produce), after the last ``position``, recorded at
    ``now``. ``known`` holds ids known to be taken (updated with those the plan writes);
    ``fenced`` the appends whose fence does not hold, by index. An append whose expected
    version is wrong or whose ids are known is set aside."""
    versions: dict[str, int] = {}
    rows: list[RecordedEvent] = []
    outcomes: list[Outcome | None] = [None] * len(batch)
    deferred: list[Deferred] = []
    for index, pending in enumerate(batch):
        append = pending.append
        events = pending.events
        stream = append.stream
        if fenced and index in fenced:
            outcomes[index] = fenced[index]
            continue
        version = versions.get(stream)
        if version is None:
            version = cache[stream]
        expected = append.expected_version
        clash = False
        if known:
            for event in events:
                if event.event_id in known:
                    clash = True
                    break
        if clash or (expected is not None and expected != version):
            seen = {e.event_id: known[e.event_id] for e in events if e.event_id in known}
            deferred.append(Deferred(index, version, seen))
            continue
        recorded: list[RecordedEvent] = []
        for event in events:
            position += 1
            version += 1
            record = RecordedEvent(
                position, stream, version, event.event_id, event.type, event.data, now
            )
            recorded.append(record)
            known[event.event_id] = record
        rows += recorded
        versions[stream] = version
        outcomes[index] = recorded
    return Plan(rows, outcomes, versions, position, deferred)


def unseen_ids(batch: Sequence[Pending], plan: Plan) -> list[str]:
    """The ids of the appends set aside that are still to be looked up."""
    return [e.event_id for d in plan.deferred for e in batch[d.index].events
            if e.event_id not in d.seen]


def settle_deferred(batch: Sequence[Pending], plan: Plan,
                    stored: Mapping[str, RecordedEvent]) -> None:
    """Decide each append set aside, knowing the ``stored`` events of its ids."""
    for d in plan.deferred:
        plan.outcomes[d.index] = decide_deferred(batch[d.index], d, stored)


def decide_deferred(pending: Pending, d: Deferred,
                    stored: Mapping[str, RecordedEvent]) -> Outcome:
    """Resolve an append that was not written: idempotent retry, duplicate or conflict."""
    append = pending.append
    found: list[RecordedEvent] = []
    for event in pending.events:
        record = d.seen.get(event.event_id) or stored.get(event.event_id)
        if record is not None:
            found.append(record)
    if not found:
        return ConcurrencyError(append.stream, append.expected_version, d.version)
    if len(found) == len(pending.events) and all(r.stream == append.stream for r in found):
        return found
    elsewhere = sorted({r.stream for r in found if r.stream != append.stream})
    detail = f" (recorded in {elsewhere!r})" if elsewhere else ""
    return DuplicateEventError(
        f"append to {append.stream!r}: {len(found)} of its {len(pending.events)} event ids "
        f"are already recorded{detail}; nothing was written"
    )


def fences_of(batch: Sequence[Pending]) -> list[tuple[int, str, Fence]]:
    """(index, stream, fence) of each fenced append of ``batch``."""
    return [(index, p.append.stream, p.append.fence) for index, p in enumerate(batch)
            if p.append.fence is not None]


def lease_resources(fences: Sequence[tuple[int, str, Fence]]) -> list[str]:
    """The lease rows that decide ``fences``: their streams' and their owners'."""
    wanted = {stream for _, stream, _ in fences}
    wanted.update(MEMBER_PREFIX + fence.owner for _, _, fence in fences)
    return sorted(wanted)


def fence_failures(fences: Sequence[tuple[int, str, Fence]], now: int,
                   rows: Mapping[str, LeaseRow]) -> dict[int, FencedError]:
    """The ``fences`` that do not hold, by index: their stream's lease is not their fence's
    owner at their fence's epoch, or that owner's own lease expired."""
    failed: dict[int, FencedError] = {}
    for index, stream, fence in fences:
        row = rows.get(stream)
        member = rows.get(MEMBER_PREFIX + fence.owner)
        if (row is None or row.owner != fence.owner or row.epoch != fence.epoch
                or member is None or member.expires_at <= now):
            holder = None if row is None or row.owner is None else Fence(row.owner, row.epoch)
            failed[index] = FencedError(stream, fence, holder)
    return failed


def check_append(append: Append) -> tuple[NewEvent, ...]:
    """Reject malformed appends (programming errors) before anything is enqueued."""
    stream = append.stream
    if not stream or len(stream) > STREAM_MAX:
        raise ValueError(f"stream name must have 1 to {STREAM_MAX} characters: {stream!r}")
    events = append.events
    if type(events) is not tuple:
        events = tuple(events)
    if not events:
        raise ValueError(f"append to {stream!r} has no events")
    if append.expected_version is not None and append.expected_version < 0:
        raise ValueError(f"expected_version must be >= 0 or None: {append.expected_version}")
    for event in events:
        if not event.event_id or len(event.event_id) > EVENT_ID_MAX:
            raise ValueError(f"event id must have 1 to {EVENT_ID_MAX} characters: {event!r}")
        if not event.type or len(event.type) > TYPE_MAX:
            raise ValueError(f"event type must have 1 to {TYPE_MAX} characters: {event!r}")
    return events


def check_record(record: RecordedEvent) -> None:
    """Reject a recorded event the schema cannot hold (an import of a foreign file)."""
    if not record.stream or len(record.stream) > STREAM_MAX:
        raise RestoreError(f"stream name must have 1 to {STREAM_MAX} characters: {record!r}")
    if not record.event_id or len(record.event_id) > EVENT_ID_MAX:
        raise RestoreError(f"event id must have 1 to {EVENT_ID_MAX} characters: {record!r}")
    if not record.type or len(record.type) > TYPE_MAX:
        raise RestoreError(f"event type must have 1 to {TYPE_MAX} characters: {record!r}")


def repeated_id(append: Append) -> DuplicateEventError:
    """The error of an append that holds one event id twice."""
    return DuplicateEventError(f"append to {append.stream!r} repeats an event id")
